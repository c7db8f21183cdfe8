#!/usr/bin/env bash
# CPU speed of tern against llama.cpp on the same GGUF files: `tern bench` vs `llama-bench`, decode
# (tg) and prefill (pp) tok/s, plus tern's decode GB/s and its share of the measured read bandwidth.
# The two tools run INTERLEAVED per file and thread count (tern, llama, tern, llama, ...) so that a
# noisy neighbour hits both about equally. Prints a markdown table on stdout.
#
# Usage: bench/cpu_vs_llamacpp.sh [--quick] [--out FILE] [--files "A.gguf B.gguf"] [--threads "2 1"]
#                                 [-p 512] [-n 128] [-r 3] [--rounds 1]
#   --quick      one file (the q4_0 synth, or the first --files), -t 2 only, -p 64 -n 16 -r 1: a smoke
#                test of the whole pipeline in a few minutes; its numbers are NOT a comparison
#   --out FILE   also write the table to FILE with the device, both commits, the date and the commands
#   --files      GGUF files to measure (default: the synth files below, made on first use)
#   --threads    thread counts (default "2 1")
#   -p/-n/-r     prompt tokens, generated tokens, repetitions per invocation (defaults 512/128/3)
#   --rounds N   tern/llama invocation pairs per file and thread count; medians over the rounds
#
# Files: by default `tern synth` makes random-weight $SHAPE models (default llama-1b) in $TYPES
# (default "q4_0 q8_0 q4_k_m f16") under $SYNTH_DIR (default ~/.cache/tern/synth) and reuses them.
# llama.cpp: $LLAMA_CPP_BIN, else /work/peer/llama.cpp/build/bin, else $LLAMA_CPP_HOME/build/bin
# (default ~/.cache/tern/llama.cpp) - built there on first use from the llama.cpp that the PyPI sdist
# of llama-cpp-python vendors (cmake -DGGML_NATIVE=ON). That build takes ~25 minutes on 2 cores.
# tern: $TERN, else build-bench/bin/tern, else build/bin/tern. A quiet machine gives the numbers worth
# comparing; bench/shared_cpu.sh is the one for a busy machine. OMP_WAIT_POLICY (recorded in --out) affects
# llama.cpp only: tern's forward pass runs on its own thread pool.
# LLAMA_BENCH_ARGS: extra llama-bench flags (e.g. "--repack 0" on CPUs where its AMX repacking crashes).
# TERN_BASE=<another tern binary> adds it to the interleave (tern, base, llama, ...) and the table gets
# its decode and prefill tok/s and tern / base: how a change moved the speed, measured under the same noise.
set -u -o pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

quick=0
out=""
files=""
threads="2 1"
n_prompt=512
n_gen=128
reps=3
rounds=1
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 ;;
    --out) out=$2; shift ;;
    --files) files=$2; shift ;;
    --threads) threads=$2; shift ;;
    -p) n_prompt=$2; shift ;;
    -n) n_gen=$2; shift ;;
    -r) reps=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "cpu_vs_llamacpp.sh: unknown argument '$1' (see --help)" >&2; exit 1 ;;
    esac
    shift
done

SHAPE=${SHAPE:-llama-1b}
TYPES=${TYPES:-"q4_0 q8_0 q4_k_m f16"}
SYNTH_DIR=${SYNTH_DIR:-$HOME/.cache/tern/synth}
if [ "$quick" = 1 ]; then
    TYPES=${TYPES%% *}
    threads="2"
    n_prompt=64
    n_gen=16
    reps=1
fi

TERN=${TERN:-}
for t in "$TERN" "$here/build-bench/bin/tern" "$here/build/bin/tern"; do
    if [ -n "$t" ] && [ -x "$t" ]; then TERN=$t; break; fi
done
[ -x "$TERN" ] || { echo "cpu_vs_llamacpp.sh: no tern binary (build it, or set TERN)" >&2; exit 1; }
# The table names the checkout's commit, so a binary older than that commit would be measured under the
# wrong name: refuse it (it happened: a build-bench/ left from an earlier day).
if head_time=$(git -C "$here" log -1 --format=%ct 2>/dev/null) && [ "$(stat -c %Y "$TERN")" -lt "$head_time" ]; then
    echo "cpu_vs_llamacpp.sh: $TERN is older than commit $(git -C "$here" rev-parse --short HEAD); rebuild it or set TERN to a current binary" >&2
    exit 2
fi

# llama.cpp from the PyPI sdist of llama-cpp-python (bench/llamacpp_cpu_peer.sh).
. "$here/bench/llamacpp_cpu_peer.sh"
TERN_BASE=${TERN_BASE:-}
if [ -n "$TERN_BASE" ] && [ ! -x "$TERN_BASE" ]; then
    echo "cpu_vs_llamacpp.sh: TERN_BASE=$TERN_BASE is not an executable tern binary" >&2
    exit 1
