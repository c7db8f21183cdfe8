#!/usr/bin/env bash
# llama.cpp's CUDA backend on the same GGUF files bench/gpu_check.sh gives `tern bench`: builds llama-bench
# with GGML_CUDA=ON for this GPU's architecture from a source copy carried in the working tree, then runs
# it with -ngl 99 -p 512,4096 -n 128 -d 0,4096 on each file, writing llamacpp.json and llamacpp.md to $OUT.
# bench/gpu_check.sh --with-llamacpp runs it in the same run (build in the background, bench after tern's).
#
# Usage: bench/llamacpp_cuda.sh [MODE] [--arch SM] [--shape S] [--formats "..."] [-r N] [-j N]
#   MODE         --prepare    (here, with network) put llama.cpp's source at .peer/llama.cpp (git-ignored):
#                             the llama.cpp that the PyPI sdist of llama-cpp-python vendors
#                             (LLAMA_CPP_PYTHON_VERSION, default 0.3.36), without its models, docs, web UI
#                             and the ggml backends other than CPU and CUDA, so that it travels (~30 MB)
#                --configure  only configure the CUDA build (a check that the copy is complete; no GPU needed)
#                --build      configure and build the llama-bench target (no GPU needed, only nvcc)
#                --bench      run llama-bench (the build must exist)
#                (none)       --build then --bench
#   --arch SM    CUDA architecture, e.g. 90 (default: the GPU's compute capability from nvidia-smi)
#   --shape S    synthetic model shape (default llama-8b); --formats: default "q4_k_m q8_0 f16 f8_e4m3"
#                (f8_e4m3 is tern's own type, which llama.cpp cannot read: listed as not run)
#   -r N         llama-bench repetitions (default 3); -j N: build jobs (default: the CPUs online)
#
# Files: the models are $MODELS/<shape>-<format>.gguf (default MODELS=$TERN_GPU_WORK/models), as
# bench/gpu_check.sh writes them with `tern synth`; a missing one is written here when a tern binary is at
# $TERN (default $TERN_GPU_WORK/tern/bin/tern). TERN_GPU_WORK defaults to build-gpu/ in the repository.
# The build goes to $TERN_GPU_WORK/llama.cpp (reused by a later run on the same machine); the source stays at
# $LLAMA_CPP_SRC (default .peer/llama.cpp). Output: $OUT (default ./gpu_check_out): llamacpp.json (every
# llama-bench entry per format), llamacpp.md (a table); logs go to $LOG_DIR when set (gpu_check.sh sets it),
# else into $OUT/llamacpp_logs.tar.gz. Time limits: LLAMA_BUILD_TIMEOUT (default 480 s) for the build,
# LLAMA_BENCH_TIMEOUT (default 150 s) per file. LLAMA_BENCH_BIN names a llama-bench built elsewhere (bench/gpu_check.sh's
# pack), LLAMA_SOURCE_NOTE the file saying which source it was built from.
#
# The GPU machine needs no network: copy .peer/llama.cpp there with the working tree.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
mode=all
arch=""
shape=llama-8b
formats="q4_k_m q8_0 f16 f8_e4m3"
reps=3
jobs=$(nproc 2>/dev/null || echo 2)
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
    --prepare) mode=prepare ;;
    --configure) mode=configure ;;
    --build) mode=build ;;
    --bench) mode=bench ;;
    --arch) arch=$2; shift ;;
    --shape) shape=$2; shift ;;
    --formats) formats=$2; shift ;;
    -r) reps=$2; shift ;;
    -j) jobs=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "llamacpp_cuda.sh: unknown argument '$1' (see --help)" >&2; exit 1 ;;
    esac
    shift
done

src=${LLAMA_CPP_SRC:-$root/.peer/llama.cpp}
work=${TERN_GPU_WORK:-$root/build-gpu}
build=$work/llama.cpp
models=${MODELS:-$work/models}
out=${OUT:-$root/gpu_check_out}
tern=${TERN:-$work/tern/bin/tern}
say() { echo "llamacpp_cuda.sh: $*" >&2; }

