#!/usr/bin/env python3
"""Per-tensor type and SHA-256 of the stored bytes of a GGUF file, one line per tensor in file order:
    NAME TYPE_ID SHA256
Used by tests/quantize_reference.py and bench/quantize_families_vs_llamacpp.sh to compare two quantizers'
outputs tensor by tensor without keeping either file.

Usage: gguf_tensor_digest.py FILE.gguf
"""
import hashlib
import struct
import sys

# ggml type id -> (elements per block, bytes per block): the types a quantize of the tiny files can produce.
BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 10: (256, 84),
          11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 20: (32, 18), 23: (256, 136), 30: (1, 2)}
SCALARS = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: 'B', 10: 'Q', 11: 'q', 12: 'd'}


def digest(path):
    """[(name, type id, sha256 hex)] in the file's tensor order."""
    with open(path, 'rb') as f:
        b = f.read()
    o = 0

    def u(fmt):
        nonlocal o
        v = struct.unpack_from('<' + fmt, b, o)[0]
        o += struct.calcsize('<' + fmt)
        return v

    def s():
        nonlocal o
        n = u('Q')
        v = b[o:o + n]
        o += n
        return v

    def val(t):
        if t == 8:
            return s()
        if t == 9:
            et, n = u('I'), u('Q')
            return [val(et) for _ in range(n)]
        return u(SCALARS[t])

    if u('I') != 0x46554747:
        raise ValueError('%s: not a GGUF file' % path)
    u('I')
    nt, nkv = u('Q'), u('Q')
    kv = {}
    for _ in range(nkv):
        k = s().decode()
        kv[k] = val(u('I'))
    infos = []
    for _ in range(nt):
        name = s().decode()
        nd = u('I')
        ne = [u('q') for _ in range(nd)]
        infos.append((name, ne, u('I'), u('Q')))
    align = kv.get('general.alignment', 32)
    data = (o + align - 1) // align * align
    out = []
    for name, ne, t, off in infos:
        if t not in BLOCKS:
            raise ValueError('%s: tensor %s has type %d, unknown here' % (path, name, t))
        n = 1
        for d in ne:
            n *= d
        be, bb = BLOCKS[t]
        out.append((name, t, hashlib.sha256(b[data + off:data + off + n // be * bb]).hexdigest()))
    return out


if __name__ == '__main__':
    for name, t, h in digest(sys.argv[1]):
        print(name, t, h)
