#!/usr/bin/env bash
# Compiles every kernels/cuda/*.cu with nvcc for each CUDA architecture tern ships (75 86 89 90 120 by
# default: Turing, Ampere, Ada, Hopper, Blackwell) and prints, per architecture, each kernel's registers,
# stack frame and spill bytes from ptxas (-Xptxas -v). Needs the CUDA toolkit, not a GPU.
#
# Usage: scripts/cuda_arch_check.sh [--arch "75 86 89 90 120"] [-j N] [--brief] [--keep DIR] [FILE.cu ...]
#   --arch LIST  the architectures (compute capability without the dot; spaces or ';' between them)
#   --brief      list only the functions that spill or have a stack frame (and each table's kernel count)
#   -j N         compiles at a time (default: the CPUs online); one nvcc per (file, architecture)
#   --keep DIR   also keep each compile's full nvcc/ptxas output in DIR/sm_<arch>/<file>.log
#   FILE.cu      the sources to check (default: every kernels/cuda/*.cu)
# Exit status: 0 when everything compiled without spills; 1 when a compile failed; 2 when it compiled but
# some kernel or device function spills registers (spill stores or loads > 0). A stack frame without
# spills (a local array indexed at run time) is shown in the table and counted at the end, but passes.
#
# The flags are the CMake build's (cmake/TernCuda.cmake and build/kernels/CMakeFiles/tern_kernels_cuda.dir/
# flags.make): -forward-unknown-to-host-compiler -DTERN_HAVE_CUDA=1 -I<repo root> -isystem=<cuda>/include
# --expt-relaxed-constexpr -O3 -DNDEBUG -Wall -Wextra -std=c++20, with machine code (SASS) for one
# architecture per compile. NVCC picks the compiler (default /usr/local/cuda/bin/nvcc, else nvcc on PATH).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
archs="75 86 89 90 120"
jobs=$(nproc 2>/dev/null || echo 2)
keep=""
brief=0
files=()
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
    --arch) archs=${2//;/ }; shift ;;
    -j) jobs=$2; shift ;;
    -j*) jobs=${1#-j} ;;
    --keep) keep=$2; shift ;;
    --brief) brief=1 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "cuda_arch_check.sh: unknown option '$1' (see --help)" >&2; exit 1 ;;
    *) files+=("$(realpath "$1")") ;;
    esac
    shift
done
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "cuda_arch_check.sh: -j needs a positive number" >&2; exit 1; }
for a in $archs; do
    [[ "$a" =~ ^[0-9]+[af]?$ ]] || { echo "cuda_arch_check.sh: bad architecture '$a' (e.g. 89, 90a)" >&2; exit 1; }
