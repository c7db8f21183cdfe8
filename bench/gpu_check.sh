#!/usr/bin/env bash
# The one command for a machine with an NVIDIA GPU (run from the repository root there): builds tern for the
# GPU's architecture with the CUDA test suites linked against the real build (TERN_CUDA_TESTS=device), runs
# every CUDA test on the GPU, compute-sanitizer memcheck on the kernel suites, the whole-model CUDA-vs-CPU
# suite, the GPU's copy and read bandwidth (bench/cuda_copy_bandwidth.cu), and `tern bench --device cuda`
# on random-weight llama-8b files in q4_k_m, q8_0, f16 and f8_e4m3 (prefill 512 and 4096, decode 128 at
# depth 0 and 4096; the first format's depth 4096 again with TERN_CUDA_ATTN=old, the previous decode
# attention; prefill 512 of the formats whose default is the int8 tiles again on f16 tensor cores,
# TERN_CUDA_PREFILL=f16); with --with-llamacpp also llama.cpp's CUDA llama-bench on the same files
# (bench/llamacpp_cuda.sh). A failing step is recorded and the next one runs; each step runs under
# `timeout` inside a total budget (--budget, default 540 s: room to spare under a 10-minute limit), and the
# steps that no longer fit are listed as skipped. Prints the summary last. The GPU machine needs the CUDA
# toolkit (nvcc, compute-sanitizer), cmake, a C++ compiler and python3, but no network: --prepare gathers
# the rest beforehand.
#
# Usage: bench/gpu_check.sh [--with-llamacpp] [--only STEPS] [--skip STEPS] [--budget S] [--arch SM]
#                           [--shape S] [--formats "q4_k_m q8_0 f16 f8_e4m3"] [-r N] [-j N] [--quick]
#        bench/gpu_check.sh --prepare [--with-llamacpp]     (with network, beforehand: see "Preparing" below)
#        bench/gpu_check.sh --pack [--arch SM] [--with-llamacpp]   (beforehand: see "A prebuilt pack" below)
#        bench/gpu_check.sh --synth-only [--shape S] [--formats ...]   (only write the model files)
#   --with-llamacpp  also build llama.cpp's CUDA backend (in the background, paused while tern is timed)
#                    and run llama-bench on the same files after tern's benchmarks
#   --only/--skip    comma-separated steps, in the order they run: configure build tests memcheck backend
#                    synth bandwidth bench llamacpp-build llamacpp (the GPU description and the build
#                    packages, gpu and deps, always run; a second run on the same machine with
#                    `--only synth,bandwidth,bench,llamacpp` reuses the build, the models and llama.cpp's build)
#   --budget S       seconds for the whole run (default 540); -r N: tern bench repetitions (default 3)
#   --memcheck "S.." the suites run under compute-sanitizer memcheck (default: the twelve kernel suites)
#   --profile        also Nsight Compute's time per kernel of decode steps and 8-token verifications (the
#                    first format; profile-<format>.md in the logs)
#   --arch SM        CUDA architecture (default: nvidia-smi's compute capability, e.g. 90 on H100/H200)
#   --quick          q4_k_m only, one repetition, prefill 512 + decode 128 at depth 0: the plumbing, not numbers
#   -j N             build jobs (default: the CPUs online)
#
# Output, under $OUT (default ./gpu_check_out), five files at most, so that they are quick to fetch:
#   summary.md      step results, the GPU and its bandwidth, and the table: tern tok/s, decode GB/s, share of
#                   the copy and read bandwidth (and llama.cpp tok/s and tern/llama with --with-llamacpp)
#   results.json    the same as data: steps, bandwidth, every `tern bench --json` object
#   logs.tar.gz     every step's log (rewritten after each step, so a cut-off run still returns its logs)
#   llamacpp.md, llamacpp.json   llama-bench's numbers (--with-llamacpp)
# Work files go to $TERN_GPU_WORK (default build-gpu/, git-ignored, reused by a later run on the same machine):
# tern/ (the build), models/ (the synthetic GGUF files, ~38 GB for llama-8b: written once, reused; MODELS
# puts them elsewhere, e.g. /dev/shm when the disk is short), llama.cpp/ (its build), deps/, logs/.
# Exit status: 0 when no step failed or timed out, else 1.
#
# Preparing (on a machine with network, when the GPU machine has none): `bench/gpu_check.sh --prepare
# [--with-llamacpp]` fills the git-ignored .peer/ with what the GPU machine cannot download:
#   .peer/debs       the Debian packages tern builds with (CLI11, doctest, nlohmann-json, xxHash, PCRE2, libedit,
#                    pkgconf), unpacked into build-gpu/deps and used only when the machine lacks them
#   .peer/shared     a subset of ../shared for the whole-model suite ($TERN_SHARED_SUBSET, default models/gguf);
#                    TERN_SHARED points there unless already set
#   .peer/llama.cpp  llama.cpp's source (bench/llamacpp_cuda.sh --prepare), with --with-llamacpp
# and prints the size of the working tree with .peer. Copy both to the GPU machine and run there, from the
# repository root: bash bench/gpu_check.sh --with-llamacpp
#
# A prebuilt pack (when the GPU's minutes are few: the build then costs none of them): `bench/gpu_check.sh
# --pack --arch 90 [--with-llamacpp]` builds, here and with nvcc but no GPU, tern and the CUDA suites for that
# architecture (device mode, stripped; build-gpu-pack/, TERN_PACK_BUILD), and writes .peer/gpu-pack.tar.xz:
# bin/ (tern, the suites, and llama-bench from bench/llamacpp_cuda.sh --build with --with-llamacpp), lib/
# (the run-time libraries they link, but the C/C++ runtime and CUDA's), shared/ (the ../shared files the
# CUDA suites read) and PACK.txt. On the GPU machine the run finds the pack, unpacks it into
# $TERN_GPU_WORK/pack, links only the libraries the system lacks, and runs the suites from it: the configure
# and build steps are then "prebuilt". Carry .peer/gpu-pack.tar.xz alone with the working tree.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

mode=check
with_llamacpp=0
with_profile=0
only=""
skip=""
budget=540
arch=${TERN_CUDA_ARCH:-}
shape=llama-8b
formats="q4_k_m q8_0 f16 f8_e4m3"
reps=3
jobs=$(nproc 2>/dev/null || echo 2)
bench_runs=${TERN_BENCH_RUNS:-"512:128:0 4096:0:0 0:128:4096"}   # prefill:decode:depth per tern bench call
memcheck_suites="test_cuda_matmul test_cuda_matmul_q8 test_cuda_fused test_cuda_gemm_q8 test_cuda_gemm_f16
                 test_cuda_attention test_cuda_attention_mma test_cuda_elementwise test_cuda_rope test_cuda_sampling
                 test_cuda_sequences test_cuda_moe"
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
    --prepare) mode=prepare ;;
    --pack) mode=pack ;;
    --synth-only) mode=synth ;;
    --with-llamacpp) with_llamacpp=1 ;;
    --profile) with_profile=1 ;;
    --only) only=",$2," ; shift ;;
    --skip) skip=",$2,"; shift ;;
    --budget) budget=$2; shift ;;
    --memcheck) memcheck_suites=$2; shift ;;
    --arch) arch=$2; shift ;;
    --shape) shape=$2; shift ;;
    --formats) formats=$2; shift ;;
    -r) reps=$2; shift ;;
    -j) jobs=$2; shift ;;
    --quick) formats=q4_k_m; reps=1; bench_runs="512:128:0" ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1' (see --help)" >&2; exit 1 ;;
    esac
    shift
