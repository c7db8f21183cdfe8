#!/usr/bin/env bash
# Speed on a shared CPU: decode and prefill tok/s of `tern bench` (and of llama.cpp's llama-bench on the same
# GGUF) on a quiet machine, with one CPU-bound competitor pinned to one core, and with one competitor pinned
# to every core. Prints a markdown table: tok/s per condition, its share of the quiet speed, and tern's ratio
# to llama.cpp under the same load.
#
# Every round runs every condition, and within a condition every tool, one after the other (the tools' order
# turns each round), so that the machine's own background load hits all of them about equally; the table
# shows medians over the rounds. A competitor is `sh -c 'while :; do :; done'` under taskset; all of them are
# killed on every way out of this script.
#
# Usage: bench/shared_cpu.sh [--files "A.gguf B.gguf"] [--threads "2"] [-p 64] [-n 32] [-r 2] [--rounds 3]
#                            [--conditions "quiet one all"] [--out FILE]
#   --files       GGUF files (default: the Gemma 3 270M of scripts/fetch_model.sh)
#   --threads     thread counts, -t of both tools (default "2")
#   -p/-n/-r      prompt tokens, generated tokens, repetitions per invocation (defaults 64/32/2)
#   --rounds N    rounds (default 3); medians over them
#   --conditions  any of quiet, one (a competitor on CPU 0), all (one on every CPU); default all three
#   --out FILE    also write the table to FILE with the device, commits, load averages and commands
# Binaries: tern: $TERN, else build/bin/tern. $TERN_BASE: a second tern (e.g. a build of the previous commit)
# measured beside it, as "tern-base". llama.cpp: $LLAMA_CPP_BIN/llama-bench, else
# ~/.cache/tern/llama.cpp/build/bin/llama-bench; without one, tern is measured alone. $LLAMA_BENCH_ARGS: extra
# llama-bench arguments (e.g. "--repack 0" where its AMX kernels crash, as on the Xeon of 2026-11-26).
set -u -o pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

files=""
threads="2"
n_prompt=64
n_gen=32
reps=2
rounds=3
conditions="quiet one all"
out=""
while [ $# -gt 0 ]; do
    case "$1" in
    --files) files=$2; shift ;;
    --threads) threads=$2; shift ;;
    -p) n_prompt=$2; shift ;;
    -n) n_gen=$2; shift ;;
    -r) reps=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --conditions) conditions=$2; shift ;;
    --out) out=$2; shift ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "shared_cpu.sh: unknown argument '$1' (see --help)" >&2; exit 1 ;;
    esac
    shift
done
for c in $conditions; do
    case "$c" in quiet|one|all) ;; *) echo "shared_cpu.sh: --conditions: '$c' is not quiet, one or all" >&2; exit 1 ;; esac
done
command -v taskset > /dev/null || { echo "shared_cpu.sh: taskset not found (util-linux)" >&2; exit 1; }

TERN=${TERN:-$here/build/bin/tern}
[ -x "$TERN" ] || { echo "shared_cpu.sh: no tern binary at $TERN (build it, or set TERN)" >&2; exit 1; }
TERN_BASE=${TERN_BASE:-}
if [ -n "$TERN_BASE" ] && [ ! -x "$TERN_BASE" ]; then echo "shared_cpu.sh: TERN_BASE=$TERN_BASE is not executable" >&2; exit 1; fi
LLAMA_CPP_BIN=${LLAMA_CPP_BIN:-$HOME/.cache/tern/llama.cpp/build/bin}
LLAMA_BENCH=$LLAMA_CPP_BIN/llama-bench
[ -x "$LLAMA_BENCH" ] || { echo "shared_cpu.sh: no $LLAMA_BENCH (set LLAMA_CPP_BIN): measuring tern alone" >&2; LLAMA_BENCH=""; }

if [ -z "$files" ]; then
    files=$(bash "$here/scripts/fetch_model.sh" | tail -1) || { echo "shared_cpu.sh: scripts/fetch_model.sh failed" >&2; exit 1; }
fi
for f in $files; do [ -s "$f" ] || { echo "shared_cpu.sh: $f: no such model file" >&2; exit 2; }; done

