#!/usr/bin/env bash
# Serving on this CPU: `tern serve` against llama-server (the same llama.cpp as the other bench
# scripts, bench/llamacpp_cpu_peer.sh) on the same GGUF file, same threads and parallel slots, and
# `tern run --batch` against one `tern run` per prompt. Prints a markdown report on stdout.
#
#   1. Streams: 1 and then $PARALLEL concurrent greedy streamed completions of N tokens each, the two
#      servers interleaved round by round (tern, llama, tern, llama, ...) so noise hits both alike.
#      Aggregate tok/s = all generated tokens / the wall time of the round. Every tern stream's text is
#      compared with `tern run` alone on the same prompt (greedy, the same options).
#   2. Time to first token of a new request on an idle server and while PARALLEL-1 streams decode
#      (medians over --rounds probes, each probe a new prompt).
#   3. `tern run --batch` over BATCH prompts at --parallel PARALLEL against BATCH sequential `tern run`
#      calls (each loads the model, as a shell loop would): wall time and identical texts.
#   4. Bad requests against tern serve: the status and error of each (bench/serve_load.py badreq),
#      and what the server's port listens on.
#
# Usage: bench/serve_vs_llamaserver.sh [--quick] [--out FILE] [--model GGUF] [--rounds R]
#                                      [--parallel P] [-n TOKENS] [--batch N] [--threads T]
#   --quick      -n 32, 1 round, 24 batch prompts: checks the pipeline in a few minutes; NOT a comparison
#   --out FILE   also write the report to FILE
#   --model      default: Gemma 3 270M Q4_K_M (scripts/fetch_model.sh puts it in ~/.cache/tern/models)
#   defaults: --rounds 3 --parallel 8 -n 128 --batch 200 --threads 2 (the machine's cores)
# tern: $TERN, else build/bin/tern. llama-server: $LLAMA_SERVER, else built by llamacpp_cpu_bin.
# LLAMA_SERVER_ARGS: extra llama-server flags (default "--no-repack": its AMX weight repacking crashes at
# load on this Xeon, SIGSEGV, as llama-bench's does without --repack 0; set it to "" where it does not).
set -u -o pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

argv=("$@")
quick=0
out=""
model=$HOME/.cache/tern/models/gemma-3-270m-q4_k_m.gguf
rounds=3
parallel=8
n_gen=128
n_batch=200
threads=2
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 ;;
    --out) out=$2; shift ;;
    --model) model=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --parallel) parallel=$2; shift ;;
    -n) n_gen=$2; shift ;;
    --batch) n_batch=$2; shift ;;
    --threads) threads=$2; shift ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "serve_vs_llamaserver.sh: unknown argument '$1' (see --help)" >&2; exit 1 ;;
    esac
    shift
done
if [ "$quick" = 1 ]; then n_gen=32; rounds=1; n_batch=24; fi
[ -s "$model" ] || { echo "serve_vs_llamaserver.sh: no model '$model' (scripts/fetch_model.sh, or --model)" >&2; exit 1; }

TERN=${TERN:-$here/build/bin/tern}
[ -x "$TERN" ] || { echo "serve_vs_llamaserver.sh: no tern binary at $TERN (build it, or set TERN)" >&2; exit 1; }
. "$here/bench/llamacpp_cpu_peer.sh"
LLAMA_SERVER=${LLAMA_SERVER:-}
if [ -z "$LLAMA_SERVER" ]; then
    bin=$(llamacpp_cpu_bin llama-server) || { echo "serve_vs_llamaserver.sh: llama-server build failed" >&2; exit 1; }
    LLAMA_SERVER=$bin/llama-server
fi
load=$here/bench/serve_load.py

work=$(mktemp -d "${TMPDIR:-/tmp}/tern-servebench.XXXXXX")
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
load_start=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_health() {   # port log pid
    local i
    for i in $(seq 1 600); do
        kill -0 "$3" 2>/dev/null || { echo "serve_vs_llamaserver.sh: the server on port $1 exited:" >&2; tail -5 "$2" >&2; return 1; }
        curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    echo "serve_vs_llamaserver.sh: the server on port $1 did not come up in 120 s" >&2; return 1
}