fi
LLAMA_CPP_BIN=${LLAMA_CPP_BIN:-}
if [ -z "$LLAMA_CPP_BIN" ]; then
    if [ -x /work/peer/llama.cpp/build/bin/llama-bench ]; then
        LLAMA_CPP_BIN=/work/peer/llama.cpp/build/bin
    else
        LLAMA_CPP_BIN=$(llamacpp_cpu_bin llama-bench) || { echo "cpu_vs_llamacpp.sh: llama.cpp build failed" >&2; exit 1; }
    fi
fi
LLAMA_BENCH=$LLAMA_CPP_BIN/llama-bench
[ -x "$LLAMA_BENCH" ] || { echo "cpu_vs_llamacpp.sh: $LLAMA_BENCH not found (set LLAMA_CPP_BIN)" >&2; exit 1; }

if [ -z "$files" ]; then
    mkdir -p "$SYNTH_DIR"
    for type in $TYPES; do
        f=$SYNTH_DIR/$SHAPE-$type.gguf
        if [ ! -s "$f" ]; then
            echo "cpu_vs_llamacpp.sh: $TERN synth $f --shape $SHAPE --type $type" >&2
            "$TERN" synth "$f" --shape "$SHAPE" --type "$type" >&2 || { echo "cpu_vs_llamacpp.sh: tern synth failed" >&2; exit 1; }
        fi
        files="$files $f"
    done
elif [ "$quick" = 1 ]; then
    files=${files%% *}
fi

load_start=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)   # other work on the machine skews both tools
work=$(mktemp -d "${TMPDIR:-/tmp}/tern-cpubench.XXXXXX")
trap 'rm -rf "$work"' EXIT
results=$work/results.jsonl
commands=$work/commands.txt
# llama.cpp's OpenMP threads spin unless OMP_WAIT_POLICY says otherwise; recorded with the results.
omp_policy=${OMP_WAIT_POLICY:-unset (libgomp default)}

# One line of JSON per invocation: {"tool", "file", "threads", "round", "data": <the tool's JSON>}.
record() {   # tool file threads round json-file
    python3 - "$@" >> "$results" <<'PY'
import json, sys
tool, f, t, rnd, path = sys.argv[1:6]
print(json.dumps({"tool": tool, "file": f, "threads": int(t), "round": int(rnd), "data": json.load(open(path))}))
PY
}

for f in $files; do
    [ -s "$f" ] || { echo "cpu_vs_llamacpp.sh: $f: no such model file" >&2; exit 2; }
    for t in $threads; do
        for round in $(seq 1 "$rounds"); do
            tern_cmd=("$TERN" bench -m "$f" -p "$n_prompt" -n "$n_gen" -r "$reps" -t "$t" --json)
            # shellcheck disable=SC2206  # LLAMA_BENCH_ARGS is a list of words on purpose
            llama_cmd=("$LLAMA_BENCH" -m "$f" -p "$n_prompt" -n "$n_gen" -r "$reps" -t "$t" ${LLAMA_BENCH_ARGS:-} -o json)
            [ "$round" = 1 ] && printf '%s\n' "${tern_cmd[*]}" "${llama_cmd[*]}" >> "$commands"
            echo "cpu_vs_llamacpp.sh: $(basename "$f") -t $t round $round: tern" >&2
            "${tern_cmd[@]}" > "$work/tern.json" 2> "$work/tern.err" || {
                echo "cpu_vs_llamacpp.sh: tern bench failed on $f:" >&2; cat "$work/tern.err" >&2; exit 3; }
            record tern "$f" "$t" "$round" "$work/tern.json"
            if [ -n "$TERN_BASE" ]; then
                base_cmd=("$TERN_BASE" "${tern_cmd[@]:1}")
                [ "$round" = 1 ] && printf '%s\n' "${base_cmd[*]}" >> "$commands"
                echo "cpu_vs_llamacpp.sh: $(basename "$f") -t $t round $round: tern base" >&2
                "${base_cmd[@]}" > "$work/base.json" 2> "$work/base.err" || {
                    echo "cpu_vs_llamacpp.sh: base tern bench failed on $f:" >&2; cat "$work/base.err" >&2; exit 3; }
                record base "$f" "$t" "$round" "$work/base.json"
            fi
            echo "cpu_vs_llamacpp.sh: $(basename "$f") -t $t round $round: llama-bench" >&2
            "${llama_cmd[@]}" > "$work/llama.json" 2> "$work/llama.err" || {
                echo "cpu_vs_llamacpp.sh: llama-bench failed on $f:" >&2; tail -5 "$work/llama.err" >&2; exit 3; }
            record llama "$f" "$t" "$round" "$work/llama.json"
        done
    done
done

# The table: medians over the rounds of each tool's per-invocation median (llama-bench's samples_ts
# median, to match tern's median-of-runs).
python3 - "$results" > "$work/table.md" <<'PY'
import json, os, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = []
for r in rows:
    k = (r["file"], r["threads"])
    if k not in keys: keys.append(k)