work=$(mktemp -d "${TMPDIR:-/tmp}/tern-sharedcpu.XXXXXX") || exit 3
competitors=()
stop_competitors() {
    local pid
    for pid in "${competitors[@]}"; do kill "$pid" 2> /dev/null; done
    for pid in "${competitors[@]}"; do wait "$pid" 2> /dev/null; done
    competitors=()
}
cleanup() { stop_competitors; rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

n_cpus=$(nproc)
start_competitors() {   # condition
    local cpus=""
    case "$1" in
    quiet) return 0 ;;
    one) cpus=0 ;;
    all) cpus=$(seq 0 $((n_cpus - 1))) ;;
    esac
    local cpu
    for cpu in $cpus; do
        taskset -c "$cpu" sh -c 'while :; do :; done' &
        competitors+=("$!")
    done
    sleep 0.5   # let the scheduler settle them on their cores
}

tools="tern"
[ -n "$TERN_BASE" ] && tools="$tools tern-base"
[ -n "$LLAMA_BENCH" ] && tools="$tools llama"
results=$work/results.jsonl
commands=$work/commands.txt
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

run_tool() {   # tool file threads -> writes $work/out.json; returns non-zero on failure
    local tool=$1 f=$2 t=$3 cmd
    case "$tool" in
    tern) cmd=("$TERN" bench -m "$f" -p "$n_prompt" -n "$n_gen" -r "$reps" -t "$t" --peak-gbps 1 --json) ;;
    tern-base) cmd=("$TERN_BASE" bench -m "$f" -p "$n_prompt" -n "$n_gen" -r "$reps" -t "$t" --peak-gbps 1 --json) ;;
    llama) cmd=("$LLAMA_BENCH" -m "$f" -p "$n_prompt" -n "$n_gen" -r "$reps" -t "$t" ${LLAMA_BENCH_ARGS:-} -o json) ;;
    esac
    grep -qxF -- "$tool: ${cmd[*]}" "$commands" 2> /dev/null || echo "$tool: ${cmd[*]}" >> "$commands"
    "${cmd[@]}" > "$work/out.json" 2> "$work/err.txt" || { echo "shared_cpu.sh: $tool failed on $f:" >&2; tail -5 "$work/err.txt" >&2; return 1; }
}

record() {   # tool file threads condition round load json-file
    python3 - "$@" >> "$results" <<'PY'
import json, statistics, sys
tool, f, t, cond, rnd, load, path = sys.argv[1:8]
data = json.load(open(path))
if tool == "llama":   # llama-bench -o json: one entry per test (pp: n_gen 0, tg: n_prompt 0)
    def pick(test):
        for e in data:
            if (test == "pp" and e["n_prompt"] > 0 and e["n_gen"] == 0) or (test == "tg" and e["n_gen"] > 0 and e["n_prompt"] == 0):
                return statistics.median(e["samples_ts"])
        return None
    decode, prefill, commit = pick("tg"), pick("pp"), data[0].get("build_commit", "?")
else:
    decode, prefill, commit = data["decode_tps"], data["prefill_tps"], None
print(json.dumps({"tool": tool, "file": f, "threads": int(t), "condition": cond, "round": int(rnd),
                  "load": float(load), "decode": decode, "prefill": prefill, "commit": commit}))
PY
}

set -- $tools
n_tools=$#
for round in $(seq 1 "$rounds"); do
    # Turn the tools' order each round: tern first in one, second in the next, ...
    shift_by=$(((round - 1) % n_tools))
    set -- $tools
    rotated=("${@:$((shift_by + 1))}" "${@:1:$shift_by}")
    for cond in $conditions; do
        start_competitors "$cond"
        for f in $files; do
            for t in $threads; do
                for tool in "${rotated[@]}"; do
                    load=$(cut -d' ' -f1 /proc/loadavg)
                    echo "shared_cpu.sh: round $round, $cond, $(basename "$f") -t $t: $tool (load $load)" >&2
                    run_tool "$tool" "$f" "$t" || exit 3
                    record "$tool" "$f" "$t" "$cond" "$round" "$load" "$work/out.json" || exit 3
                done
            done
        done
        stop_competitors
    done
