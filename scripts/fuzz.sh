#!/usr/bin/env bash
# Builds the fuzz preset (clang, libFuzzer, ASan+UBSan; tests/fuzz) and runs every fuzz target for
# SECONDS each from seeds derived from ../shared/models. Fails on any crash, hang, leak or sanitizer
# report, leaving the reproducer in the work folder (replay it: build-fuzz/bin/fuzz_<target> FILE;
# keep it as a regression under tests/data/fuzz/<target>/).
#   bash scripts/fuzz.sh                  every target, 30 s each (CI: scripts/test.sh's third stage)
#   bash scripts/fuzz.sh 1800             the long run: 30 minutes per target
#   bash scripts/fuzz.sh 60 gguf tokenizer  only these targets
#   TERN_FUZZ_WORK=DIR                    keep seeds, corpora, crashes and logs there (default: a
#                                         temp folder, removed when every target passed)
#   TERN_FUZZ_ARGS="-jobs=2 -workers=2"   extra libFuzzer flags
#   TERN_JOBS=2                           build jobs, and targets fuzzed at once (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"
[ $# -gt 0 ] && shift
jobs="${TERN_JOBS:-2}"
shared="${TERN_SHARED:-$(pwd)/../shared}"

echo "== fuzz build" >&2
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target fuzz_targets -j "$jobs"
bin=build-fuzz/bin

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    for exe in "$bin"/fuzz_*; do
        name=$(basename "$exe")
        [ "$name" = fuzz_make_seeds ] || targets+=("${name#fuzz_}")
    done
fi

work="${TERN_FUZZ_WORK:-}"
keep_work=1
if [ -z "$work" ]; then
    work=$(mktemp -d "${TMPDIR:-/tmp}/tern-fuzz.XXXXXX")
    keep_work=0
fi
mkdir -p "$work"
gemma="${TERN_GEMMA:-$HOME/.cache/tern/models/gemma-3-270m-q4_k_m.gguf}"
"$bin/fuzz_make_seeds" "$work/seeds" "$shared" "$gemma" >&2

# Per target: the largest input (model seeds are whole 1-layer models), the per-input time limit
# in seconds (every vocabulary encodes each tokenizer input under ASan) and the dictionary.
settings() {
    case "$1" in
        gguf) echo "65536 10 gguf" ;;
        model_load) echo "262144 20 gguf" ;;
        tokenizer) echo "4096 30 tokenizer" ;;
        chat_template) echo "16384 10 chat_template" ;;
        prefix_entry) echo "65536 10 -" ;;
        http_request) echo "65536 10 http_request" ;;
        request_fields) echo "65536 10 request_fields" ;;
        *) echo "65536 20 -" ;;
    esac
}

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
# One target's run, its exit status left in $work/<target>/status.
fuzz_one() {
    local t=$1 max_len timeout dict dir status=0
    read -r max_len timeout dict <<<"$(settings "$t")"
    dir="$work/$t"
    mkdir -p "$dir/corpus" "$dir/crashes" "$work/seeds/$t"
    local args=(-max_total_time="$seconds" -max_len="$max_len" -timeout="$timeout" -rss_limit_mb=4096
                -malloc_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$dir/crashes/")
    [ "$dict" != - ] && args+=(-dict="tests/fuzz/$dict.dict")
    local seeds=("$work/seeds/$t")
    [ -d "tests/data/fuzz/$t" ] && seeds+=("tests/data/fuzz/$t")
    # shellcheck disable=SC2086  # TERN_FUZZ_ARGS is a list of flags
    "$bin/fuzz_$t" "${args[@]}" ${TERN_FUZZ_ARGS:-} "$dir/corpus" "${seeds[@]}" >"$dir/log" 2>&1 || status=$?
    echo "$status" >"$dir/status"
}

for t in "${targets[@]}"; do
    [ -x "$bin/fuzz_$t" ] || { echo "fuzz: no target fuzz_$t in $bin" >&2; exit 1; }
done
# Each libFuzzer process runs on one core: $jobs targets at a time (each still fuzzed for SECONDS), the
# table below printed in order once all have finished.
running=0
for t in "${targets[@]}"; do
    if [ "$running" -ge "$jobs" ]; then
        wait -n
        running=$((running - 1))
    fi
    fuzz_one "$t" &
    running=$((running + 1))
done
wait

failed=()
printf '%-14s %10s %8s %7s %8s %10s %s\n' target execs exec/s cov ft corpus result >&2
for t in "${targets[@]}"; do
    dir="$work/$t"
    status=$(cat "$dir/status" 2>/dev/null || echo "no status")
    done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$dir/log" | tail -1 || true)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$dir/log" | tail -1)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$done_line")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$done_line")
    corp=$(sed -n 's/.* corp: \([^ ]*\).*/\1/p' <<<"$done_line")
    result=ok
    if [ "$status" != 0 ] || [ -n "$(ls -A "$dir/crashes")" ]; then
        result="FAILED (exit $status; log $dir/log)"
        failed+=("$t")
    fi
    printf '%-14s %10s %8s %7s %8s %10s %s\n' "$t" "${execs:--}" "${rate:--}" "${cov:--}" "${ft:--}" "${corp:--}" \
        "$result" >&2
done

if [ ${#failed[@]} -gt 0 ]; then
    for t in "${failed[@]}"; do
        echo "== fuzz_$t: last lines of $work/$t/log" >&2
        tail -n 40 "$work/$t/log" >&2
        ls -l "$work/$t/crashes" >&2
    done
    echo "fuzz: ${failed[*]} failed; reproducers under $work" >&2
    exit 1
fi
[ "$keep_work" -eq 1 ] || rm -rf "$work"