# Per-slot context: the prompt, the generated tokens and the TTFT test's busy streams fit.
ctx=1024
tern_port=$(free_port)
tern_cmd=("$TERN" serve -m "$model" --device cpu -t "$threads" --parallel "$parallel" -c "$ctx" --port "$tern_port"
          --no-repeat-guard --no-prompt-cache)
"${tern_cmd[@]}" > "$work/tern.log" 2>&1 &
pids+=($!); wait_health "$tern_port" "$work/tern.log" "${pids[-1]}" || exit 1
llama_port=$(free_port)
llama_cmd=("$LLAMA_SERVER" -m "$model" -t "$threads" -tb "$threads" -np "$parallel" -c $((ctx * parallel))
           --host 127.0.0.1 --port "$llama_port" ${LLAMA_SERVER_ARGS-"--no-repack"})
"${llama_cmd[@]}" > "$work/llama.log" 2>&1 &
pids+=($!); wait_health "$llama_port" "$work/llama.log" "${pids[-1]}" || exit 1
llama_commit=$(curl -s "http://127.0.0.1:$llama_port/props" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("build_info","?"))' 2>/dev/null)

# Prompts: the openings of different stories, one a line.
prompts=$work/prompts.txt
python3 - "$here/../shared/data/tinystories/cs336-tinystories_sample.txt" "$n_batch" "$parallel" > "$prompts" <<'PY'
import sys
path, n, p = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seen, out = set(), []
try:
    lines = open(path, encoding="utf-8").read().split("\n")
except OSError:
    lines = []
for line in lines:
    words = line.split()
    if len(words) < 12:
        continue
    text = " ".join(words[:10 + len(out) % 7])
    if text not in seen:
        seen.add(text)
        out.append(text)
    if len(out) >= max(n, p):
        break
i = 0
while len(out) < max(n, p):   # without the shared data: numbered prompts
    out.append(f"Write a short story about a robot number {i} who learns to paint.")
    i += 1
print("\n".join(out))
PY
head -n "$parallel" "$prompts" > "$work/stream_prompts.txt"

echo "serve_vs_llamaserver.sh: warming up both servers" >&2
for port in "$tern_port" "$llama_port"; do
    python3 "$load" streams --port "$port" --clients 1 --max-tokens 8 --prompts "$work/stream_prompts.txt" > /dev/null || exit 1
done

# 1. Streams, interleaved.
for r in $(seq 1 "$rounds"); do
    for clients in 1 "$parallel"; do
        for tool in tern llama; do
            port=$tern_port; [ "$tool" = llama ] && port=$llama_port
            echo "serve_vs_llamaserver.sh: round $r, $tool, $clients stream(s)" >&2
            python3 "$load" streams --port "$port" --clients "$clients" --max-tokens "$n_gen" \
                --prompts "$work/stream_prompts.txt" > "$work/streams-$tool-$clients-$r.json" || exit 1
        done
    done
done
# tern run alone on each stream's prompt, the same options as the server's.
: > "$work/alone.jsonl"
while IFS= read -r p; do
    "$TERN" run -m "$model" --device cpu -t "$threads" -p "$p" -n "$n_gen" --temp 0 --no-repeat-guard --no-prompt-cache \
        --json 2>/dev/null >> "$work/alone.jsonl" || { echo "serve_vs_llamaserver.sh: tern run failed on '$p'" >&2; exit 1; }
done < "$work/stream_prompts.txt"

# 2. Time to first token.
for tool in tern llama; do
    port=$tern_port; [ "$tool" = llama ] && port=$llama_port
    echo "serve_vs_llamaserver.sh: time to first token, $tool" >&2
    python3 "$load" ttft --port "$port" --busy $((parallel - 1)) --busy-tokens $((ctx / 2)) --rounds "$rounds" \
        > "$work/ttft-$tool.json" || exit 1