done
[[ "$budget" =~ ^[0-9]+$ ]] || { echo "gpu_check.sh: --budget needs seconds" >&2; exit 1; }

work=${TERN_GPU_WORK:-$root/build-gpu}
build=$work/tern
models=${MODELS:-$work/models}
out=$(realpath -m "${OUT:-$root/gpu_check_out}")
pack_file=$root/.peer/gpu-pack.tar.xz
pack_dir=$work/pack
bindir=$build/bin    # where tern and the suites are: the build's, or the unpacked pack's
tern=${TERN_GPU_TERN:-$bindir/tern}
export TERN_GPU_WORK=$work MODELS=$models

# The Debian packages tern builds with, and the libraries they need at run time.
deb_packages=(libcli11-dev doctest-dev nlohmann-json3-dev libxxhash-dev libxxhash0 libpcre2-dev libpcre2-8-0
              libedit-dev libedit2 libbsd0 libmd0 pkgconf-bin libpkgconf3)

# ---- --prepare ------------------------------------------------------------------------------------------
prepare() {
    echo "gpu_check.sh: downloading ${#deb_packages[@]} Debian packages into .peer/debs" >&2
    rm -rf .peer/debs && mkdir -p .peer/debs
    ( cd .peer/debs && apt-get download "${deb_packages[@]}" >&2 ) ||
        { echo "gpu_check.sh: apt-get download failed (try apt-get update first)" >&2; return 1; }
    local shared=${TERN_SHARED:-$root/../shared} p
    rm -rf .peer/shared
    if [ -d "$shared/models" ]; then
        for p in ${TERN_SHARED_SUBSET:-models/gguf}; do
            mkdir -p ".peer/shared/$(dirname "$p")"
            cp -r "$shared/$p" ".peer/shared/$p"
        done
        echo "gpu_check.sh: copied ${TERN_SHARED_SUBSET:-models/gguf} of $shared into .peer/shared" >&2
    else
        echo "gpu_check.sh: no $shared/models: the whole-model suite will find no models there" >&2
    fi
    if [ "$with_llamacpp" = 1 ]; then
        bash bench/llamacpp_cuda.sh --prepare
    fi
    local tree peer
    tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
    peer=$(du -sb .peer | cut -f1)
    echo "gpu_check.sh: to copy to the GPU machine: working tree $((tree / 1048576)) MiB + .peer" \
         "$((peer / 1048576)) MiB = $(((tree + peer) / 1048576)) MiB (TERN_SHARED_SUBSET trims the ../shared part)" >&2
    local flag=""
    [ "$with_llamacpp" = 1 ] && flag=" --with-llamacpp"
    echo "gpu_check.sh: then run there: bash bench/gpu_check.sh$flag" >&2
}

# The test_cuda_* suites that run on the device (the emulator's own stay on the CPU).
cuda_suites() {
    local f name
    for f in "$root"/tests/cuda/test_cuda_*.cpp; do
        [ -e "$f" ] || continue
        name=$(basename "$f" .cpp)
        [[ "$name" == test_cuda_emulator* ]] || echo "$name"
    done
}

# ---- --pack ---------------------------------------------------------------------------------------------
# The ../shared files the CUDA suites read: every small real model (but babyllama's f32 copy, the largest:
# its other files cover that architecture), every file and reference folder whose name a CUDA suite spells
# out (a stem, a models/... path), llama.cpp's references for all of them, and their vocabularies.
# TERN_PACK_SHARED=named: only the files the suites name (the whole-model suite then runs its quick list,
# TERN_TEST_QUICK=1); none: no ../shared at all (with TERN_PACK_SUITES naming suites that read none).
pack_shared_files() {   # shared root: prints paths relative to it
    local shared=$1 f name stems=()
    [ "${TERN_PACK_SHARED:-all}" = none ] && return 0
    if [ "${TERN_PACK_SHARED:-all}" != named ]; then
        for f in "$shared"/models/gguf/*.gguf; do
            [ "$(basename "$f")" = babyllama-tok105-f32.gguf ] || stems+=("$(basename "$f" .gguf)")
        done
    fi
    while read -r name; do
        name=${name%.gguf}
        stems+=("${name##*/}")
        [ -f "$shared/$name.gguf" ] && echo "$name.gguf"
    done < <(grep -ho '"[A-Za-z0-9_./-]*"' "$root"/tests/cuda/test_cuda_*.cpp | tr -d '"' | sort -u)
    for name in "${stems[@]}"; do
        [ -n "$name" ] || continue   # a folder name ("reference/") is no stem
        for f in "models/gguf/$name.gguf" "models/synth/$name.gguf" "reference/$name"; do
            [ "$name" != babyllama-tok105-f32 ] && [ -e "$shared/$f" ] && echo "$f"
        done
    done
}
# Libraries a packed binary links that a GPU machine may lack: everything ldd names but the C and C++
# runtime (the machine's own, newer or equal) and CUDA's (the machine's toolkit and driver; NCCL, which
# llama.cpp links when it finds it, is 200 MB: the unpack step finds the machine's).
pack_libs() {   # binaries...
    ldd "$@" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
        grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so' || true
}
pack() {
    [ -n "$arch" ] || arch=90
    local pbuild=${TERN_PACK_BUILD:-$root/build-gpu-pack} shared=${TERN_SHARED:-$root/../shared} targets launcher=()
    if [ -n "${TERN_PACK_SUITES:-}" ]; then
        read -r -a targets <<< "$TERN_PACK_SUITES"   # a lighter pack: these suites only
    else
        mapfile -t targets < <(cuda_suites)
    fi
    command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
    echo "gpu_check.sh: building tern + ${#targets[@]} CUDA suites for sm_$arch (device mode) in $pbuild" >&2
    cmake -S "$root" -B "$pbuild" -DCMAKE_BUILD_TYPE=Release -DTERN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
        -DTERN_CUDA_TESTS=device -DCMAKE_EXE_LINKER_FLAGS=-s "${launcher[@]}" >&2
    cmake --build "$pbuild" -j "$jobs" --target tern "${targets[@]}" >&2
    local stage
    stage=$(mktemp -d "${TMPDIR:-/tmp}/tern-gpu-pack.XXXXXX")
    # shellcheck disable=SC2064  # expand now: stage is local
    trap "rm -rf '$stage'" RETURN
    mkdir -p "$stage/bin" "$stage/lib" "$stage/shared"
    local t bins=()
    for t in tern "${targets[@]}"; do
        cp "$pbuild/bin/$t" "$stage/bin/" && bins+=("$stage/bin/$t")
    done
    if [ "$with_llamacpp" = 1 ]; then
        local llama=${LLAMA_BENCH_BIN:-$work/llama.cpp/bin/llama-bench}
        [ -x "$llama" ] || { echo "gpu_check.sh: no $llama: build it first (TERN_GPU_WORK=$work bench/llamacpp_cuda.sh --build --arch $arch)" >&2; return 1; }
        strip -o "$stage/bin/llama-bench" "$llama"
        bins+=("$stage/bin/llama-bench")
        [ -f "$root/.peer/llama.cpp/TERN_SOURCE.txt" ] && cp "$root/.peer/llama.cpp/TERN_SOURCE.txt" "$stage/LLAMA_SOURCE.txt"
    fi
    local lib
    for lib in $(pack_libs "${bins[@]}"); do cp -L "$lib" "$stage/lib/"; done
    local rel
    while read -r rel; do
        mkdir -p "$stage/shared/$(dirname "$rel")"
        cp -rL "$shared/$rel" "$stage/shared/$rel"
    done < <(pack_shared_files "$shared" | sort -u)
    [ "${TERN_PACK_SHARED:-all}" = all ] || echo "shared ${TERN_PACK_SHARED}" > "$stage/SHARED.txt"
    printf 'commit %s\narch %s\ndate %s\n' "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')" \
        "$arch" "$(date -u '+%Y-%m-%d %H:%M UTC')" > "$stage/PACK.txt"
    mkdir -p .peer
    tar -C "$stage" -cf - . | xz -9 -T "$jobs" > "$pack_file.tmp" && mv "$pack_file.tmp" "$pack_file"
    local tree size
    tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
    size=$(stat -c %s "$pack_file")
    echo "gpu_check.sh: $pack_file: $((size / 1048576)) MiB ($(ls "$stage/bin" | wc -l) binaries," \
         "$(ls "$stage/lib" | wc -l) libraries, $(du -sm "$stage/shared" | cut -f1) MiB of ../shared);" \
         "with the working tree $(((tree + size) / 1048576)) MiB to carry" >&2
}

