#!/usr/bin/env python3
"""A deeper, wider twin of a small GGUF file for checking quantization type choices: the metadata and the
non-layer tensors of SRC, its layer 0 repeated for N_LAYER layers, the expert tensors (*_exps, ffn_gate_inp) given
N_EXPERT experts, and {arch}.block_count / expert_count / expert_used_count set to match. The tensor data is a
sparse run of zeros (the file takes no disk space): for `--dry-run` type plans, whose rules depend on the layer
count, the layer index and the expert count, not on the weights.

Usage: gguf_scaled_header.py SRC.gguf OUT.gguf N_LAYER N_EXPERT
"""
import struct
import sys

SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
BLOCKS = {0: (1, 4), 1: (1, 2), 30: (1, 2)}   # the float types a synth source has


def scaled_header(src, out, n_layer, n_expert):
    with open(src, 'rb') as f:
        b = f.read()
    o = 0

    def u(fmt):
        nonlocal o
        v = struct.unpack_from('<' + fmt, b, o)[0]
        o += struct.calcsize('<' + fmt)
        return v

    def skip(t):
        nonlocal o
        if t == 8:
            n = u('Q')
            o += n
        elif t == 9:
            et, n = u('I'), u('Q')
            for _ in range(n):
                skip(et)
        else:
            o += SCALAR_BYTES[t]

    if u('I') != 0x46554747:
        raise ValueError('%s: not a GGUF file' % src)
    version, nt, nkv = u('I'), u('Q'), u('Q')
    kvs = []
    for _ in range(nkv):
        n = u('Q')
        key = b[o:o + n].decode()
        o += n
        t = u('I')
        start = o
        skip(t)
        kvs.append([key, t, b[start:o]])
    infos = []
    for _ in range(nt):
        n = u('Q')
        name = b[o:o + n].decode()
        o += n
        ne = [u('q') for _ in range(u('I'))]
        t = u('I')
        u('Q')
        if t not in BLOCKS:
            raise ValueError('%s: tensor %s is not F32/F16/BF16' % (src, name))
        infos.append((name, ne, t))
    arch = next(v for k, t, v in kvs if k == 'general.architecture')[8:].decode()

    def set_u32(key, value):
        for kv in kvs:
            if kv[0] == key:
                kv[1], kv[2] = 4, struct.pack('<I', value)
                return
        kvs.append([key, 4, struct.pack('<I', value)])

    set_u32(arch + '.block_count', n_layer)
    set_u32(arch + '.expert_count', n_expert)
    set_u32(arch + '.expert_used_count', min(8, n_expert))
    tensors = [(n, ne, t) for n, ne, t in infos if not n.startswith('blk.')]
    for layer in range(n_layer):
        for name, ne, t in infos:
            if not name.startswith('blk.0.'):
                continue
            ne = list(ne)
            if '_exps.' in name:
                ne[2] = n_expert
            if 'ffn_gate_inp.' in name:
                ne[1] = n_expert
            tensors.append(('blk.%d.%s' % (layer, name[len('blk.0.'):]), ne, t))
    head = bytearray(struct.pack('<IIQQ', 0x46554747, version, len(tensors), len(kvs)))
    for key, t, raw in kvs:
        k = key.encode()
        head += struct.pack('<Q', len(k)) + k + struct.pack('<I', t) + raw
    offset = 0
    for name, ne, t in tensors:
        n = name.encode()
        head += struct.pack('<Q', len(n)) + n + struct.pack('<I', len(ne))
        head += b''.join(struct.pack('<q', x) for x in ne) + struct.pack('<IQ', t, offset)
        count = 1
        for x in ne:
            count *= x
        offset += (count * BLOCKS[t][1] + 31) // 32 * 32
    head += b'\0' * (-len(head) % 32)
    with open(out, 'wb') as f:
        f.write(head)
        f.truncate(len(head) + offset)


if __name__ == '__main__':
    scaled_header(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