done

# 4. Bad requests (tern), and the listening sockets of tern's port.
python3 "$load" badreq --port "$tern_port" --model "$(basename "$model" .gguf)" > "$work/badreq.json" || exit 1
listening=$(ss -Hltn "sport = :$tern_port" 2>/dev/null | awk '{print $4}' | sort -u | paste -sd' ')
kill -0 "${pids[0]}" 2>/dev/null && tern_alive=yes || tern_alive=NO
for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
wait 2>/dev/null
pids=()

# 3. run --batch against sequential runs (servers down: nothing else on the cores).
head -n "$n_batch" "$prompts" | python3 -c '
import json, sys
for i, line in enumerate(sys.stdin):
    print(json.dumps({"id": i, "prompt": line.rstrip("\n"), "max_tokens": 32, "temperature": 0}))' > "$work/batch.jsonl"
echo "serve_vs_llamaserver.sh: tern run --batch over $n_batch prompts" >&2
t0=$(date +%s.%N)
"$TERN" run -m "$model" --device cpu -t "$threads" --batch "$work/batch.jsonl" --parallel "$parallel" --no-prompt-cache \
    > "$work/batch_out.jsonl" 2> "$work/batch.log" || { echo "serve_vs_llamaserver.sh: tern run --batch failed" >&2; tail -3 "$work/batch.log" >&2; exit 1; }
t1=$(date +%s.%N)
echo "serve_vs_llamaserver.sh: $n_batch sequential tern run calls" >&2
: > "$work/seq_out.jsonl"
head -n "$n_batch" "$prompts" | while IFS= read -r p; do
    "$TERN" run -m "$model" --device cpu -t "$threads" -p "$p" -n 32 --temp 0 --no-prompt-cache --json 2>/dev/null \
        >> "$work/seq_out.jsonl" || echo '{"text": null}' >> "$work/seq_out.jsonl"
done
t2=$(date +%s.%N)

