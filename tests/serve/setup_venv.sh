#!/usr/bin/env bash
# The Python environment of tests/serve: a venv at VENV_DIR (under the build directory) with the
# official openai client from PyPI, pinned so a new release cannot change what the test checks.
# Safe to run again: an environment that already has the pinned version is left as it is.
#   bash tests/serve/setup_venv.sh BUILD_DIR/tests/serve-venv
set -euo pipefail
venv="${1:?usage: setup_venv.sh VENV_DIR}"
pin="openai==3.57.0"

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import openai, sys; sys.exit(openai.__version__ != '${pin#openai==}')" 2>/dev/null; then
    exit 0
fi
if ! python3 -m venv --help >/dev/null 2>&1; then
    echo "setup_venv: python3's venv module is missing (apt-get install python3-venv, or bash scripts/deps.sh)" >&2
    exit 1
fi
rm -rf "$venv"
python3 -m venv "$venv"
if ! "$venv/bin/pip" install --quiet --disable-pip-version-check "$pin"; then
    echo "setup_venv: could not install $pin from PyPI into $venv (no network? the serve test needs it;" \
         "ctest -E serve skips it)" >&2
    exit 1
fi
echo "setup_venv: $pin installed in $venv" >&2