done
if [ ${#files[@]} -eq 0 ]; then
    shopt -s nullglob
    files=("$root"/kernels/cuda/*.cu)
    shopt -u nullglob
fi
[ ${#files[@]} -gt 0 ] || { echo "cuda_arch_check.sh: no kernels/cuda/*.cu to compile" >&2; exit 1; }

nvcc=${NVCC:-}
if [ -z "$nvcc" ]; then
    if [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc; else nvcc=$(command -v nvcc || true); fi
fi
if [ -z "$nvcc" ] || [ ! -x "$nvcc" ]; then
    echo "cuda_arch_check.sh: nvcc not found (install the CUDA toolkit or set NVCC)" >&2
    exit 1
fi
cuda_include=$(cd "$(dirname "$nvcc")/.." && pwd)/include
demangle="cat"   # c++filt (binutils) when there is one
if command -v c++filt >/dev/null; then demangle="c++filt"; fi

work=$(mktemp -d "${TMPDIR:-/tmp}/tern-arch-check.XXXXXX")
trap 'rm -rf "$work"' EXIT

# One compile: its whole output in $work/sm_<arch>/<name>.log and its exit status in <name>.rc.
compile_one() {
    local arch=$1 src=$2 dir=$work/sm_$1 name
    name=$(basename "$src" .cu)
    local rc=0
    ( cd "$root" && "$nvcc" -forward-unknown-to-host-compiler -DTERN_HAVE_CUDA=1 -I"$root" -isystem="$cuda_include" \
        --expt-relaxed-constexpr -O3 -DNDEBUG -Wall -Wextra -std=c++20 \
        -gencode "arch=compute_${arch},code=sm_${arch}" -Xptxas -v -x cu -c "$src" -o "$dir/$name.o" ) \
        > "$dir/$name.log" 2>&1 || rc=$?
    echo "$rc" > "$dir/$name.rc"
    rm -f "$dir/$name.o"
}

start=$SECONDS
nvcc_version=$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
echo "cuda_arch_check.sh: ${#files[@]} file(s) x archs [$archs] with nvcc $nvcc_version, $jobs at a time" >&2
for arch in $archs; do mkdir -p "$work/sm_$arch"; done
# Every (file, arch) compile is independent: keep `jobs` of them running.
for src in "${files[@]}"; do
    for arch in $archs; do
        while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
        compile_one "$arch" "$src" &
    done
done
wait

# ptxas -v prints, per function: "Function properties for NAME" then "N bytes stack frame, N bytes spill
# stores, N bytes spill loads"; for kernels (entries) also "Used N registers". One row per function:
# mangled name, registers (- for device functions), stack, spill stores, spill loads.
parse_log() {
    awk '
        /Function properties for/ { cur = $NF; if (!(cur in seen)) { seen[cur] = 1; order[++n] = cur } }
        /bytes stack frame/ { stack[cur] = $1; st[cur] = $5; ld[cur] = $9 }
        /Used [0-9]+ registers/ { for (i = 1; i <= NF; ++i) if ($i == "Used") regs[cur] = $(i + 1) }
        END { for (i = 1; i <= n; ++i) { f = order[i]
                  printf "%s\t%s\t%d\t%d\t%d\n", f, (f in regs) ? regs[f] : "-", stack[f], st[f], ld[f] } }
    ' "$1"
}
# Readable names: demangled, without the return type, tern::cuda::dev::, the anonymous namespace, the
# translation unit tags and the parameter list.
shorten() {
    "$demangle" | awk -F'\t' -v OFS='\t' '{
        n = $1
        sub(/^void /, "", n)
        gsub(/_INTERNAL_[0-9a-zA-Z_]*::/, "", n); gsub(/_GLOBAL__N__[0-9a-zA-Z_]*::/, "", n)
        gsub(/tern::cuda::(dev|emu)::/, "", n); gsub(/\(anonymous namespace\)::/, "", n)
        if (substr(n, length(n)) == ")") {   # cut the outermost trailing (...) group
            depth = 0
            for (i = length(n); i > 0; --i) {
                c = substr(n, i, 1)
                if (c == ")") ++depth
                else if (c == "(" && --depth == 0) { n = substr(n, 1, i - 1); break }
            }
        }
        $1 = n; print
    }'
}

failed=0 spilled=0 stacked=0 warned=0
for arch in $archs; do
    rows=$work/sm_$arch.rows
    : > "$rows"
    for src in "${files[@]}"; do
        name=$(basename "$src" .cu)
        log=$work/sm_$arch/$name.log
        if [ "$(cat "$work/sm_$arch/$name.rc")" != 0 ]; then
            failed=$((failed + 1))
            echo "cuda_arch_check.sh: FAILED: ${src#"$root"/} for sm_$arch:" >&2
            grep -v '^ptxas info' "$log" | tail -n 20 >&2
            continue
        fi
        if grep -qi 'warning' "$log"; then
            warned=$((warned + 1))
            echo "cuda_arch_check.sh: warnings in ${src#"$root"/} for sm_$arch:" >&2
            grep -i 'warning' "$log" | sort -u | head -n 10 | "$demangle" >&2
        fi
        parse_log "$log" | shorten |
            awk -F'\t' -v OFS='\t' -v file="$name.cu" '{ print $1, file, $2, $3, $4, $5 }' >> "$rows"
    done
    echo
    echo "== sm_$arch"
    if [ ! -s "$rows" ]; then
        echo "(no kernels)"
        continue
    fi
    awk -F'\t' -v brief="$brief" '
        { r[NR] = $0; if (length($1) > w) w = length($1); if (length($2) > fw) fw = length($2) }
        END {
            if (w < 6) w = 6; if (fw < 4) fw = 4
            printf "%-" w "s  %-" fw "s  %5s  %6s  %11s  %10s\n",
                   "kernel", "file", "regs", "stack", "spill store", "spill load"
            for (i = 1; i <= NR; ++i) { split(r[i], c, "\t")
                flag = (c[5] > 0 || c[6] > 0) ? "  SPILLS" : (c[4] > 0 ? "  (stack)" : "")
                if (brief && flag == "") continue
                printf "%-" w "s  %-" fw "s  %5s  %6d  %11d  %10d%s\n", c[1], c[2], c[3], c[4], c[5], c[6], flag }
            if (brief) printf "(%d functions; the others have no stack frame and no spills)\n", NR
        }' "$rows"
    spilled=$((spilled + $(awk -F'\t' '$5 > 0 || $6 > 0' "$rows" | wc -l)))
    stacked=$((stacked + $(awk -F'\t' '$4 > 0 && $5 == 0 && $6 == 0' "$rows" | wc -l)))
done

if [ -n "$keep" ]; then
    mkdir -p "$keep"
    for arch in $archs; do mkdir -p "$keep/sm_$arch" && cp "$work/sm_$arch"/*.log "$keep/sm_$arch/"; done
fi
echo
echo "cuda_arch_check.sh: $(( ${#files[@]} * $(wc -w <<< "$archs") )) compile(s) in $((SECONDS - start)) s:" \
     "$failed failed, $spilled function(s) spill, $stacked with a stack frame but no spills, $warned with warnings"
[ "$failed" = 0 ] || exit 1
[ "$spilled" = 0 ] || exit 2