# Unpacks the pack on the GPU machine (a step): the binaries, the shared subset, and links to the packed
# libraries the system lacks.
unpack() {
    [ -f "$pack_file" ] || { STEP_NOTE="no $pack_file"; return 1; }
    rm -rf "$pack_dir" && mkdir -p "$pack_dir"
    if command -v xz >/dev/null; then
        tar -C "$pack_dir" -xJf "$pack_file" || return 1
    else
        python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' \
            "$pack_file" "$pack_dir" || return 1
    fi
    mkdir -p "$pack_dir/use-lib"
    local lib name missing=()
    for lib in "$pack_dir"/lib/*; do
        [ -e "$lib" ] || continue
        name=$(basename "$lib")
        if ! ldconfig -p 2>/dev/null | grep "^[[:space:]]*$name " > /dev/null; then
            ln -sf "$lib" "$pack_dir/use-lib/$name"
            missing+=("$name")
        fi
    done
    STEP_NOTE="$(head -n 1 "$pack_dir/PACK.txt"); packed libraries used: ${missing[*]:-none}"
}

# Folders holding the CUDA libraries the packed binaries link but the loader does not find (the toolkit's
# lib folders, or the Python venv's nvidia packages): printed one a line, for LD_LIBRARY_PATH.
cuda_lib_dirs() {   # binaries...
    local lib dir found
    for lib in $(LD_LIBRARY_PATH=$pack_dir/use-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ldd "$@" 2>/dev/null |
                 awk '$3 == "not" { print $1 }' | sort -u); do
        found=""
        for dir in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
                   /usr/lib/x86_64-linux-gnu /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib \
                   /usr/local/lib/python3*/dist-packages/nvidia/*/lib; do
            [ -e "$dir/$lib" ] && { found=$dir; break; }
        done
        [ -n "$found" ] && echo "$found"
    done | sort -u
}

# ---- the model files (also --synth-only) ----------------------------------------------------------------
synth_models() {
    [ -x "$tern" ] || { echo "gpu_check.sh: no tern binary at $tern (build first)" >&2; return 1; }
    mkdir -p "$models"
    local fmt f status=0
    for fmt in $formats; do
        f=$models/$shape-$fmt.gguf
        if [ -s "$f" ]; then
            echo "$f: present ($(du -h "$f" | cut -f1))"
            continue
        fi
        echo "$f: tern synth --shape $shape --type $fmt"
        # Written to a temporary file and renamed: an interrupted write leaves no partial model behind.
        "$tern" synth "$f" --shape "$shape" --type "$fmt" || status=1
    done
    return "$status"
}

case "$mode" in
prepare) prepare; exit ;;
synth) synth_models; exit ;;
pack) pack; exit ;;
esac

# ---- the run's bookkeeping ------------------------------------------------------------------------------
start=$SECONDS
deadline=$((start + budget))
reserve=20   # kept for the summary and the log archive
mkdir -p "$out" "$work"
logs=$work/logs/$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$logs"
steps=$logs/steps.tsv
: > "$steps"
rm -f "$out/summary.md" "$out/results.json" "$out/logs.tar.gz" "$out/llamacpp.md" "$out/llamacpp.json"

# Seconds a command may still run: the lesser of `cap` and what the budget leaves (0: none left).
allow() {
    local cap=$1 left=$((deadline - SECONDS - reserve))
    [ "$left" -lt "$cap" ] && cap=$left
    [ "$cap" -ge 5 ] || cap=0
    echo "$cap"
}
# A command under timeout within the budget; exit 124 (as timeout's) when no time is left to start it.
tmo() {
    local t
    t=$(allow "$1")
    shift
    [ "$t" -gt 0 ] || { echo "gpu_check.sh: no time left in the budget for: $*"; return 124; }
    timeout -k 10 "$t" "$@"
}
wanted() {   # the GPU description and the build packages are always needed
    local name=${1%%:*}
    [ "$name" = gpu ] || [ "$name" = deps ] && return 0
    { [ -z "$only" ] || [[ "$only" == *",$name,"* ]]; } && [[ "$skip" != *",$name,"* ]]
}
STEP_NOTE=""
record() {   # name status seconds note
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$steps"
    printf '[%4ds] %-34s %-8s %4ss  %s\n' $((SECONDS - start)) "$1" "$2" "$3" "$4"
    write_summary > /dev/null 2>&1 || true
    tar -czf "$out/logs.tar.gz.tmp" -C "$logs" . 2>/dev/null && mv "$out/logs.tar.gz.tmp" "$out/logs.tar.gz"
}
# run_step NAME COMMAND...: the command (a function of this script) with its output in NAME's log. Exit 77
# means "nothing to do here" (skipped), 124/137 a timeout.
run_step() {
    local name=$1 rc=0 began=$SECONDS status
    shift
    if ! wanted "$name"; then
        record "$name" skipped 0 "not selected (--only/--skip)"
        return 0
    fi
    if [ "$(allow 1000000)" -lt 15 ]; then
        record "$name" skipped 0 "the time budget is spent"
        return 0
    fi
    STEP_NOTE=""
    "$@" > "$logs/${name//:/-}.log" 2>&1 || rc=$?
    local own_note=$STEP_NOTE
    case "$rc" in
    0) status=ok ;;
    77) status=skipped ;;
    124|137) status=TIMEOUT ;;
    *) status=FAILED; STEP_NOTE="exit $rc${STEP_NOTE:+; $STEP_NOTE}" ;;
    esac
    if [ -z "$own_note" ] && { [ "$status" = FAILED ] || [ "$status" = TIMEOUT ]; }; then
        local last   # the log's last line says why, usually
        last=$(grep -v '^[[:space:]]*$' "$logs/${name//:/-}.log" | tail -n 1 | cut -c1-160 || true)
        [ -n "$last" ] && STEP_NOTE="$STEP_NOTE${STEP_NOTE:+; }$last"
    fi
    record "$name" "$status" $((SECONDS - began)) "$STEP_NOTE"
    return 0
}

# Background jobs (the llama.cpp build, the model files) run in their own process group, so that they can be
# paused while tern is timed and ended with everything they started.
declare -A bg_pid=() bg_began=()
bg_start() {   # name cap command...
    local name=$1 t
    t=$(allow "$2")
    shift 2
    [ "$t" -gt 0 ] || return 0
    setsid timeout -k 10 "$t" "$@" > "$logs/$name.log" 2>&1 < /dev/null &
    bg_pid[$name]=$!
    bg_began[$name]=$SECONDS
    printf '[%4ds] %-34s started in the background\n' $((SECONDS - start)) "$name"
}
bg_signal() {   # name signal
    if [ -n "${bg_pid[$1]:-}" ]; then kill "-$2" -- "-${bg_pid[$1]}" 2>/dev/null || true; fi
}
# Waits for a background job while the budget allows (keeping `keep` seconds), then records it.
bg_finish() {   # name keep
    local name=$1 keep=$2 rc=0 status
    [ -n "${bg_pid[$name]:-}" ] || return 0
    bg_signal "$name" CONT
    while kill -0 "${bg_pid[$name]}" 2>/dev/null && [ "$(allow 1000000)" -gt "$keep" ]; do sleep 1; done
    if kill -0 "${bg_pid[$name]}" 2>/dev/null; then
        bg_signal "$name" TERM
        sleep 2
        bg_signal "$name" KILL
    fi
    wait "${bg_pid[$name]}" 2>/dev/null || rc=$?
    case "$rc" in 0) status=ok ;; 124|137|143) status=TIMEOUT ;; *) status=FAILED ;; esac
    local note="in the background"
    [ "$status" = FAILED ] && note="exit $rc; $note"
    record "$name" "$status" $((SECONDS - bg_began[$name])) "$note"
    unset "bg_pid[$name]"
    return 0
}
cleanup() {
    local name
    for name in "${!bg_pid[@]}"; do
        bg_signal "$name" CONT
        bg_signal "$name" TERM
    done
    write_summary || true
    tar -czf "$out/logs.tar.gz" -C "$logs" . 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the summary ----------------------------------------------------------------------------------------
write_summary() {
    python3 - "$logs" "$out" "$shape" "$formats" "$bench_runs" "$budget" <<'PY'
import json, os, statistics, sys
logs, out, shape, budget = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[6]
formats, runs = sys.argv[4].split(), sys.argv[5].split()
def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
steps = [l.rstrip("\n").split("\t") for l in open(os.path.join(logs, "steps.tsv")) if l.strip()]
env = load(os.path.join(logs, "env.json")) or {}
bw = load(os.path.join(logs, "bandwidth.json")) or {}
llama = load(os.path.join(out, "llamacpp.json")) or {}
bench = {}
for fmt in formats:
    for r in runs:
        p, n, d = r.split(":")
        data = load(os.path.join(logs, "bench-%s-p%s-n%s-d%s.json" % (fmt, p, n, d)))
        if data: bench[(fmt, r)] = data
copy_bw, read_bw = bw.get("copy_gbps_best"), bw.get("read_gbps_best")
def llama_ts(fmt, n_prompt, n_gen, depth):
    for e in (llama.get("formats", {}).get(fmt, {}).get("entries") or []):
        if e["n_prompt"] == n_prompt and e["n_gen"] == n_gen and e.get("n_depth", 0) == depth:
            return statistics.median(e.get("samples_ts") or [e["avg_ts"]])
    return None
rows = []
for fmt in formats:
    for r in runs:
        p, n, d = (int(x) for x in r.split(":"))
        data = bench.get((fmt, r))
        if p > 0:
            rows.append((fmt, "pp%d" % p, d, data and data["prefill_tps"], None, llama_ts(fmt, p, 0, d)))
        if n > 0:
            rows.append((fmt, "tg%d" % n, d, data and data["decode_tps"], data and data["decode_gbps"],
                         llama_ts(fmt, 0, n, d)))
def f(v, spec="%.2f"): return "-" if v is None else spec % v
def share(gbps, peak): return "-" if not gbps or not peak else "%.0f%%" % (100 * gbps / peak)
lines = ["# bench/gpu_check.sh", ""]
def e(key): return env.get(key) or "?"
lines.append("- date: %s; tern %s" % (e("date"), e("commit")))
lines.append("- GPU: %s (sm_%s), driver %s, %s; CUDA %s; %s CPUs"
             % (e("gpu"), e("arch"), e("driver"), e("memory"), e("nvcc"), e("cpus")))
if bw:
    lines.append("- bandwidth (best of %d, %.1f GiB buffers): copy %.0f GB/s (cudaMemcpy D2D, bytes read + written), "
                 "read %.0f GB/s (read-only kernel, bytes read)"
                 % (bw["repetitions"], bw["buffer_bytes"] / 2**30, copy_bw, read_bw))
lines.append("- tern bench: `tern bench -m %s-<format>.gguf --device cuda -p P -n N -d D -r R --json` for P:N:D in %s"
             % (shape, " ".join(runs)))
peaks = sorted({(round(v["peak_gbps"]), v.get("peak_method") or "?") for v in bench.values() if v.get("peak_gbps")})
if peaks:
    lines.append("- tern bench's own peak: " + "; ".join("%d GB/s (%s)" % p for p in peaks))
if llama:
    lines.append("- llama.cpp: %s (build %s), `llama-bench -ngl 99 -p 512,4096 -n 128 -d 0,4096`"
                 % (llama.get("source"), llama.get("build_commit")))
lines += ["", "## Steps", "", "| step | status | seconds | note |", "|---|---|---:|---|"]
for s in steps:
    s += [""] * (4 - len(s))
    lines.append("| %s | %s | %s | %s |" % (s[0], s[1], s[2], s[3].replace("|", "/")))
lines += ["", "## Speed (%s, random weights)" % shape, ""]
head = "| format | test | depth | tern tok/s | decode GB/s | share of copy bw | share of read bw |"
rule = "|---|---|---:|---:|---:|---:|---:|"
if llama:
    head += " llama.cpp tok/s | tern / llama |"
    rule += "---:|---:|"
lines += [head, rule]
for fmt, test, depth, ts, gbps, lts in rows:
    line = "| %s | %s | %d | %s | %s | %s | %s |" % (fmt, test, depth, f(ts), f(gbps, "%.0f"), share(gbps, copy_bw),
                                                    share(gbps, read_bw))
    if llama:
        line += " %s | %s |" % (f(lts), "-" if not ts or not lts else "%.2f" % (ts / lts))
    lines.append(line)
lines += ["", "decode GB/s: weight + KV bytes one decoded token reads x decode tok/s (tern bench's bytes_per_token)."]
# pp512 of the formats whose default prefill is the int8 tiles, beside the same on f16 tensor cores.
paths = []
for fmt in formats:
    forced = load(os.path.join(logs, "bench-prefill-f16-%s.json" % fmt))
    if not forced: continue
    default = next((v for (f_, r), v in bench.items()
                    if f_ == fmt and r.split(":")[0] == "512" and r.split(":")[2] == "0"), None)
    dts, fts = default and default["prefill_tps"], forced["prefill_tps"]
    paths.append("| %s | %s | %s | %s |" % (fmt, f(dts), f(fts), "-" if not dts or not fts else "%.2f" % (fts / dts)))
if paths:
    lines += ["", "## Prefill paths (pp512, depth 0)", "",
              "| format | default (int8 tiles) tok/s | TERN_CUDA_PREFILL=f16 tok/s | f16 / default |",
              "|---|---:|---:|---:|"]
    lines += paths
md = "\n".join(lines) + "\n"
open(os.path.join(out, "summary.md"), "w").write(md)
json.dump({"env": env, "budget_s": int(budget),
           "steps": [dict(zip(("step", "status", "seconds", "note"), s)) for s in steps],
           "bandwidth": bw, "tern_bench": [{"format": k[0], "run": k[1], "data": v} for k, v in bench.items()],
           "llamacpp": llama}, open(os.path.join(out, "results.json"), "w"), indent=1)
print(md)
PY
}

# ---- the steps ------------------------------------------------------------------------------------------
describe_gpu() {
    local gpu="" driver="" memory="" nvcc_version=""
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi || true
        nvidia-smi --format=csv \
            --query-gpu=name,compute_cap,driver_version,memory.total,clocks.max.sm,clocks.max.mem || true
        gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
        driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)
        memory=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader | head -n 1)
        [ -n "$arch" ] || arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
    fi
    nvcc_bin=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    nvcc_version=$("$nvcc_bin" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')
    "$nvcc_bin" --version || true
    cmake --version | head -n 1 || true
    c++ --version | head -n 1 || true
    command -v ninja >/dev/null && echo "ninja $(ninja --version)"
    nproc; free -g || true; df -h "$work" || true
    local commit
    commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
    git diff --quiet HEAD 2>/dev/null || commit="$commit (with uncommitted changes)"
    python3 -c 'import json, sys; json.dump(dict(zip(sys.argv[2::2], sys.argv[3::2])), open(sys.argv[1], "w"))' \
        "$logs/env.json" date "$(date -u '+%Y-%m-%d %H:%M UTC')" commit "$commit" gpu "$gpu" driver "$driver" \
        memory "$memory" arch "$arch" nvcc "$nvcc_version" cpus "$(nproc)"
    STEP_NOTE="${gpu:-no GPU found}, sm_${arch:-?}"
    [[ "$arch" =~ ^[0-9]+[af]?$ ]] || { STEP_NOTE="no compute capability (no nvidia-smi?): give --arch"; return 1; }
}

have_header() { [ -f "/usr/include/$1" ] || [ -f "/usr/local/include/$1" ]; }
system_has_deps() {
    command -v pkg-config >/dev/null && pkg-config --exists libedit libpcre2-8 libxxhash 2>/dev/null &&
        have_header CLI/CLI.hpp && have_header nlohmann/json.hpp && have_header doctest/doctest.h &&
        have_header xxhash.h
}
deps() {   # TERN_GPU_DEPS=carried uses .peer/debs even where the system has the packages
    if [ "${TERN_GPU_DEPS:-auto}" != carried ] && system_has_deps; then
        STEP_NOTE="the system's packages"
        return 0
    fi
    shopt -s nullglob
    local debs=("$root"/.peer/debs/*.deb) d prefix=$work/deps
    shopt -u nullglob
    if [ ${#debs[@]} -eq 0 ]; then
        STEP_NOTE="build packages missing and no .peer/debs (run bench/gpu_check.sh --prepare and copy .peer)"
        return 1
    fi
    rm -rf "$prefix" && mkdir -p "$prefix"
    for d in "${debs[@]}"; do dpkg-deb -x "$d" "$prefix" || return 1; done
    # The .pc files name /usr: point them at the unpacked tree.
    find "$prefix" -name '*.pc' -exec sed -i "s|^prefix=/usr\$|prefix=$prefix/usr|" {} +
    local lib=$prefix/usr/lib/x86_64-linux-gnu
    export CMAKE_PREFIX_PATH=$prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
    export PKG_CONFIG_PATH=$lib/pkgconfig:$prefix/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
    export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    if ! command -v pkg-config >/dev/null; then export PKG_CONFIG=$prefix/usr/bin/pkgconf; fi
    STEP_NOTE="${#debs[@]} packages from .peer/debs unpacked in $prefix"
}

configure() {
    local gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    local generator=${gen[1]:-Unix Makefiles}   # a build dir made with another generator is started afresh
    if [ -f "$build/CMakeCache.txt" ] && ! grep -q "CMAKE_GENERATOR:INTERNAL=$generator\$" "$build/CMakeCache.txt"; then
        rm -rf "$build"
    fi
    tmo 120 cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DTERN_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES="$arch" -DTERN_CUDA_TESTS=device ${PKG_CONFIG:+-DPKG_CONFIG_EXECUTABLE="$PKG_CONFIG"}
}

build_tern() {
    local targets
    mapfile -t targets < <(cuda_suites)
    STEP_NOTE="tern + ${#targets[@]} CUDA suite(s), -j$jobs"
    tmo 420 cmake --build "$build" -j "$jobs" --target tern "${targets[@]}"
}

ctest_summary() {   # the log's "N% tests passed, ..." line and the skipped ones
    local line skipped
    line=$(grep -E 'tests passed|No tests were found' "$1" | tail -n 1)
    skipped=$(grep -c '(Skipped)' "$1" || true)
    echo "${line:-no ctest summary}${skipped:+, $skipped skipped}"
}
# The packed suites run as plain executables (the pack has no CTest files): four at a time, each under its
# own timeout, exit 77 counting as skipped as under CTest.
run_suites_direct() {   # timeout suites...
    local cap=$1 name pass=0 skipped=0 failed=() rc
    shift
    local t
    t=$(allow "$cap")
    [ "$t" -gt 0 ] || { echo "gpu_check.sh: no time left in the budget for the suites"; return 124; }
    mkdir -p "$logs/suites"
    printf '%s\n' "$@" | xargs -P 4 -I{} sh -c \
        'timeout -k 5 "$1" "$2/{}" > "$3/{}.log" 2>&1; echo $? > "$3/{}.rc"' _ "$t" "$bindir" "$logs/suites"
    for name in "$@"; do
        rc=$(cat "$logs/suites/$name.rc" 2>/dev/null || echo 1)
        echo "== $name: exit $rc"
        tail -n 4 "$logs/suites/$name.log"
        case "$rc" in
        0) pass=$((pass + 1)) ;;
        77) skipped=$((skipped + 1)) ;;
        *) failed+=("$name (exit $rc)"); sed -n '1,200p' "$logs/suites/$name.log" | grep -E 'ERROR|FAILED|error' | head -n 20 ;;
        esac
    done
    STEP_NOTE="$pass passed, ${#failed[@]} failed${failed[*]:+: ${failed[*]}}, $skipped skipped"
    [ ${#failed[@]} -eq 0 ]
}
tests() {
    local suites
    suites=$(cuda_suites | grep -vx test_cuda_backend || true)
    [ -n "$suites" ] || { STEP_NOTE="no test_cuda_* suites yet"; return 77; }
    if [ "$packed" = 1 ]; then
        local name present=()
        for name in $suites; do [ -x "$bindir/$name" ] && present+=("$name"); done
        [ ${#present[@]} -gt 0 ] || { STEP_NOTE="the pack holds no suites"; return 77; }
        run_suites_direct 180 "${present[@]}"
        [ ${#present[@]} -lt "$(wc -w <<< "$suites")" ] && STEP_NOTE="$STEP_NOTE (the pack's ${#present[@]} suites)"
        [[ "$STEP_NOTE" == *" 0 failed"* ]]
        return
    fi
    local rc=0
    tmo 180 ctest --test-dir "$build" -R '^test_cuda_' -E 'emulator|^test_cuda_backend$' --output-on-failure \
        --timeout 150 || rc=$?
    STEP_NOTE=$(ctest_summary "$logs/tests.log")
    return "$rc"
}

sanitizer_bin() {
    local c
    for c in "$(command -v compute-sanitizer || true)" /usr/local/cuda/bin/compute-sanitizer \
             /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
        [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
    done
    return 1
}
# Under memcheck the kernels run tens of times slower: the suites' quick case lists (TERN_TEST_QUICK=1, the
# ones the ASan run uses) still reach every kernel and every edge of the indexing.
memcheck_one() {   # suite
    local cs bin=$bindir/$1
    cs=$(sanitizer_bin) || { STEP_NOTE="compute-sanitizer not found"; return 1; }
    [ -x "$bin" ] || { STEP_NOTE="$1 was not built"; return 1; }
    local rc=0
    TERN_TEST_QUICK=1 tmo 90 "$cs" --tool memcheck --leak-check full --error-exitcode 86 --print-limit 30 "$bin" || rc=$?
    STEP_NOTE=$(grep -E 'ERROR SUMMARY|Status:' "$logs/memcheck-$1.log" | tr '\n' ' ')
    [ "$rc" = 86 ] && STEP_NOTE="memory errors: $STEP_NOTE"
    return "$rc"
}

backend() {
    cuda_suites | grep -x test_cuda_backend > /dev/null ||
        { STEP_NOTE="no tests/cuda/test_cuda_backend.cpp yet"; return 77; }
    if [ "$packed" = 1 ]; then
        [ -x "$bindir/test_cuda_backend" ] || { STEP_NOTE="not in the pack"; return 77; }
        # A pack with only the named files runs the whole-model suite's quick list.
        [ -f "$pack_dir/SHARED.txt" ] && export TERN_TEST_QUICK=1
        run_suites_direct 300 test_cuda_backend || { STEP_NOTE="$STEP_NOTE; TERN_SHARED=$TERN_SHARED"; return 1; }
        STEP_NOTE="$STEP_NOTE; TERN_SHARED=$TERN_SHARED"
        return 0
    fi
    local rc=0
    tmo 300 ctest --test-dir "$build" -R '^test_cuda_backend$' --output-on-failure --timeout 290 || rc=$?
    STEP_NOTE="$(ctest_summary "$logs/backend.log"); TERN_SHARED=${TERN_SHARED:-(the configured ../shared)}"
    return "$rc"
}

bandwidth() {
    tmo 90 "$nvcc_bin" -O3 -std=c++17 -arch="sm_$arch" -o "$work/cuda_copy_bandwidth" \
        "$root/bench/cuda_copy_bandwidth.cu" || return
    tmo 60 "$work/cuda_copy_bandwidth" 2 10 > "$logs/bandwidth.txt" || return
    cat "$logs/bandwidth.txt"
    tail -n 1 "$logs/bandwidth.txt" > "$logs/bandwidth.json"
    copy_gbps=$(sed -n 's/.*"copy_gbps_best": \([0-9.]*\).*/\1/p' "$logs/bandwidth.json")
    read_gbps=$(sed -n 's/.*"read_gbps_best": \([0-9.]*\).*/\1/p' "$logs/bandwidth.json")
    STEP_NOTE="copy $copy_gbps GB/s, read $read_gbps GB/s"
}

