#!/usr/bin/env bash
# Speculative decoding speed: `tern run` decode tok/s without drafting, with --lookup and (with
# --draft) with --draft-model, on two tasks: "copy" (repeat a ~300-token passage, where the output
# copies the prompt), "open" (an open-ended continuation; greedy, so a small model soon loops) and
# "sample" (the open prompt sampled at --temp 0.8 --seed 3: drafts rarely hold). Runs are
# INTERLEAVED (plain, lookup, draft, plain, ...) so a noisy neighbour hits every mode about equally;
# the ratio column is the median over rounds of (mode tok/s / plain tok/s in the same round). Every
# drafted run's tokens are compared with the plain run's (same seed when sampled): "same" must say yes.
#
# Usage: bench/speculative.sh [-m MODEL] [--draft DRAFT.gguf] [-t THREADS] [-n N] [--rounds R]
#                             [--lookup K] [--tasks "copy open sample"] [-c CTX]
#   defaults: -m ~/.cache/tern/models/gemma-3-270m-q4_k_m.gguf, -t 1, -n 128, --rounds 3, --lookup 8
#   task "story": a short repetitive TinyStories-style prompt, for the tiny models of ../shared
#   (their context is 128-256 tokens: use e.g. --tasks story -n 64).
# tern: $TERN, else build-spec/bin/tern, else build/bin/tern. Prints a markdown table on stdout.
set -u -o pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

model="$HOME/.cache/tern/models/gemma-3-270m-q4_k_m.gguf"
draft=""
threads=1
n=128
rounds=3
lookup=8
tasks="copy open sample"
ctx=()
while [ $# -gt 0 ]; do
    case "$1" in
        -m) model=$2; shift 2 ;;
        --draft) draft=$2; shift 2 ;;
        -t) threads=$2; shift 2 ;;
        -n) n=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --lookup) lookup=$2; shift 2 ;;
        --tasks) tasks=$2; shift 2 ;;
        -c) ctx=(-c "$2"); shift 2 ;;
        *) echo "speculative.sh: unknown argument $1 (see the header for usage)" >&2; exit 1 ;;
    esac
done
tern=${TERN:-}
[ -z "$tern" ] && for c in "$here/build-spec/bin/tern" "$here/build/bin/tern"; do [ -x "$c" ] && tern=$c && break; done
[ -x "$tern" ] || { echo "speculative.sh: no tern binary (set TERN)" >&2; exit 1; }
[ -f "$model" ] || { echo "speculative.sh: $model: no such model" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cat > "$work/copy.txt" <<'EOF'
Passage:
The old lighthouse stood at the edge of the cliff for more than a hundred years. Every night its keeper climbed the one hundred and twelve steps of the spiral staircase, trimmed the wick, polished the great lens and lit the lamp that warned ships away from the rocks below. In winter the wind howled around the tower and salt spray froze on the windows, but the light never failed. The keeper kept a logbook in which he wrote down the weather, the ships that passed and the small events of his days: a seal sleeping on the rocks, a storm that broke three panes of glass, a letter from his daughter in the city. When the lighthouse was finally automated, the logbooks were sent to the town museum, where visitors can still read them today. Many of them say that the most moving entries are the simplest ones, written on quiet nights when nothing happened at all and the keeper simply noted that the sea was calm and the light was burning. His daughter, who later became a teacher, brought her pupils to the museum every spring. She would open one of the books at random, read a page aloud and ask the children to imagine the sound of the waves, the smell of the oil and the long hours of waiting for the dawn.

The same passage, copied word for word:
The old lighthouse
EOF
cat > "$work/open.txt" <<'EOF'
Write a short essay about why people enjoy walking in the mountains, with examples from different seasons.

Essay:
EOF

cat > "$work/story.txt" <<'EOF'
Once upon a time, there was a little girl named Lily. She had a red ball. Lily liked to play with her red ball in the park. One day, Lily went to the park with her red ball. She saw a big dog in the park. The dog wanted to play with the red ball.
EOF

modes="plain lookup"
[ -n "$draft" ] && modes="$modes draft"

for r in $(seq 1 "$rounds"); do
    for task in $tasks; do
        for mode in $modes; do
            extra=()
            prompt=$task
            temp=(--temp 0)
            [ "$task" = sample ] && prompt=open && temp=(--temp 0.8 --seed 3)
            case $mode in
                lookup) extra=(--lookup "$lookup") ;;
                draft) extra=(--draft-model "$draft") ;;
            esac
            "$tern" run -m "$model" -f "$work/$prompt.txt" -n "$n" "${temp[@]}" -t "$threads" --device cpu --json \
                "${ctx[@]}" "${extra[@]}" > "$work/$task.$mode.$r.json" 2> "$work/$task.$mode.$r.err" ||
                { echo "speculative.sh: tern run failed: $(tail -n1 "$work/$task.$mode.$r.err")" >&2; exit 1; }
        done
    done
done

python3 - "$work" "$rounds" "$tasks" "$modes" "$model" "$draft" "$threads" "$n" "$lookup" <<'EOF'
import json, statistics, sys, os
work, rounds, tasks, modes, model, draft, threads, n, lookup = sys.argv[1:]
rounds = int(rounds)
print(f"model {os.path.basename(model)}" + (f", draft {os.path.basename(draft)}" if draft else "") +
      f", -t {threads}, -n {n}, --lookup {lookup}, {rounds} interleaved rounds")
print()
print("| task | mode | decode tok/s (median) | ratio vs plain (median) | drafted | accepted | acceptance | same tokens |")
print("|---|---|---|---|---|---|---|---|")
for task in tasks.split():
    for mode in modes.split():
        tps, ratios, same, drafted, accepted = [], [], True, 0, 0
        for r in range(1, rounds + 1):
            j = json.load(open(f"{work}/{task}.{mode}.{r}.json"))
            p = json.load(open(f"{work}/{task}.plain.{r}.json"))
            tps.append(j["timings"]["decode_tps"])
            ratios.append(j["timings"]["decode_tps"] / p["timings"]["decode_tps"])
            same = same and j["tokens"] == p["tokens"] and j["text"] == p["text"]
            drafted += j["lookup"]["drafted"]
            accepted += j["lookup"]["accepted"]
        acc = f"{100.0 * accepted / drafted:.0f}%" if drafted else "-"
        print(f"| {task} | {mode} | {statistics.median(tps):.1f} | {statistics.median(ratios):.2f}x | "
              f"{drafted // rounds} | {accepted // rounds} | {acc} | {'yes' if same else 'NO'} |")
EOF