def med(v): return statistics.median(v) if v else float("nan")
def llama(data, test):   # llama-bench -o json: one entry per test (pp: n_gen 0, tg: n_prompt 0)
    for e in data:
        if (test == "pp" and e["n_prompt"] > 0 and e["n_gen"] == 0) or (test == "tg" and e["n_gen"] > 0 and e["n_prompt"] == 0):
            return statistics.median(e["samples_ts"])
    return float("nan")
def ratio(a, b): return a / b if b == b and b > 0 else float("nan")
with_base = any(r["tool"] == "base" for r in rows)
base_head = " base decode tok/s | tern / base | base prefill tok/s | tern / base |" if with_base else ""
print("| file | threads | tern decode tok/s | llama decode tok/s | ratio | tern decode GB/s | share of peak | tern prefill tok/s | llama prefill tok/s | ratio |" + base_head)
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" * 4 if with_base else ""))
for f, t in keys:
    tr = [r["data"] for r in rows if r["tool"] == "tern" and r["file"] == f and r["threads"] == t]
    lr = [r["data"] for r in rows if r["tool"] == "llama" and r["file"] == f and r["threads"] == t]
    td, tp = med([d["decode_tps"] for d in tr]), med([d["prefill_tps"] for d in tr])
    gb = med([d["decode_gbps"] for d in tr])
    share = med([d["bandwidth_share"] for d in tr if d.get("bandwidth_share") is not None])
    ld, lp = med([llama(d, "tg") for d in lr]), med([llama(d, "pp") for d in lr])
    line = "| %s | %d | %.2f | %.2f | %.2f | %.2f | %.0f%% | %.2f | %.2f | %.2f |" % (
        os.path.basename(f), t, td, ld, ratio(td, ld), gb, 100 * share, tp, lp, ratio(tp, lp))
    if with_base:
        br = [r["data"] for r in rows if r["tool"] == "base" and r["file"] == f and r["threads"] == t]
        bd, bp = med([d["decode_tps"] for d in br]), med([d["prefill_tps"] for d in br])
        line += " %.2f | %.3f | %.2f | %.3f |" % (bd, ratio(td, bd), bp, ratio(tp, bp))
    print(line)
peaks, plains = {}, {}
for r in rows:
    if r["tool"] == "tern" and r["data"].get("peak_gbps"):
        peaks.setdefault(r["threads"], []).append(r["data"]["peak_gbps"])
    if r["tool"] == "tern" and r["data"].get("plain_read_gbps"):
        plains.setdefault(r["threads"], []).append(r["data"]["plain_read_gbps"])
if peaks:
    print()
    print("Peak read bandwidth measured by each tern run (min-max): " +
          ", ".join("-t %d: %.2f-%.2f GB/s" % (t, min(v), max(v)) for t, v in sorted(peaks.items())))
if plains:
    print("Of which the plain (STREAM-like, no software prefetch) read loop: " +
          ", ".join("-t %d: %.2f-%.2f GB/s" % (t, min(v), max(v)) for t, v in sorted(plains.items())))
PY
[ $? = 0 ] || { echo "cpu_vs_llamacpp.sh: could not build the table from $results" >&2; exit 3; }
cat "$work/table.md"

if [ -n "$out" ]; then
    llama_commit=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["data"][0]["build_commit"])' \
        <(grep '"tool": "llama"' "$results"))
    tern_commit=$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)
    git -C "$here" diff --quiet HEAD 2>/dev/null || tern_commit="$tern_commit (with uncommitted changes)"
    {
        echo "# tern bench vs llama-bench (CPU)"
        echo
        echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
        echo "- device: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs online, $(lscpu | sed -n 's/^Core(s) per socket: *//p' | head -1) cores per socket"
        echo "- tern: $tern_commit, binary $TERN ($("$TERN" --version 2>/dev/null | head -1))"
        [ -n "$TERN_BASE" ] && echo "- tern base: $TERN_BASE ($("$TERN_BASE" --version 2>/dev/null | head -1))"
        echo "- llama.cpp: $llama_commit ($LLAMA_BENCH)"
        echo "- load average (1/5/15 min) at start: $load_start, at end: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null) on $(nproc) CPUs"
        echo "- mode: $([ "$quick" = 1 ] && echo 'quick (smoke test; not a comparison)' || echo full), -p $n_prompt -n $n_gen -r $reps, $rounds round(s), interleaved tern/llama, OMP_WAIT_POLICY=$omp_policy"
        echo "- ratio = tern / llama.cpp; GB/s = (weights + KV bytes read per decoded token) x decode tok/s"
        echo
        cat "$work/table.md"
        echo
        echo "Commands (per file and thread count, alternating):"
        echo
        echo '```'
        cat "$commands"
        echo '```'
    } > "$out"
    echo "cpu_vs_llamacpp.sh: wrote $out" >&2
fi