# ---- --prepare: the source copy (run where PyPI is reachable) -------------------------------------------
prepare() {
    local version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36} tmp
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/tern-llama-sdist.XXXXXX")
    # shellcheck disable=SC2064  # expand now: tmp is local
    trap "rm -rf '$tmp'" RETURN
    say "downloading the llama-cpp-python $version sdist (its vendor/llama.cpp is the source)"
    python3 -m pip download -q "llama-cpp-python==$version" --no-binary :all: --no-deps -d "$tmp" >&2
    tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
    local vendored=$tmp/llama_cpp_python-$version/vendor/llama.cpp
    [ -f "$vendored/CMakeLists.txt" ] || { say "no vendor/llama.cpp in the sdist"; return 1; }
    # What the CUDA llama-bench build never reads: model vocabularies, docs, the web UI, Python, CI, tests,
    # examples, and every ggml backend but CPU and CUDA (ggml adds a backend's folder only when enabled).
    local d
    for d in models docs media gguf-py .github .devops .gemini .pi benches conversion tests examples \
             tools/ui tools/server/public tools/server/webui; do
        rm -rf "${vendored:?}/$d"
    done
    for d in "$vendored"/ggml/src/ggml-*/; do
        case "$(basename "$d")" in ggml-cpu|ggml-cuda|ggml-blas|ggml-rpc) ;; *) rm -rf "$d" ;; esac
    done
    rm -f "$vendored/.git"   # a gitlink to the sdist's parent repository, which is not there
    echo "llama-cpp-python $version (PyPI sdist, vendor/llama.cpp)" > "$vendored/TERN_SOURCE.txt"
    rm -rf "$src"
    mkdir -p "$(dirname "$src")"
    mv "$vendored" "$src"
    say "llama.cpp source at $src ($(du -sh "$src" | cut -f1)); it is git-ignored: copy it to the GPU machine" \
        "with the working tree"
}

# ---- --configure / --build ------------------------------------------------------------------------------
detect_arch() {
    [ -n "$arch" ] && return 0
    command -v nvidia-smi >/dev/null || { say "no nvidia-smi: give --arch"; return 1; }
    arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
    [[ "$arch" =~ ^[0-9]+$ ]] || { say "could not read the compute capability from nvidia-smi ('$arch')"; return 1; }
}

configure() {
    if [ ! -f "$src/CMakeLists.txt" ]; then
        say "no llama.cpp source at $src: run bench/llamacpp_cuda.sh --prepare where there is network," \
            "and copy .peer/llama.cpp here"
        return 1
    fi
    detect_arch
    local gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    if [ -f "$build/CMakeCache.txt" ] && ! grep -q "^CMAKE_CUDA_ARCHITECTURES:STRING=$arch\$" "$build/CMakeCache.txt"
    then
        rm -rf "$build"   # built for another architecture
    fi
    [ -x /usr/local/cuda/bin/nvcc ] && [ -z "${CUDACXX:-}" ] && export CUDACXX=/usr/local/cuda/bin/nvcc
    say "configuring llama.cpp (GGML_CUDA=ON, sm_$arch) in $build"
    # The copy has no git history; without a ceiling, llama.cpp's build info would name tern's commit.
    GIT_CEILING_DIRECTORIES=$(dirname "$src") cmake -S "$src" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TOOLS=ON >&2
}

build_bench() {
    configure
    say "building llama-bench with -j$jobs (timeout ${LLAMA_BUILD_TIMEOUT:-480} s)"
    GIT_CEILING_DIRECTORIES=$(dirname "$src") timeout -k 10 "${LLAMA_BUILD_TIMEOUT:-480}" \
        cmake --build "$build" --target llama-bench -j "$jobs" >&2
    [ -x "$build/bin/llama-bench" ] || { say "no $build/bin/llama-bench after the build"; return 1; }
}