report=$(python3 - "$work" "$rounds" "$parallel" "$n_gen" "$n_batch" "$t0" "$t1" "$t2" <<'PY'
import json, statistics, sys
work, rounds, parallel, n_gen, n_batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
t0, t1, t2 = map(float, sys.argv[6:9])
def load(name):
    with open(f"{work}/{name}") as f:
        return json.load(f)
med = statistics.median
def per_round(key):
    return {(tool, c): [load(f"streams-{tool}-{c}-{r}.json")[key] for r in range(1, rounds + 1)]
            for tool in ("tern", "llama") for c in (1, parallel)}
agg, dec = per_round("aggregate_tok_s"), per_round("decode_tok_s")
alone = [json.loads(l)["text"] for l in open(f"{work}/alone.jsonl")]
same_alone = same_llama = total = 0
short = 0
for r in range(1, rounds + 1):
    t = load(f"streams-tern-{parallel}-{r}.json")["streams"]
    l = load(f"streams-llama-{parallel}-{r}.json")["streams"]
    for i, s in enumerate(t):
        total += 1
        same_alone += s["text"] == alone[i]
        same_llama += s["text"] == l[i]["text"]
        short += s["n"] != n_gen or l[i]["n"] != n_gen
print("## 1. Concurrent greedy streams (tok/s, medians of %d rounds)\n" % rounds)
print("Decode: the tokens after each stream's first over the time from the earliest first token to the last end;")
print("wall: every generated token over the whole round, prefill of the prompts included.\n")
print("| server | decode, 1 stream | decode, %d streams | %d / 1 | wall, 1 stream | wall, %d streams |" % (parallel, parallel, parallel))
print("|---|---:|---:|---:|---:|---:|")
for tool, name in (("tern", "tern serve"), ("llama", "llama-server")):
    one, many = med(dec[(tool, 1)]), med(dec[(tool, parallel)])
    print(f"| {name} | {one:.1f} | {many:.1f} | {many / one:.2f}x | {med(agg[(tool, 1)]):.1f} | {med(agg[(tool, parallel)]):.1f} |")
ratio = med(dec[("tern", parallel)]) / med(dec[("llama", parallel)])
print(f"\ntern / llama-server, decode at {parallel} streams: **{ratio:.2f}x** (rounds: tern "
      + ", ".join(f"{x:.1f}" for x in dec[("tern", parallel)]) + "; llama-server "
      + ", ".join(f"{x:.1f}" for x in dec[("llama", parallel)]) + f"); wall: "
      + f"{med(agg[('tern', parallel)]) / med(agg[('llama', parallel)]):.2f}x.")
print(f"Every tern stream's text equal to `tern run` alone: **{same_alone}/{total}**; streams that stopped before "
      f"{n_gen} tokens: {short}. Equal to llama-server's stream on the same prompt: {same_llama}/{total} (near-ties: "
      f"llama-server's own greedy text changes with the number of streams beside it).\n")
print("## 2. Time to first token of a new request (ms, median of %d probes)\n" % rounds)
print("| server | idle | while %d streams decode | ratio |" % (parallel - 1))
print("|---|---:|---:|---:|")
for tool, name in (("tern", "tern serve"), ("llama", "llama-server")):
    d = load(f"ttft-{tool}.json")
    print(f"| {name} | {d['idle_median_ms']:.0f} | {d['busy_median_ms']:.0f} | {d['ratio']:.2f}x |")
batch = [json.loads(l) for l in open(f"{work}/batch_out.jsonl")]
seq = [json.loads(l) for l in open(f"{work}/seq_out.jsonl")]
same = sum(1 for b, s in zip(batch, seq) if b.get("text") == s.get("text"))
tb, ts = t1 - t0, t2 - t1
print(f"\n## 3. `tern run --batch` over {n_batch} prompts (32 tokens each, greedy)\n")
print("| how | wall s | speed-up |")
print("|---|---:|---:|")
print(f"| {n_batch} sequential `tern run` | {ts:.1f} | 1.00x |")
print(f"| `tern run --batch --parallel {parallel}` | {tb:.1f} | **{ts / tb:.2f}x** |")
print(f"\nIdentical texts: **{same}/{len(seq)}** (batch lines: {len(batch)}).\n")
print("## 4. Bad requests to tern serve\n")
print("| request | status | error message (start) |")
print("|---|---|---|")
bad = load("badreq.json")
for c in bad["cases"]:
    status = c["status"] if not isinstance(c["status"], dict) else ", ".join(f"{k}: {v}" for k, v in sorted(c["status"].items()))
    msg = c["message"].replace("|", "\\|")
    print(f"| {c['case']} | {status} | {msg} |")
print(f"\n/health after them: {bad['health_after']}.")
PY
) || { echo "serve_vs_llamaserver.sh: the report failed" >&2; exit 1; }

{
    echo "# tern serve vs llama-server, and tern run --batch ($(date -u +%Y-%m-%d), tern $(git -C "$here" rev-parse --short HEAD))"
    echo
    echo "Machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs; load average at start: $load_start."
    echo "Model: \`$(basename "$model")\`; $threads threads; $parallel parallel slots, $ctx positions each; $n_gen tokens per stream."
    echo "llama-server: $llama_commit (bench/llamacpp_cpu_peer.sh). tern serve still running after the bad requests: $tern_alive;"
    echo "its port listened on: $listening."
    echo
    echo "$report"
    echo
    echo "Made by \`bash bench/serve_vs_llamaserver.sh$(printf ' %s' "${argv[@]}")\`, which ran the servers as"
    echo
    echo "    ${tern_cmd[*]}"
    echo "    ${llama_cmd[*]}"
    echo
    echo "and drove them with bench/serve_load.py (streams, ttft, badreq); the batch part ran"
    echo "\`tern run --batch FILE --parallel $parallel --no-prompt-cache\` against one \`tern run -p PROMPT -n 32 --temp 0 --no-prompt-cache\` per line."
} | tee ${out:+"$out"}
