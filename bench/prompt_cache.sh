#!/usr/bin/env bash
# Prompt cache: time to first token of `tern run` on a long prompt (a document + a question) when
# another run already stored the document in the on-disk prompt cache, against a cold run of the
# same prompt with --no-prompt-cache. Each round uses a fresh cache directory and runs, in turn
# (the order alternates between rounds, so a noisy neighbour hits both kinds alike):
#   store: document + question 1 with the cache (cold; stores the document's blocks)
#   hit:   document + question 2 with the cache (restores them, prefills the rest)
#   cold:  document + question 2 with --no-prompt-cache
# prefill_ms is from --json (restore + prefill: the time to the first token). "same" says whether
# hit's greedy tokens equal cold's; "speed-up" is cold / hit, and its median over rounds is printed.
#
# Usage: bench/prompt_cache.sh [-m MODEL] [-t THREADS] [--rounds R] [--bytes B] [-n N]
#   defaults: -m ~/.cache/tern/models/gemma-3-270m-q4_k_m.gguf, -t 2, --rounds 3,
#   --bytes 8400 (about 2,000 Gemma tokens of ../shared/data/wikitext-2-raw/wiki.test.raw), -n 16
# tern: $TERN, else build-cache/bin/tern, else build/bin/tern. Prints a markdown table on stdout.
set -u -o pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

model="$HOME/.cache/tern/models/gemma-3-270m-q4_k_m.gguf"
threads=2
rounds=3
bytes=8400
n=16
while [ $# -gt 0 ]; do
    case "$1" in
        -m) model=$2; shift 2 ;;
        -t) threads=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --bytes) bytes=$2; shift 2 ;;
        -n) n=$2; shift 2 ;;
        *) echo "prompt_cache.sh: unknown argument $1 (see the header for usage)" >&2; exit 1 ;;
    esac
done
tern=${TERN:-}
[ -z "$tern" ] && [ -x "$here/build-cache/bin/tern" ] && tern="$here/build-cache/bin/tern"
[ -z "$tern" ] && tern="$here/build/bin/tern"
[ -x "$tern" ] || { echo "prompt_cache.sh: no tern binary at $tern (set TERN)" >&2; exit 1; }
[ -f "$model" ] || { echo "prompt_cache.sh: $model: no such model (-m)" >&2; exit 1; }
data="$here/../shared/data/wikitext-2-raw/wiki.test.raw"
[ -f "$data" ] || { echo "prompt_cache.sh: $data is missing" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
head -c "$bytes" "$data" > "$work/doc"
{ cat "$work/doc"; printf '\nQuestion: What is the first article about?\nAnswer:'; } > "$work/q1"
{ cat "$work/doc"; printf '\nQuestion: Which years does the text mention?\nAnswer:'; } > "$work/q2"

# run NAME PROMPT_FILE FLAGS...: prefill_ms and the tokens of one greedy run, as "ms n_prompt reused tokens".
run() {
    local name=$1 file=$2
    shift 2
    "$tern" run -m "$model" --device cpu -t "$threads" -c 4096 --temp 0 -n "$n" --json -f "$file" "$@" \
        2>"$work/$name.err" >"$work/$name.json" || { echo "prompt_cache.sh: $name failed:" >&2; cat "$work/$name.err" >&2; exit 1; }
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print("%.1f %d %d %s" % (j["timings"]["prefill_ms"], j["n_prompt"], j["prefix_cache"]["reused_tokens"], ",".join(map(str, j["tokens"]))))' "$work/$name.json"
}

echo "tern prompt cache: $(basename "$model"), -t $threads, $("$tern" --version | head -1)"
echo
echo "| round | prompt tokens | store prefill ms | hit prefill ms | reused | cold prefill ms | speed-up (cold/hit) | same |"
echo "|---|---|---|---|---|---|---|---|"
ratios=()
for r in $(seq 1 "$rounds"); do
    cache="$work/cache-$r"
    if [ $((r % 2)) -eq 1 ]; then
        cold=$(run cold "$work/q2" --no-prompt-cache)
        store=$(run store "$work/q1" --prompt-cache "$cache")
        hit=$(run hit "$work/q2" --prompt-cache "$cache")
    else
        store=$(run store "$work/q1" --prompt-cache "$cache")
        hit=$(run hit "$work/q2" --prompt-cache "$cache")
        cold=$(run cold "$work/q2" --no-prompt-cache)
    fi
    read -r s_ms _ _ _ <<<"$store"
    read -r h_ms h_np h_reused h_tok <<<"$hit"
    read -r c_ms _ _ c_tok <<<"$cold"
    same=no
    [ "$h_tok" = "$c_tok" ] && same=yes
    ratio=$(python3 -c "print('%.1f' % ($c_ms / $h_ms))")
    ratios+=("$ratio")
    echo "| $r | $h_np | $s_ms | $h_ms | $h_reused | $c_ms | ${ratio}x | $same |"
done
echo
echo "median speed-up: $(printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR]=$1} END {print (NR % 2 ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2)}')x"
