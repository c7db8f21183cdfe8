#!/usr/bin/env bash
# tern quantize against llama.cpp's llama-quantize on every family's tiny `tern synth` file, expert tensors
# included: both quantize the same synth source (F16 and F32), and every tensor's type and bytes are compared
# (tests/gguf_tensor_digest.py: type id and SHA-256 per tensor, in file order).
#
# Usage: bench/quantize_families_vs_llamacpp.sh [--shapes "tiny tiny-qwen3moe ..."] [--types "q4_k_m q8_0"]
#                                               [--sources "f16 f32"] [--save-reference DIR]
#   --save-reference DIR writes llama-quantize's digests to DIR/<shape>-<source>-<type>.txt (tests/data/quantize
#   is the one the CI test tests/quantize_reference.py checks tern against: refresh it after a change of the
#   synth shapes or of the peer).
#   TERN: the tern binary (default build/bin/tern); LLAMA_QUANTIZE: a llama-quantize binary (default: built by
#   llamacpp_cpu_bin from bench/llamacpp_cpu_peer.sh). Exit status 1 when a file differs.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
shapes="tiny tiny-qwen2 tiny-qwen3 tiny-gemma2 tiny-gemma3 tiny-qwen3moe"
types="q4_k_m q8_0"
sources="f16 f32"
save=""
while [ $# -gt 0 ]; do
    case "$1" in
    --shapes) shapes=$2; shift ;;
    --types) types=$2; shift ;;
    --sources) sources=$2; shift ;;
    --save-reference) save=$2; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "quantize_families_vs_llamacpp.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
TERN=${TERN:-$here/build/bin/tern}
[ -x "$TERN" ] || { echo "quantize_families_vs_llamacpp.sh: no tern binary at $TERN (build it, or set TERN)" >&2; exit 1; }
if [ -z "${LLAMA_QUANTIZE:-}" ]; then
    . "$here/bench/llamacpp_cpu_peer.sh"
    bin=$(llamacpp_cpu_bin llama-quantize) || { echo "quantize_families_vs_llamacpp.sh: llama-quantize build failed" >&2; exit 1; }
    LLAMA_QUANTIZE=$bin/llama-quantize
fi
digest="python3 $here/tests/gguf_tensor_digest.py"
work=$(mktemp -d /tmp/tern-qfam.XXXXXX)
trap 'rm -rf "$work"' EXIT
[ -n "$save" ] && mkdir -p "$save"

echo "| shape | source | type | tensors | same type | same bytes | differing tensors |"
echo "|---|---|---|---:|---:|---:|---|"
fail=0
for shape in $shapes; do
    for src in $sources; do
        S=$work/$shape-$src.gguf
        "$TERN" synth "$S" --shape "$shape" --type "$src" --seed 1 -t 2 > /dev/null 2>&1 ||
            { echo "| $shape | $src | | | | | tern synth failed |"; fail=1; continue; }
        for ty in $types; do
            T=$work/t.gguf; L=$work/l.gguf
            if ! "$LLAMA_QUANTIZE" "$S" "$L" "${ty^^}" 2 > "$work/lq.log" 2>&1; then
                echo "| $shape | $src | $ty | | | | llama-quantize failed: $(tail -1 "$work/lq.log" | tr -d '|' | head -c 100) |"
                fail=1; continue
            fi
            if ! "$TERN" quantize "$S" "$T" --type "$ty" --force -t 2 > /dev/null 2> "$work/tq.log"; then
                echo "| $shape | $src | $ty | | | | tern quantize failed: $(tail -1 "$work/tq.log" | tr -d '|' | head -c 100) |"
                fail=1; continue
            fi
            $digest "$L" > "$work/l.txt"; $digest "$T" > "$work/t.txt"
            if [ -n "$save" ]; then
                {
                    echo "# llama-quantize SOURCE OUT ${ty^^} of \`tern synth SOURCE --shape $shape --type $src --seed 1\`"
                    echo "# (llama.cpp $(grep -m1 -o 'commit [0-9a-f]*' "$work/lq.log" || echo 'commit ?')): per tensor, name ggml-type sha256"
                    echo "shape $shape source $src seed 1 type $ty"
                    echo "source_sha256 $(sha256sum "$S" | cut -d' ' -f1)"
                    cat "$work/l.txt"
                } > "$save/$shape-$src-$ty.txt"
            fi
            row=$(python3 - "$work/t.txt" "$work/l.txt" <<'PY'
import sys
t = [l.split() for l in open(sys.argv[1])]
l = [l.split() for l in open(sys.argv[2])]
lt = {r[0]: r for r in l}
same_type = sum(1 for r in t if r[0] in lt and lt[r[0]][1] == r[1])
same_bytes = sum(1 for r in t if r[0] in lt and lt[r[0]][1:] == r[1:])
names = [r[0] for r in t if r[0] not in lt or lt[r[0]][1:] != r[1:]] + [r[0] for r in l if r[0] not in dict((x[0], 1) for x in t)]
order = "" if [r[0] for r in t] == [r[0] for r in l] else " (tensor order differs)"
print("%d | %d | %d | %s%s" % (len(l), same_type, same_bytes, " ".join(names[:6]) + (" ..." if len(names) > 6 else ""), order))
print("ok" if not names and not order else "differ")
PY
)
            verdict=$(tail -1 <<< "$row")
            [ "$verdict" = ok ] || fail=1
            echo "| $shape | $src | $ty | $(head -1 <<< "$row") |"
        done
    done
done
echo
[ $fail = 0 ] && echo "Every tensor of every file: the same type and the same bytes as llama-quantize's." ||
    echo "SOME FILES DIFFER (see the table)."
exit $fail
