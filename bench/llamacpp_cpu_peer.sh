# Sourced by the CPU bench scripts: the peer, llama.cpp as the PyPI sdist of llama-cpp-python vendors it,
# built once under $LLAMA_CPP_HOME (default ~/.cache/tern/llama.cpp) with -DGGML_NATIVE=ON and reused.
# The sdist carries no git history: a tool's own build_commit (llama-bench's JSON, llama-server's /props)
# names the commit.
#
#   llamacpp_cpu_bin TARGET...   prints the bin folder holding every TARGET (llama-bench, llama-server,
#                                ...), building the missing ones first (the first build: ~25 min on 2 cores)
LLAMA_CPP_HOME=${LLAMA_CPP_HOME:-$HOME/.cache/tern/llama.cpp}

llamacpp_cpu_fetch_source() {
    local src=$LLAMA_CPP_HOME/src dl
    [ -f "$src/vendor/llama.cpp/CMakeLists.txt" ] && return 0
    mkdir -p "$LLAMA_CPP_HOME" || return 1
    dl=$(mktemp -d "${TMPDIR:-/tmp}/tern-llama-sdist.XXXXXX") || return 1
    python3 -m pip download --no-binary :all: --no-deps -d "$dl" llama-cpp-python >&2 || return 1
    rm -rf "$src" && mkdir -p "$src" && tar -xzf "$dl"/llama_cpp_python-*.tar.gz -C "$src" --strip-components=1 || return 1
    rm -rf "$dl"
}

llamacpp_cpu_bin() {
    local bin=$LLAMA_CPP_HOME/build/bin missing=() t
    for t in "$@"; do [ -x "$bin/$t" ] || missing+=("$t"); done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "building llama.cpp's ${missing[*]} in $LLAMA_CPP_HOME (the first build: about 25 min on 2 cores)" >&2
        llamacpp_cpu_fetch_source || return 1
        cmake -S "$LLAMA_CPP_HOME/src/vendor/llama.cpp" -B "$LLAMA_CPP_HOME/build" -DCMAKE_BUILD_TYPE=Release \
            -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2 || return 1
        for t in "${missing[@]}"; do
            cmake --build "$LLAMA_CPP_HOME/build" --target "$t" -j"$(nproc)" >&2 || return 1
        done
    fi
    echo "$bin"
}
