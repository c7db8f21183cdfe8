#!/usr/bin/env bash
# Every model family tern runs, against llama.cpp on tiny `tern synth` files: prompt tokens and greedy ids over
# 32 tokens on 3 prompts, a first difference judged by llama.cpp's own margin there (bench/family_vs_llamacpp.py).
# Both sides run an F32 KV cache (--kv-type f16 for llama.cpp's default). The references it saves also hold
# llama.cpp's top-10 log-probabilities per step, which tests/families_reference.py compares teacher-forced.
# The peer is llama-server from bench/llamacpp_cpu_peer.sh (the llama.cpp of the llama-cpp-python sdist).
#
# Usage: bench/family_vs_llamacpp.sh [--shapes "tiny tiny-qwen2 ..."] [--types "f16 q4_k_m"] [-n N] [--out FILE]
#                                    [--flash-attn on|off|auto] [--save-reference DIR]
#   --save-reference DIR writes llama.cpp's side of every case (tests/data/families is the one the CI test
#   tests/families_reference.py checks tern against: refresh it with --types "f32 f16 q4_k_m" after a change
#   of the synth shapes or of the peer).
#   TERN: the tern binary (default build/bin/tern); LLAMA_SERVER: a llama-server binary (default: built by
#   llamacpp_cpu_bin). --out writes the table with a header naming both builds.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=""
args=()
while [ $# -gt 0 ]; do
    case "$1" in
    --out) out=$2; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$1") ;;
    esac
    shift
done
TERN=${TERN:-$here/build/bin/tern}
[ -x "$TERN" ] || { echo "family_vs_llamacpp.sh: no tern binary at $TERN (build it, or set TERN)" >&2; exit 1; }
. "$here/bench/llamacpp_cpu_peer.sh"
if [ -z "${LLAMA_SERVER:-}" ]; then
    bin=$(llamacpp_cpu_bin llama-server) || { echo "family_vs_llamacpp.sh: llama-server build failed" >&2; exit 1; }
    LLAMA_SERVER=$bin/llama-server
fi
rc=0
table=$(python3 "$here/bench/family_vs_llamacpp.py" --tern "$TERN" --llama-server "$LLAMA_SERVER" "${args[@]}") || rc=$?
if [ -n "$out" ]; then
    {
        echo "# Model families against llama.cpp on tiny synth files ($(date -u +%Y-%m-%d), tern $(git -C "$here" rev-parse --short HEAD))"
        echo
        echo "Command: \`bash bench/family_vs_llamacpp.sh ${args[*]}\`; llama-server: $LLAMA_SERVER ($("$LLAMA_SERVER" --version 2>&1 | grep -m1 -i version || echo '?'))."
        echo
        echo "$table"
    } > "$out"
fi
echo "$table"
exit "$rc"