done

python3 - "$results" "$conditions" > "$work/table.md" <<'PY'
import json, os, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
conds = sys.argv[2].split()
names = {"quiet": "no competitor", "one": "1 competitor (CPU 0)", "all": "1 competitor per CPU"}
tools = [t for t in ("tern", "tern-base", "llama") if any(r["tool"] == t for r in rows)]
def med(v):
    v = [x for x in v if x is not None]
    return statistics.median(v) if v else float("nan")
def cell(rs, key): return med([r[key] for r in rs])
def fmt(x): return "%.1f" % x if x == x else "-"
def pct(a, b): return "%.0f%%" % (100 * a / b) if a == a and b == b and b > 0 else "-"
def ratio(a, b): return "%.2f" % (a / b) if a == a and b == b and b > 0 else "-"
keys = []
for r in rows:
    k = (r["file"], r["threads"])
    if k not in keys: keys.append(k)
for f, t in keys:
    print("%s, -t %d (medians over %d rounds)" % (os.path.basename(f), t, max(r["round"] for r in rows)))
    print()
    for metric in ("decode", "prefill"):
        head = "| %s | load (1 min) |" % metric
        sep = "|---|---:|"
        for tool in tools:
            head += " %s tok/s | share of no competitor |" % tool
            sep += "---:|---:|"
        for other in tools[1:]:
            head += " tern / %s |" % other
            sep += "---:|"
        print(head)
        print(sep)
        quiet = {tool: cell([r for r in rows if r["tool"] == tool and r["file"] == f and r["threads"] == t and r["condition"] == "quiet"], metric) for tool in tools}
        for c in conds:
            sel = [r for r in rows if r["file"] == f and r["threads"] == t and r["condition"] == c]
            line = "| %s | %.1f |" % (names[c], med([r["load"] for r in sel]))
            v = {tool: cell([r for r in sel if r["tool"] == tool], metric) for tool in tools}
            for tool in tools:
                line += " %s | %s |" % (fmt(v[tool]), pct(v[tool], quiet[tool]) if "quiet" in conds else "-")
            for other in tools[1:]:
                line += " %s |" % ratio(v["tern"], v[other])
            print(line)
        print()
commits = sorted({r["commit"] for r in rows if r["commit"]})
if commits: print("llama.cpp build_commit: " + ", ".join(commits))
PY
[ $? = 0 ] || { echo "shared_cpu.sh: could not build the table from $results" >&2; exit 3; }
cat "$work/table.md"

if [ -n "$out" ]; then
    tern_commit=$(git -C "$here" rev-parse --short HEAD 2> /dev/null || echo unknown)
    git -C "$here" diff --quiet HEAD 2> /dev/null || tern_commit="$tern_commit (with uncommitted changes)"
    {
        echo "# Speed on a shared CPU: tern bench$([ -n "$LLAMA_BENCH" ] && echo " vs llama-bench") under CPU-bound competitors"
        echo
        echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
        echo "- device: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $n_cpus CPUs online"
        echo "- tern: $tern_commit, binary $TERN"
        [ -n "$TERN_BASE" ] && echo "- tern-base: binary $TERN_BASE"
        [ -n "$LLAMA_BENCH" ] && echo "- llama.cpp: $LLAMA_BENCH"
        echo "- load average (1/5/15 min) at start: $load_start, at end: $(cut -d' ' -f1-3 /proc/loadavg) (the machine also runs other work)"
        echo "- -p $n_prompt -n $n_gen -r $reps, $rounds rounds; every round runs every condition, each condition every tool in turn"
        echo "- competitor: \`taskset -c CPU sh -c 'while :; do :; done'\`; \"1 competitor\" pins one to CPU 0, \"per CPU\" one to each CPU"
        echo
        cat "$work/table.md"
        echo
        echo "Commands:"
        echo
        echo '```'
        cat "$commands"
        echo '```'
    } > "$out"
    echo "shared_cpu.sh: wrote $out" >&2
fi
