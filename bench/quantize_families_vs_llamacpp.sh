#!/usr/bin/env bash
# tern quantize against llama.cpp's llama-quantize on every family's tiny `tern synth` file, expert tensors
# included: both quantize the same synth source (F16 and F32), and every tensor's type and bytes are compared
# (tests/gguf_tensor_digest.py: type id and SHA-256 per tensor, in file order).
# Then the rules that depend on the layer count, the layer and the expert count, which two layers cannot show: the
# tiny-qwen3moe F16 file scaled to deeper and wider mixtures (tests/gguf_scaled_header.py: N layers of E experts,
# sparse zero data) is planned by both with --dry-run for every --deep-types type, and the type of every tensor
# compared.
#
# Usage: bench/quantize_families_vs_llamacpp.sh [--shapes "tiny tiny-qwen3moe ..."] [--types "q4_k_m q8_0"]
#                                               [--sources "f16 f32"] [--deep "48x128 24x8 16x4"]
#                                               [--deep-types "q4_k_m q8_0 ..."] [--save-reference DIR]
#   --save-reference DIR writes llama-quantize's digests to DIR/<shape>-<source>-<type>.txt (tests/data/quantize
#   is the one the CI test tests/quantize_reference.py checks tern against: refresh it after a change of the
#   synth shapes or of the peer), and the deep mixtures' type plans to DIR/deep-qwen3moe-LxE.types.
#   TERN: the tern binary (default build/bin/tern); LLAMA_QUANTIZE: a llama-quantize binary (default: built by
#   llamacpp_cpu_bin from bench/llamacpp_cpu_peer.sh). Exit status 1 when a file differs.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
shapes="tiny tiny-qwen2 tiny-qwen3 tiny-gemma2 tiny-gemma3 tiny-qwen3moe tiny-qwen3-yarn tiny-longrope tiny-mistral3 tiny-gpt-oss tiny-mixtral tiny-smollm3 tiny-phi3 tiny-phi3-longrope tiny-glm4moe tiny-gemma4"
types="q4_k_m q8_0"
sources="f16 f32"
deep="48x128 24x8 16x4"
deep_types="q4_k_m q8_0 q5_k_m q3_k_m q2_k q4_k_s q3_k_s q6_k"
save=""
while [ $# -gt 0 ]; do
    case "$1" in
    --shapes) shapes=$2; shift ;;
    --types) types=$2; shift ;;
    --sources) sources=$2; shift ;;
    --deep) deep=$2; shift ;;
    --deep-types) deep_types=$2; shift ;;
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

# The deep mixtures: per tensor, the type each tool's --dry-run plans.
plan_llama() {   # FILE TYPE -> "name type" lines
    "$LLAMA_QUANTIZE" --dry-run "$1" "$work/x.gguf" "${2^^}" 2>&1 | python3 -c '
import re, sys
for l in sys.stdin:
    m = re.search(r"\] (\S+)\s+- .*type =\s+(\w+),.*?(?:\((\w+)\))?\s*$", l)
    if m: print(m.group(1), (m.group(3) or m.group(2)).lower())'
}
plan_tern() {
    "$TERN" quantize "$1" "$work/x.gguf" --type "$2" --dry-run --json 2>/dev/null |
        python3 -c 'import json, sys; [print(t["name"], t["to"].lower()) for t in json.load(sys.stdin)["tensors"]]'
}
if [ -n "$deep" ]; then
    echo
    echo "| mixture (from tiny-qwen3moe f16) | type | tensors | same type | differing tensors |"
    echo "|---|---|---:|---:|---|"
    "$TERN" synth "$work/moe.gguf" --shape tiny-qwen3moe --type f16 --seed 1 -t 2 > /dev/null 2>&1
    for le in $deep; do
        D=$work/deep-$le.gguf
        python3 "$here/tests/gguf_scaled_header.py" "$work/moe.gguf" "$D" "${le%x*}" "${le#*x}"
        cols=()
        for ty in $deep_types; do
            plan_llama "$D" "$ty" > "$work/pl-$ty.txt"; plan_tern "$D" "$ty" > "$work/pt-$ty.txt"
            n=$(wc -l < "$work/pl-$ty.txt")
            differ=$(diff "$work/pl-$ty.txt" "$work/pt-$ty.txt" | grep '^<' | cut -c3- | awk '{print $1}' | head -4 | tr '\n' ' ' || true)
            same=$(python3 -c 'import sys; a=open(sys.argv[1]).read().split("\n"); b=open(sys.argv[2]).read().split("\n"); print(sum(1 for x, y in zip(a, b) if x == y and x))' "$work/pl-$ty.txt" "$work/pt-$ty.txt")
            { [ "$n" -gt 0 ] && cmp -s "$work/pl-$ty.txt" "$work/pt-$ty.txt"; } || fail=1
            echo "| ${le%x*} layers x ${le#*x} experts | $ty | $n | $same | $differ |"
            cols+=("$work/pl-$ty.txt")
        done
        if [ -n "$save" ]; then
            {
                echo "# llama-quantize --dry-run (llama.cpp $(grep -m1 -o 'commit [0-9a-f]*' "$work/lq.log" || echo 'commit ?')) of"
                echo "# \`tern synth --shape tiny-qwen3moe --type f16 --seed 1\` scaled by tests/gguf_scaled_header.py: per tensor, its type for each type"
                echo "source_sha256 $(sha256sum "$work/moe.gguf" | cut -d' ' -f1)"
                echo "scaled tiny-qwen3moe f16 seed 1 layers ${le%x*} experts ${le#*x}"
                echo "name $deep_types"
                paste -d' ' "${cols[@]}" | awk '{ printf "%s", $1; for (i = 2; i <= NF; i += 2) printf " %s", $i; print "" }'
            } > "$save/deep-qwen3moe-$le.types"
        fi
    done
fi
echo
[ $fail = 0 ] && echo "Every tensor of every file: the same type and the same bytes as llama-quantize's." ||
    echo "SOME FILES DIFFER (see the table)."
exit $fail