# ---- --bench --------------------------------------------------------------------------------------------
run_bench() {
    local bin=${LLAMA_BENCH_BIN:-$build/bin/llama-bench} logs tmp_logs=""
    [ -x "$bin" ] || { say "no $bin: build first (bench/llamacpp_cuda.sh --build)"; return 1; }
    mkdir -p "$out"
    if [ -n "${LOG_DIR:-}" ]; then
        logs=$LOG_DIR
    else
        tmp_logs=$(mktemp -d "${TMPDIR:-/tmp}/tern-llamacpp-logs.XXXXXX")
        logs=$tmp_logs
    fi
    mkdir -p "$logs" "$models"
    local status=0 fmt f
    for fmt in $formats; do
        f=$models/$shape-$fmt.gguf
        if [ "$fmt" = f8_e4m3 ]; then
            echo "{\"format\": \"$fmt\", \"status\": \"not run: F8_E4M3 is tern's own GGUF type (id 1000)\"}" \
                > "$logs/llama-bench-$fmt.status.json"
            say "$fmt: not run (tern's own type; llama.cpp cannot read it)"
            continue
        fi
        if [ ! -s "$f" ]; then
            if [ -x "$tern" ]; then
                say "writing $f with tern synth"
                if ! "$tern" synth "$f" --shape "$shape" --type "$fmt" > "$logs/synth-$fmt.log" 2>&1; then
                    status=1
                    continue
                fi
            else
                say "$f: missing (and no tern binary at $tern to write it)"
                status=1
                continue
            fi
        fi
        say "llama-bench $(basename "$f") -ngl 99 -p 512,4096 -n 128 -d 0,4096 -r $reps"
        if timeout -k 10 "${LLAMA_BENCH_TIMEOUT:-150}" "$bin" -m "$f" -ngl 99 -p 512,4096 -n 128 -d 0,4096 -r "$reps" \
                -o json > "$logs/llama-bench-$fmt.json" 2> "$logs/llama-bench-$fmt.err"; then
            :
        else
            local rc=$?
            say "llama-bench failed on $fmt (exit $rc): $(tail -n 3 "$logs/llama-bench-$fmt.err" | tr '\n' ' ')"
            echo "{\"format\": \"$fmt\", \"status\": \"failed: exit $rc\"}" > "$logs/llama-bench-$fmt.status.json"
            status=1
        fi
    done
    python3 - "$logs" "$out" "$shape" "$formats" "$src" "${LLAMA_SOURCE_NOTE:-$src/TERN_SOURCE.txt}" <<'PY' || status=1
import json, os, statistics, sys
logs, out, shape, formats, src = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(), sys.argv[5]
source_note = sys.argv[6]
source = open(source_note).read().strip() if os.path.exists(source_note) else src
result = {"source": source, "shape": shape, "formats": {}}
rows = []
for fmt in formats:
    path = os.path.join(logs, "llama-bench-%s.json" % fmt)
    status_path = os.path.join(logs, "llama-bench-%s.status.json" % fmt)
    entries = []
    if os.path.exists(path) and os.path.getsize(path) > 0:
        try:
            entries = json.load(open(path))
        except ValueError:
            entries = []
    if os.path.exists(status_path):
        status = json.load(open(status_path))["status"]
    else:
        status = "ok" if entries else "no output"
    result["formats"][fmt] = {"status": status, "entries": entries}
    for e in entries:
        test = ("pp%d" % e["n_prompt"]) if e["n_gen"] == 0 else ("tg%d" % e["n_gen"])
        ts = e.get("samples_ts") or [e.get("avg_ts", float("nan"))]
        rows.append((fmt, test, e.get("n_depth", 0), statistics.median(ts), e.get("stddev_ts", 0.0)))
    if not entries:
        rows.append((fmt, "-", "-", None, None))
    if entries:
        result.setdefault("build_commit", entries[0].get("build_commit"))
        result.setdefault("gpu_info", entries[0].get("gpu_info"))
json.dump(result, open(os.path.join(out, "llamacpp.json"), "w"), indent=1)
with open(os.path.join(out, "llamacpp.md"), "w") as f:
    f.write("# llama-bench (llama.cpp CUDA) on %s\n\n" % shape)
    f.write("- llama.cpp: %s, build %s\n- GPU: %s\n" % (source, result.get("build_commit"), result.get("gpu_info")))
    f.write("- flags: -ngl 99 -p 512,4096 -n 128 -d 0,4096 (median of the samples)\n\n")
    f.write("| format | test | depth | tok/s | stddev |\n|---|---|---:|---:|---:|\n")
    for fmt, test, depth, ts, sd in rows:
        if ts is None:
            f.write("| %s | %s | - | - | - |\n" % (fmt, result["formats"][fmt]["status"]))
        else:
            f.write("| %s | %s | %s | %.2f | %.2f |\n" % (fmt, test, depth, ts, sd))
print(open(os.path.join(out, "llamacpp.md")).read())
PY
    if [ -n "$tmp_logs" ]; then
        tar -czf "$out/llamacpp_logs.tar.gz" -C "$tmp_logs" . && rm -rf "$tmp_logs"
    fi
    return "$status"
}

case "$mode" in
prepare) prepare ;;
configure) configure ;;
build) build_bench ;;
bench) run_bench ;;
all) build_bench && run_bench ;;
esac
