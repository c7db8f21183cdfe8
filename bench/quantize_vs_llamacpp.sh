#!/usr/bin/env bash
# tern quantize vs llama.cpp's llama-quantize, for every type and every F32 file of ../shared:
#   (a) the tern-made file loads and runs in llama.cpp (llama-simple, 8 tokens);
#   (b) per-tensor RMS error against the F32 source is no worse than llama-quantize's (+1%) -
#       tensors are first compared byte for byte; only differing ones are dequantized (with
#       `tern quantize --type f32`) and measured;
#   (c) real models: llama-perplexity of the tern file within 1% of the llama.cpp file's
#       (--chunks $PPL_CHUNKS, -c 128, the texts of reference/README.md "Perplexity"); files with
#       identical tensor bytes have identical perplexity and are not re-measured.
# f8_e4m3 is tern-only: llama.cpp cannot read it, so it is checked with tern run / tern perplexity
# against the model's F16 file instead.
#
# Usage: LLAMA_CPP_BIN=/path/to/llama.cpp/build/bin bench/quantize_vs_llamacpp.sh [> table.md]
# Env: TERN (default build-quantize/bin/tern, else build/bin/tern), SHARED (default ../shared),
#      PPL_CHUNKS (default 40), TYPES (default: all), SOURCES (default: all F32 files).
set -u -o pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
: "${LLAMA_CPP_BIN:?set LLAMA_CPP_BIN to the bin directory of a llama.cpp build}"
SHARED=${SHARED:-$here/../shared}
TERN=${TERN:-$here/build-quantize/bin/tern}
[ -x "$TERN" ] || TERN=$here/build/bin/tern
PPL_CHUNKS=${PPL_CHUNKS:-40}
TYPES=${TYPES:-"q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k_s q3_k_m q4_k_s q4_k_m q5_k_s q5_k_m q6_k f16 bf16 f8_e4m3"}
SOURCES=${SOURCES:-"synth/synth-k256 synth/synth-k256-tied synth/synth-qwen2-k256 gguf/stories260K gguf/aidreams260K gguf/babyllama-tok105 gguf/llama2xs-tok512"}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
work=$(mktemp -d /tmp/tern-qbench.XXXXXX)
trap 'rm -rf "$work"' EXIT

# Per-tensor comparison: identical bytes, else RMS error of both dequantized files vs the source.
cat > "$work/cmp.py" <<'PY'
import math, struct, sys
SIZES = {0:(1,4),1:(1,2),2:(32,18),3:(32,20),6:(32,22),7:(32,24),8:(32,34),10:(256,84),11:(256,110),
         12:(256,144),13:(256,176),14:(256,210),20:(32,18),23:(256,136),30:(1,2),1000:(32,34)}