bench_one() {   # format prefill decode depth
    local f=$models/$shape-$1.gguf name=bench-$1-p$2-n$3-d$4
    [ -s "$f" ] || { STEP_NOTE="no $f"; return 1; }
    # No --peak-gbps: tern bench measures the device's copy bandwidth itself (its JSON's peak_gbps); the table
    # puts decode GB/s against bench/cuda_copy_bandwidth.cu's copy and read figures as well.
    local verify=()
    [ "$3" -gt 0 ] && verify=(--verify 8)   # decode runs also time the check of 8 drafted tokens
    tmo 150 "$tern" bench -m "$f" --device cuda -p "$2" -n "$3" -d "$4" -r "$reps" "${verify[@]}" --json \
        > "$logs/$name.json" || return
    STEP_NOTE=$(python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); parts = []
if int(sys.argv[2]) > 0: parts.append("prefill %.1f tok/s" % d["prefill_tps"])
if int(sys.argv[3]) > 0: parts.append("decode %.1f tok/s, %.0f GB/s" % (d["decode_tps"], d["decode_gbps"]))
if d.get("verify_tokens"): parts.append("verify %d: %.2fx a step" % (d["verify_tokens"], d["verify_vs_decode_step"]))
print(", ".join(parts))' "$logs/$name.json" "$2" "$3")
}

