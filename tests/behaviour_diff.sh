#!/usr/bin/env bash
# Behaviour of two tern binaries, compared byte for byte: the guard for refactors that must not change
# what tern computes. For every GGUF file under ../shared/models (and the default model when it has
# been fetched) it runs `tern run` greedily on three prompts, in two forms each (the streamed text
# with the exit code and stderr, and --json with the token ids), plus a draft-model run, a perplexity
# run and `tern quantize --calibrate` on three files; everything but timings, seeds and the drafters'
# proposal counts (adaptive to measured step times) must match.
#
# Usage: tests/behaviour_diff.sh OLD_TERN NEW_TERN [--quick]
#   --quick   the models/gguf files only and one quantize: a few seconds instead of about two minutes
# Prints one line per case (same / DIFF) and a summary; exits 1 when anything differs.
set -u -o pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
shared=${TERN_SHARED:-$here/../shared}

if [ $# -lt 2 ]; then
    echo "usage: tests/behaviour_diff.sh OLD_TERN NEW_TERN [--quick]" >&2
    exit 2
fi
old=$1
new=$2
quick=0
[ "${3:-}" = "--quick" ] && quick=1
for bin in "$old" "$new"; do
    if [ ! -x "$bin" ]; then
        echo "behaviour_diff: $bin: not an executable tern binary" >&2
        exit 2
    fi
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export XDG_CACHE_HOME=$work/cache   # no prompt cache of the user's is read or written

# What a run printed, with the parts that are allowed to differ blanked: timings, seeds, speeds.
normalise() {
    python3 -c '
import json, re, sys
text = sys.stdin.read()
try:
    doc = json.loads(text)
except ValueError:
    doc = None
if isinstance(doc, dict):
    def strip(node):
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items()
                    if k not in ("timings", "seed", "lookup", "draft") and not re.search(r"(_ms|seconds|_tps|per_second)$", k)}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node
    print(json.dumps(strip(doc), sort_keys=True))
else:
    text = re.sub(r"[0-9]+(\.[0-9]+)? (ms|s|tok/s|tokens/s|GB/s)\b", "<time>", text)
    text = re.sub(r"seed [0-9]+", "seed <n>", text)
    # How many tokens a drafter proposes depends on measured step times; the output may not.
    text = re.sub(r", (lookup|draft-model|draft) drafted .*", ", <drafting>", text)
    sys.stdout.write(text)
'
}

# capture BIN OUTFILE ARGS...: stdout, stderr and the exit code of one run, normalised.
capture() {
    local bin=$1 out=$2
    shift 2
    "$bin" "$@" >"$out.stdout" 2>"$out.stderr" </dev/null
    local rc=$?
    {
        echo "rc=$rc"
        echo "--- stdout"
        normalise <"$out.stdout"
        echo "--- stderr"
        normalise <"$out.stderr"
    } >"$out"
}

cases=0
diffs=0
# compare NAME ARGS...: run both binaries, report.
compare() {
    local name=$1
    shift
    cases=$((cases + 1))
    capture "$old" "$work/old" "$@"
    capture "$new" "$work/new" "$@"
    if cmp -s "$work/old" "$work/new"; then
        printf 'same  %s\n' "$name"
    else
        diffs=$((diffs + 1))
        printf 'DIFF  %s\n' "$name"
        diff "$work/old" "$work/new" | head -8 | sed 's/^/      /'
    fi
}

long_prompt="The cat sat on the mat. The dog sat on the log. The cat sat on the mat. The dog sat on the"
prompts=("Once upon a time" "What is the capital of France?" "$long_prompt")
common=(--temp 0 -t 2 --no-prompt-cache)

models=("$shared"/models/gguf/*.gguf)
if [ "$quick" = 0 ]; then
    models+=("$shared"/models/synth/*.gguf "$shared"/models/vocab/*.gguf)
    default_model=${TERN_MODEL:-$HOME/.cache/tern/models/gemma-3-270m-q4_k_m.gguf}
    [ -f "$default_model" ] && models+=("$default_model")
fi

for model in "${models[@]}"; do
    base=$(basename "$model" .gguf)
    compare "$base p1 text" run -m "$model" -p "${prompts[0]}" -n 32 "${common[@]}"
    compare "$base p1 json" run -m "$model" -p "${prompts[0]}" -n 32 "${common[@]}" --json
    case "$model" in
    */vocab/*) continue ;;   # vocabulary-only files: one error message is enough
    esac
    compare "$base p2 chat json" run -m "$model" -p "${prompts[1]}" -n 24 --chat "${common[@]}" --json
    compare "$base p3 lookup q8_0-kv json" run -m "$model" -p "${prompts[2]}" -n 48 --lookup 4 \
        --kv-type q8_0 "${common[@]}" --json
done

gguf=$shared/models/gguf
text=$work/calibration.txt
head -c 6000 "$shared"/data/tinystories/*.txt 2>/dev/null | head -c 6000 >"$text" || true
[ -s "$text" ] || printf 'Once upon a time there was a little girl named Lily. She liked to play.\n%.0s' $(seq 80) >"$text"

compare "draft model" run -m "$gguf/stories260K-f32.gguf" --draft-model "$gguf/stories260K-q4_k_m.gguf" \
    -p "${prompts[0]}" -n 40 "${common[@]}" --json
compare "perplexity" perplexity -m "$gguf/stories260K-q6_k.gguf" -f "$text" -c 128 --chunks 4 -t 2 --json

# quantize --calibrate: the written files must be byte-identical too.
quantize_case() {
    local in=$1 type=$2
    local name
    name="quantize --calibrate $(basename "$in" .gguf) -> $type"
    cases=$((cases + 1))
    # The same output path for both, so that the logs which name it can be compared too.
    "$old" quantize "$in" "$work/out.gguf" --type "$type" --calibrate "$text" -t 2 >"$work/old.log" 2>&1
    local rc_old=$?
    mv -f "$work/out.gguf" "$work/old.gguf" 2>/dev/null
    "$new" quantize "$in" "$work/out.gguf" --type "$type" --calibrate "$text" -t 2 >"$work/new.log" 2>&1
    local rc_new=$?
    if [ "$rc_old" = "$rc_new" ] && cmp -s "$work/old.gguf" "$work/out.gguf" &&
        cmp -s <(normalise <"$work/old.log") <(normalise <"$work/new.log"); then
        printf 'same  %s (%s bytes, sha256 %s)\n' "$name" "$(stat -c %s "$work/out.gguf")" \
            "$(sha256sum "$work/out.gguf" | cut -c1-16)"
    else
        diffs=$((diffs + 1))
        printf 'DIFF  %s (rc %s / %s)\n' "$name" "$rc_old" "$rc_new"
        diff <(normalise <"$work/old.log") <(normalise <"$work/new.log") | head -6 | sed 's/^/      /'
    fi
    rm -f "$work/old.gguf" "$work/out.gguf"
}
quantize_case "$gguf/stories260K-f32.gguf" q2_k
[ "$quick" = 0 ] && quantize_case "$gguf/babyllama-tok105-f32.gguf" q4_0
[ "$quick" = 0 ] && quantize_case "$gguf/llama2xs-tok512-f16.gguf" f8_e4m3

echo
echo "$cases cases, $diffs differ ($("$old" --version | head -1) vs $("$new" --version | head -1))"
[ "$diffs" = 0 ]