def read(path):
    b = open(path, 'rb').read(); o = 4
    def u(f):
        nonlocal o; v = struct.unpack_from('<' + f, b, o)[0]; o += struct.calcsize('<' + f); return v
    def s():
        nonlocal o; n = u('Q'); v = b[o:o + n]; o += n; return v
    sc = {0:'B',1:'b',2:'H',3:'h',4:'I',5:'i',6:'f',7:'B',10:'Q',11:'q',12:'d'}
    def val(t):
        if t == 8: return s()
        if t == 9:
            et = u('I'); n = u('Q'); return [val(et) for _ in range(n)]
        return u(sc[t])
    u('I'); nt = u('Q'); nkv = u('Q'); kv = {}
    for _ in range(nkv):
        k = s().decode(); kv[k] = val(u('I'))
    infos = []
    for _ in range(nt):
        name = s().decode(); nd = u('I'); ne = [u('q') for _ in range(nd)]; t = u('I'); off = u('Q')
        infos.append((name, ne, t, off))
    al = kv.get('general.alignment', 32); ds = (o + al - 1) // al * al; out = {}
    for name, ne, t, off in infos:
        n = math.prod(ne); be, bb = SIZES[t]
        out[name] = (t, b[ds + off: ds + off + n // be * bb])
    return out
def rms(src, deq):
    a = struct.unpack('<%df' % (len(src[1]) // 4), src[1]); d = struct.unpack('<%df' % (len(deq[1]) // 4), deq[1])
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(a, d)) / len(a))
mode = sys.argv[1]
if mode == 'bytes':   # tern llama -> "identical N" or the names that differ
    t, l = read(sys.argv[2]), read(sys.argv[3])
    diff = [n for n in t if n not in l or t[n] != l[n]] + [n for n in l if n not in t]
    print('identical %d' % len(t) if not diff else 'differ ' + ' '.join(diff))
else:                 # rms SRC TERN_F32 LLAMA_F32 names... -> worst ratio tern/llama
    src, t, l = read(sys.argv[2]), read(sys.argv[3]), read(sys.argv[4]); worst = 0.0; name = ''
    for n in sys.argv[5:]:
        if src[n][0] != 0 or t[n][0] != 0: continue
        et, el = rms(src[n], t[n]), rms(src[n], l[n])
        r = et / el if el > 0 else (1.0 if et == 0 else float('inf'))
        if r > worst: worst, name = r, n
    print('%.4f %s' % (worst, name))
PY

ppl_text() {
    case "$1" in *babyllama*) echo "$SHARED/reference/data/tinystories-train-head-197k.tok105safe.txt" ;;
    *) echo "$SHARED/data/tinystories/tinystories-train-head-197k.txt" ;; esac
}
# llama-perplexity's asynchronous log sometimes loses its last line ("Final estimate") at exit; the
# running value after the last chunk ("[N]x") is the same number, so take that.
# Sometimes both are lost, so try up to three times.
llama_ppl() {
    local v=""
    for _ in 1 2 3; do
        v=$("$LLAMA_CPP_BIN/llama-perplexity" -m "$1" -f "$(ppl_text "$1")" -c 128 -b 512 -t 2 --chunks "$PPL_CHUNKS" 2>&1 |
            grep -o -e "\[$PPL_CHUNKS\][0-9.]*" -e "Final estimate: PPL = [0-9.]*" | tail -1 | sed 's/.*[]=] *//')
        [ -n "$v" ] && break
    done
    echo "${v:-nan}"
}
tern_ppl() {
    "$TERN" perplexity -m "$1" -f "$(ppl_text "$1")" -c 128 -b 512 --chunks "$PPL_CHUNKS" --device cpu 2>/dev/null |
        sed -n 's/.*PPL = \([0-9.]*\).*/\1/p'
}
reldiff() { python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print('%+.3f%%' % (100*(a-b)/b))" "$1" "$2"; }

echo "# tern quantize vs llama-quantize"
echo
echo "llama.cpp: \`$LLAMA_CPP_BIN\` ($(cd "$LLAMA_CPP_BIN" && git rev-parse --short HEAD 2>/dev/null || echo unknown commit)); tern: $("$TERN" --version 2>/dev/null | head -1); $(date -u +%Y-%m-%d)."
echo "Perplexity: llama-perplexity -c 128 -b 512 --chunks $PPL_CHUNKS on both files (f8_e4m3: tern perplexity vs the F16 file)."
echo
echo "| source | type | llama-quantize | tern | tensors | worst RMS ratio tern/llama | loads in llama.cpp | PPL llama file | PPL tern file | ΔPPL |"
echo "|---|---|---|---|---|---|---|---|---|---|"
fail=0
for s in $SOURCES; do
    src=$SHARED/models/$s-f32.gguf
    name=$(basename "$s")
    real=1; case "$s" in synth/*) real=0 ;; esac
    for ty in $TYPES; do
        T=$work/$name-$ty.tern.gguf; L=$work/$name-$ty.llama.gguf
        if [ "$ty" = f8_e4m3 ]; then lrc=na; else
            "$LLAMA_CPP_BIN/llama-quantize" "$src" "$L" "${ty^^}" 2 > "$work/lq.log" 2>&1 && lrc=ok || lrc=refused
        fi
        "$TERN" quantize "$src" "$T" --type "$ty" --force > /dev/null 2> "$work/tq.log" && trc=ok || trc=refused
        if [ "$trc" != ok ]; then
            verdict=$([ "$lrc" = refused ] && echo "both refuse" || echo "FAIL")
            [ "$verdict" = FAIL ] && fail=1
            echo "| $name | $ty | $lrc | refused: $(tr -d '|' < "$work/tq.log" | head -c 120) | $verdict | | | | | |"
            continue
        fi
        bytes="" ratio="" load="" pl="" pt="" dp=""
        if [ "$ty" = f8_e4m3 ]; then
            bytes="(tern only)"
            "$TERN" run -m "$T" -p "Once upon a time" -n 8 --temp 0 --device cpu > /dev/null 2>&1 && load="tern run ok" || { load="tern run FAIL"; fail=1; }
            if [ $real = 1 ]; then
                pl=$(tern_ppl "$SHARED/models/$s-f16.gguf"); pt=$(tern_ppl "$T"); dp="$(reldiff "$pt" "$pl") vs F16"
            fi
        else
            [ "$lrc" = ok ] || { echo "| $name | $ty | refused | ok | FAIL (llama.cpp refused) | | | | | |"; fail=1; continue; }
            bytes=$(python3 "$work/cmp.py" bytes "$T" "$L")
            if [[ "$bytes" == identical* ]]; then ratio="1 (same bytes)"; else
                "$TERN" quantize "$T" "$work/t32.gguf" --type f32 --force > /dev/null 2>&1
                "$TERN" quantize "$L" "$work/l32.gguf" --type f32 --force > /dev/null 2>&1
                ratio=$(python3 "$work/cmp.py" rms "$src" "$work/t32.gguf" "$work/l32.gguf" ${bytes#differ })
                python3 -c "import sys; sys.exit(0 if float('$ratio'.split()[0]) <= 1.01 else 1)" || fail=1
                bytes="$(wc -w <<< "${bytes#differ }") differ"
            fi
            "$LLAMA_CPP_BIN/llama-simple" -m "$T" -n 8 "Once upon a time" > /dev/null 2>&1 && load=ok || { load=FAIL; fail=1; }
            if [ $real = 1 ] && [[ "$bytes" == identical* ]]; then
                dp="0 (same bytes)"
            elif [ $real = 1 ]; then
                pl=$(llama_ppl "$L"); pt=$(llama_ppl "$T"); dp=$(reldiff "$pt" "$pl")
                python3 -c "import sys; sys.exit(0 if abs(float('$pt')/float('$pl')-1) <= 0.01 else 1)" || fail=1
            fi
        fi
        echo "| $name | $ty | $lrc | $trc | $bytes | $ratio | $load | $pl | $pt | $dp |"
        rm -f "$T" "$L"
    done
done
echo
[ $fail = 0 ] && echo "All checks passed." || echo "SOME CHECKS FAILED (see FAIL above)."
exit $fail