# Prefill 512 on f16 tensor cores (TERN_CUDA_PREFILL=f16) for a format whose default is the int8 tiles, for
# the summary's "Prefill paths" table beside the default's pp512: the numbers that choose the default.
bench_prefill_f16() {   # format
    local f=$models/$shape-$1.gguf
    [ -s "$f" ] || { STEP_NOTE="no $f"; return 1; }
    TERN_CUDA_PREFILL=f16 tmo 150 "$tern" bench -m "$f" --device cuda -p 512 -n 0 -d 0 -r "$reps" --json \
        > "$logs/bench-prefill-f16-$1.json" || return
    STEP_NOTE=$(python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
print("TERN_CUDA_PREFILL=%s: prefill %.1f tok/s" % (d.get("cuda_prefill"), d["prefill_tps"]))' \
        "$logs/bench-prefill-f16-$1.json")
}

# Decode with CUDA graphs off (TERN_CUDA_GRAPHS=0): each step's kernels launched one by one. The time per
# step over the graphs' is the launch overhead the graphs save.
bench_nographs() {   # format
    local f=$models/$shape-$1.gguf
    [ -s "$f" ] || { STEP_NOTE="no $f"; return 1; }
    TERN_CUDA_GRAPHS=0 tmo 150 "$tern" bench -m "$f" --device cuda -p 0 -n 128 -d 0 -r "$reps" --json \
        > "$logs/bench-nographs-$1.json" || return
    STEP_NOTE=$(python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
print("graphs off: decode %.1f tok/s, %.3f ms a step" % (d["decode_tps"], d["decode_ms_median"] / d["decode_tokens"]))' \
        "$logs/bench-nographs-$1.json")
}

# Decode with one of the backend's decode-step choices off, the rest as by default: TERN_CUDA_PDL=0 (no
# programmatic dependent launch: each kernel of the captured step starts only after the one before it has
# ended) or TERN_CUDA_GLU_Q8=0 (the down projection's int8 input quantized in a launch of its own, not by the
# gated FFN's launch). The time per step over the default run's is what that choice saves.
bench_off() {   # format variable (TERN_CUDA_PDL or TERN_CUDA_GLU_Q8)
    local f=$models/$shape-$1.gguf log=$logs/bench-$2-0-$1.json
    [ -s "$f" ] || { STEP_NOTE="no $f"; return 1; }
    tmo 150 env "$2=0" "$tern" bench -m "$f" --device cuda -p 0 -n 128 -d 0 -r "$reps" --json > "$log" || return
    STEP_NOTE=$(python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
print("%s=0: decode %.1f tok/s, %.3f ms a step" % (sys.argv[2], d["decode_tps"], d["decode_ms_median"] / d["decode_tokens"]))' \
        "$log" "$2")
}

# Decode at depth 4096 with the previous attention kernel and split rule (TERN_CUDA_ATTN=old), against the
# streaming one's bench:<format>:p0:n128:d4096 when that ran: what the decode attention change gives.
bench_oldattn() {   # format
    local f=$models/$shape-$1.gguf
    [ -s "$f" ] || { STEP_NOTE="no $f"; return 1; }
    TERN_CUDA_ATTN=old tmo 150 "$tern" bench -m "$f" --device cuda -p 0 -n 128 -d 4096 -r "$reps" --json \
        > "$logs/bench-oldattn-$1.json" || return
    STEP_NOTE=$(python3 -c 'import json, os, sys; d = json.load(open(sys.argv[1])); note = "old attention, depth 4096: decode %.1f tok/s" % d["decode_tps"]
if os.path.exists(sys.argv[2]): note += " (streaming: %.1f tok/s)" % json.load(open(sys.argv[2]))["decode_tps"]
print(note)' "$logs/bench-oldattn-$1.json" "$logs/bench-$1-p0-n128-d4096.json")
}

# Prefill 4096 with attention on the f32 kernel (TERN_CUDA_ATTN_PREFILL=f32) instead of the f16 tensor cores
# (kernels/cuda/attention_mma.h, the default): the bench step's p4096 row against this one is what they save.
bench_attn_f32() {   # format
    local f=$models/$shape-$1.gguf
    [ -s "$f" ] || { STEP_NOTE="no $f"; return 1; }
    TERN_CUDA_ATTN_PREFILL=f32 tmo 150 "$tern" bench -m "$f" --device cuda -p 4096 -n 0 -d 0 -r "$reps" --json \
        > "$logs/bench-attn-f32-$1.json" || return
    STEP_NOTE=$(python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
print("f32 prefill attention: prefill 4096 %.1f tok/s" % d["prefill_tps"])' "$logs/bench-attn-f32-$1.json")
}

# The whole model at full size, CUDA against the CPU: greedy text from the same prompt on both devices (the
# suites check small models token by token; this catches what only large shapes reach: grid limits, sizes
# past 2^31, scratch sizing). Random weights make near-ties likelier than in a trained model, so a late
# divergence is reported with the common prefix rather than hidden.
agree() {   # format
    local f=$models/$shape-$1.gguf dev
    [ -s "$f" ] || { STEP_NOTE="no $f"; return 1; }
    for dev in cuda cpu; do
        tmo 120 "$tern" run -m "$f" --device "$dev" -p "The quick brown fox jumps over the lazy dog. Once upon a time" \
            -n 24 --temp 0 --seed 1 -c 256 --no-prompt-cache --json > "$logs/agree-$1-$dev.json" || return
    done
    STEP_NOTE=$(python3 -c 'import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
ta, tb = a.get("tokens") or [], b.get("tokens") or []
ta = [t["id"] if isinstance(t, dict) else t for t in ta]; tb = [t["id"] if isinstance(t, dict) else t for t in tb]
same = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
print("cuda vs cpu greedy: %d/%d tokens equal%s" % (same, max(len(ta), len(tb)), "" if same == len(ta) == len(tb) else " (first difference at %d)" % same))
sys.exit(0 if same >= min(8, len(ta)) else 1)' "$logs/agree-$1-cuda.json" "$logs/agree-$1-cpu.json")
}

# Where the time goes: Nsight Compute's duration of every kernel of `tern bench -n 2 --verify 8 -r 1` (graphs
# off, so each launch is its own: 4 decode steps and 2 verifications of 8 tokens, told apart by the kernels'
# column count, the template argument after the format) summed per kernel, the largest first, into
# profile-<format>.md in the logs. ncu replays each kernel with cold caches, so sums run a little over the
# real times; the shares are the point.
profile() {   # format
    local f=$models/$shape-$1.gguf ncu=""
    [ -s "$f" ] || { STEP_NOTE="no $f"; return 1; }
    for ncu in "$(command -v ncu || true)" /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu; do
        [ -n "$ncu" ] && [ -x "$ncu" ] && break
    done
    [ -n "$ncu" ] && [ -x "$ncu" ] || { STEP_NOTE="ncu not found"; return 1; }
    TERN_CUDA_GRAPHS=0 tmo 150 "$ncu" --metrics gpu__time_duration.sum --csv --log-file "$logs/profile-$1.csv" \
        "$tern" bench -m "$f" --device cuda -p 0 -n 2 --verify 8 -r 1 --peak-gbps 1 > /dev/null || return
    STEP_NOTE=$(python3 - "$logs/profile-$1.csv" "$logs/profile-$1.md" <<'PY'
import csv, re, sys
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
head, body = rows[0], rows[1:]
name_i, metric_i, value_i, unit_i = (head.index(k) for k in ("Kernel Name", "Metric Name", "Metric Value", "Metric Unit"))
scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
per = {}
for r in body:
    if r[metric_i] != "gpu__time_duration.sum":
        continue
    # Without "void " and the parameter list; the template arguments (the format) stay.
    name = re.sub(r"\((?:[^()]|\([^()]*\))*\)\s*$", "", r[name_i]).strip()
    name = re.sub(r"^void ", "", name).replace("tern::cuda::", "")
    per.setdefault(name, []).append(float(r[value_i].replace(",", "")) * scale.get(r[unit_i], 1.0))
total = sum(sum(v) for v in per.values())
with open(sys.argv[2], "w") as out:
    out.write("| kernel | launches | total us | us per launch | share |\n|---|---:|---:|---:|---:|\n")
    for name, v in sorted(per.items(), key=lambda kv: -sum(kv[1])):
        out.write("| `%s` | %d | %.1f | %.2f | %.1f%% |\n" % (name[:140], len(v), sum(v), sum(v) / len(v),
                                                             100 * sum(v) / total))
top = sorted(per.items(), key=lambda kv: -sum(kv[1]))[:3]
print("%.0f us in %d kernels; top: %s" % (total, sum(len(v) for v in per.values()),
      ", ".join("%s %.0f%%" % (n.split("<")[0].split("::")[-1], 100 * sum(v) / total) for n, v in top)))
PY
)
}

llamacpp_bench() {
    local rc=0
    LOG_DIR=$logs OUT=$out LLAMA_BENCH_TIMEOUT=$(allow 150) tmo 600 bash "$root/bench/llamacpp_cuda.sh" --bench \
        --arch "$arch" --shape "$shape" --formats "$formats" -r "$reps" || rc=$?
    STEP_NOTE=$(python3 -c 'import json, sys
formats = json.load(open(sys.argv[1]))["formats"]
print(", ".join("%s %s" % (k, v["status"]) for k, v in formats.items()))' "$out/llamacpp.json")
    return "$rc"
}

# ---- the run --------------------------------------------------------------------------------------------
copy_gbps="" read_gbps="" nvcc_bin=""
[ -z "${TERN_SHARED:-}" ] && [ -d "$root/.peer/shared/models" ] && export TERN_SHARED=$root/.peer/shared
echo "gpu_check.sh: budget ${budget} s; logs in $logs; results in $out"
run_step gpu describe_gpu
[[ "$arch" =~ ^[0-9]+[af]?$ ]] || { echo "gpu_check.sh: no CUDA architecture: give --arch" >&2; exit 1; }

packed=0
if [ -f "$pack_file" ] && [ "${TERN_GPU_PACK:-use}" != ignore ]; then
    packed=1
    run_step pack unpack
    bindir=$pack_dir/bin
    tern=$bindir/tern
    [ -x "$tern" ] || { echo "gpu_check.sh: the pack holds no bin/tern" >&2; exit 1; }
    export TERN_GPU_TERN=$tern TERN=$tern TERN_SHARED=$pack_dir/shared
    export LD_LIBRARY_PATH=$pack_dir/use-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    ldconfig -p 2>/dev/null | grep 'libcublas\.so\.13 ' > /dev/null || export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/usr/local/cuda/lib64
    for d in $(cuda_lib_dirs "$bindir"/*); do export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d; done
    echo "gpu_check.sh: LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    LD_LIBRARY_PATH=$LD_LIBRARY_PATH ldd "$bindir"/* 2>/dev/null | grep 'not found' | sort -u || true
    [ -x "$bindir/llama-bench" ] && export LLAMA_BENCH_BIN=$bindir/llama-bench
    [ -f "$pack_dir/LLAMA_SOURCE.txt" ] && export LLAMA_SOURCE_NOTE=$pack_dir/LLAMA_SOURCE.txt
else
    run_step deps deps
fi
if [ "$with_llamacpp" = 1 ] && [ -z "${LLAMA_BENCH_BIN:-}" ] && { wanted llamacpp-build || wanted llamacpp; }; then
    # Compiles while tern builds and tests (nice: tern's build comes first); paused while anything is timed.
    # A later run on the same machine finds it built.
    LLAMA_BUILD_TIMEOUT=$(allow 600) bg_start llamacpp-build 600 \
        nice -n 10 bash "$root/bench/llamacpp_cuda.sh" --build \
        --arch "$arch" -j "$jobs"
fi
if [ "$packed" = 1 ]; then
    record configure prebuilt 0 "the pack's build"
    record build prebuilt 0 "$(head -n 2 "$pack_dir/PACK.txt" | tr '\n' ' ')"
else
    run_step configure configure
    run_step build build_tern
fi
if wanted synth && [ -x "$tern" ]; then
    bg_start synth 400 bash "$root/bench/gpu_check.sh" --synth-only --shape "$shape" --formats "$formats"
fi
run_step tests tests
for suite in $memcheck_suites; do
    [ -f "$root/tests/cuda/$suite.cpp" ] && run_step "memcheck:$suite" memcheck_one "$suite"
done
run_step backend backend

bg_signal llamacpp-build STOP   # nothing compiles while the GPU is timed
bg_finish synth 60
run_step bandwidth bandwidth
for fmt in $formats; do
    for r in $bench_runs; do
        IFS=: read -r p n d <<< "$r"
        run_step "bench:$fmt:p$p:n$n:d$d" bench_one "$fmt" "$p" "$n" "$d"
    done
done
for fmt in $formats; do
    case $fmt in
    f16 | f32 | bf16 | f8_e4m3) ;;   # already f16 tensor cores by default, or never
    *) run_step "bench:prefill-f16:$fmt" bench_prefill_f16 "$fmt" ;;
    esac
done
first_format=${formats%% *}
run_step "nographs:$first_format" bench_nographs "$first_format"
run_step "nopdl:$first_format" bench_off "$first_format" TERN_CUDA_PDL
run_step "noglu8:$first_format" bench_off "$first_format" TERN_CUDA_GLU_Q8
run_step "oldattn:$first_format" bench_oldattn "$first_format"
run_step "attn-f32:$first_format" bench_attn_f32 "$first_format"
run_step "agree:$first_format" agree "$first_format"
if [ "$with_llamacpp" = 1 ] && wanted llamacpp; then
    bg_finish llamacpp-build 120   # llama-bench needs about two minutes for three llama-8b files
    run_step llamacpp llamacpp_bench
else
    bg_finish llamacpp-build 0     # the rest of the budget: a later run on this machine finds it built
fi

# Last, as ncu is the slowest step and the least needed.
if [ "$with_profile" = 1 ]; then run_step "profile:$first_format" profile "$first_format"; fi

trap - EXIT
cleanup > /dev/null
echo
write_summary
awk -F'\t' '$2 == "FAILED" || $2 == "TIMEOUT" { bad = 1 } END { exit bad }' "$steps"
