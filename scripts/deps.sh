#!/usr/bin/env bash
# Installs the Debian packages tern needs to build and test, only those missing (run as root on
# Debian/Ubuntu; elsewhere it says what to install). Safe to run again.
#   bash scripts/deps.sh          everything scripts/test.sh needs (fuzzing, the aarch64 cross build, qemu)
#   bash scripts/deps.sh --build  only what building tern needs (scripts/quickstart.sh)
set -euo pipefail

packages=(build-essential cmake pkg-config git python3 unzip
          libcli11-dev libxxhash-dev doctest-dev libpcre2-dev nlohmann-json3-dev libedit-dev)
case "${1:-}" in
    --build) ;;
    "") packages+=(clang libclang-rt-dev libomp-dev      # scripts/fuzz.sh (libFuzzer)
                   python3-venv                          # tests/serve (the openai client in a venv)
                   g++-aarch64-linux-gnu qemu-user) ;;  # scripts/test_neon.sh (NEON kernels under qemu)
    *) echo "deps: unknown argument '$1' (none, or --build)" >&2; exit 1 ;;
esac

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null; then
    echo "deps: missing packages: ${missing[*]} (install them with your package manager)" >&2
    exit 1
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "deps: installing ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
