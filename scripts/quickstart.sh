#!/usr/bin/env bash
# From a fresh clone to a first completion: installs the missing Debian packages that building
# needs, builds the tern binary alone (Release; the test executables are scripts/test.sh's), fetches
# the default model (Gemma 3 270M, Q4_K_M) and runs it once.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh --build
cmake --preset release >/dev/null
cmake --build --preset release --target tern -j "${TERN_JOBS:-2}"
model=$(bash scripts/fetch_model.sh)
./build/bin/tern info "$model"
if ./build/bin/tern run --help >/dev/null 2>&1; then
    # The default file is Gemma 3 270M's base model (no chat template): it continues text well and
    # answers chat prompts poorly, so the demo is a plain completion.
    ./build/bin/tern run -m "$model" --temp 0 -n 64 -p "${1:-The capital of France is}"
fi
