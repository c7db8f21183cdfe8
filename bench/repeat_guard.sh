#!/usr/bin/env bash
# The repetition guard on real models (issue #10's acceptance): how many greedy outputs loop
# without the guard and with it, and how often it fires when the prompt asks to copy a passage
# (it must not).
#
# 1. "open": 24 prompts (10 story openings, 8 TinyStories first sentences, 6 WikiText-2 lines),
#    `tern run --temp 0 -n 256` with --no-repeat-guard and with the guard (the default). An output
#    LOOPS when, by a criterion independent of the guard's, some 4-gram of token ids occurs at
#    least 4 times in its last 64 tokens. Also counted: how often the guard fired (stop_reason
#    "repetition") and how many tokens it cut.
# 2. "copy": 12 passages (8 TinyStories passages, 4 that repeat inside themselves: a song line,
#    "la la la ...", equal list rows, one sentence four times); prompt = passage + "\n\nRepeat the
#    text above exactly:\n\n" + its first three words, -n = the passage's tokens + 16, with and
#    without the guard. Counted: outputs that copy the passage whole, guard fires, and fires on an
#    output that copies the passage (must be 0; a model that loops instead of copying may be cut).
# Greedy output with --lookup is byte-identical to without (tests/generation/test_speculative.cpp,
# tests/generation/test_repeat_guard.cpp), so runs use --lookup 8 to save time.
#
# Usage: bench/repeat_guard.sh [MODEL.gguf ...]
#   PARTS="open copy" (default) picks the sections.
#   default models: the small ones of ../shared/models/gguf (f32) and Gemma 3 270M Q4_K_M.
# tern: $TERN, else build-guard/bin/tern, else build/bin/tern. Prints markdown on stdout;
# per-run JSON under ${OUT:-/tmp/repeat-guard-bench}.
set -u -o pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
tern=${TERN:-}
if [ -z "$tern" ]; then
    for t in "$here/build-guard/bin/tern" "$here/build/bin/tern"; do
        if [ -x "$t" ]; then tern=$t; break; fi
    done
fi
[ -x "$tern" ] || { echo "repeat_guard.sh: no tern binary (set TERN)" >&2; exit 1; }
shared="$here/../shared"
if [ $# -eq 0 ]; then
    set -- "$shared/models/gguf/stories260K-f32.gguf" "$shared/models/gguf/aidreams260K-f32.gguf" \
        "$shared/models/gguf/babyllama-tok105-f32.gguf" "$shared/models/gguf/llama2xs-tok512-f32.gguf" \
        "$HOME/.cache/tern/models/gemma-3-270m-q4_k_m.gguf"
fi
export TERN_BIN_PATH=$tern SHARED_DIR=$shared OUT_DIR=${OUT:-/tmp/repeat-guard-bench}
mkdir -p "$OUT_DIR"
exec python3 - "$@" <<'PYEOF'
import json, os, re, subprocess, sys
from collections import Counter

tern, shared, out_dir = os.environ["TERN_BIN_PATH"], os.environ["SHARED_DIR"], os.environ["OUT_DIR"]
models = sys.argv[1:]

def data_lines():
    stories = open(f"{shared}/data/tinystories/tinystories-train-head-197k.txt", encoding="utf-8").read()
    firsts = [p.split(". ")[0] + "." for p in stories.split("\n\n") if p.startswith(("Once", "One day"))]
    wiki = [l.strip() for l in open(f"{shared}/data/wikitext-2-raw/wiki.test.raw", encoding="utf-8")
            if len(l.split()) > 20 and not l.strip().startswith("=")]
    return firsts[:200:25], [" ".join(l.split()[:14]) for l in wiki[:600:100]]

OPENINGS = ["Once upon a time", "One day, a little boy named Tom", "The little dog ran", "Lily and Ben went to the park.",
            "There was a big tree", "Sam had a red ball.", "The sun was", "Mom said", "Once upon a time, there was a cat named",
            "In a small town"]
firsts, wiki = data_lines()
OPEN = OPENINGS + firsts + wiki

def passages():
    stories = open(f"{shared}/data/tinystories/cs336-tinystories_sample.txt", encoding="utf-8").read()
    stories += open(f"{shared}/data/tinystories/tinystories-train-head-197k.txt", encoding="utf-8").read()[:40000]
    paras = [p.strip() for p in stories.split("\n\n") if "\n" not in p.strip()]
    # Short ones fit the tiny models' 128 positions twice over (passage + copy); longer ones test
    # the larger model.
    plain = [p for p in paras if 60 < len(p) < 110][:4] + [p for p in paras if 110 <= len(p) < 220][:4]
    repeating = [
        "Row, row, row your boat, gently down the stream. Row, row, row your boat, gently down the stream.",
        "The bird sang: la la la la la la la la la la la la la la la la la la. Then it flew home.",
        "Shopping list:\n- apple\n- apple\n- apple\n- apple\n- apple\n- apple\n- apple\n- apple\n- bread",
        "Tom has a red ball. Tom has a red ball. Tom has a red ball. Tom has a red ball.",
    ]
    return plain + repeating

def context_of(model):
    """The context tern gives the model (-c unset), from `tern info`."""
    p = subprocess.run([tern, "info", model], capture_output=True, text=True)
    m = re.search(r"context length:\s*([0-9]+)", p.stdout)
    return int(m.group(1)) if m else 1 << 30

# The on-disk prompt cache (where the binary has one) would only add noise: keep it out.
NO_CACHE = ["--no-prompt-cache"] if "--no-prompt-cache" in subprocess.run(
    [tern, "run", "--help"], capture_output=True, text=True).stdout else []

NO_SHIFT = ["--no-context-shift"] if "--no-context-shift" in subprocess.run(
    [tern, "run", "--help"], capture_output=True, text=True).stdout else []
CTX = {os.path.basename(m): context_of(m) for m in models}

def run(model, prompt, n, guard, tag, extra=()):
    args = [tern, "run", "-m", model, "-p", prompt, "--no-escape", "--temp", "0", "-n", str(n), "--json",
            "--lookup", "8"] + NO_CACHE + list(extra)
    if not guard:
        args.append("--no-repeat-guard")
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"repeat_guard.sh: tern failed ({p.returncode}): {' '.join(args)}\n{p.stderr}")
    j = json.loads(p.stdout)
    j["stderr"] = p.stderr
    with open(f"{out_dir}/{os.path.basename(model)}-{tag}-{'guard' if guard else 'off'}.json", "w") as f:
        json.dump(j, f)
    return j

def loops(tokens):
    """Independent criterion: a 4-gram of token ids occurring >= 4 times in the last 64 tokens."""
    tail = tokens[-64:]
    grams = Counter(tuple(tail[i:i + 4]) for i in range(len(tail) - 3))
    return bool(grams) and max(grams.values()) >= 4

def loops_words(text):
    """The same in words, for small vocabularies whose tokens are a few letters: a 4-gram of
    words occurring >= 3 times in the last 40 words."""
    tail = text.split()[-40:]
    grams = Counter(tuple(tail[i:i + 4]) for i in range(len(tail) - 3))
    return bool(grams) and max(grams.values()) >= 3

def n_tokens(model, text):
    """Tokens of `text` alone, or None when it does not fit the model's context."""
    p = subprocess.run([tern, "run", "-m", model, "-p", text, "--no-escape", "-n", "0", "--json", "--no-bos"] + NO_CACHE,
                       capture_output=True, text=True)
    return json.loads(p.stdout)["n_prompt"] if p.returncode == 0 else None

PARTS = os.environ.get("PARTS", "open copy").split()
print(f"tern: {tern}\n")
open_details = []

def open_section():
    print(f"## open: {len(OPEN)} prompts, `tern run --temp 0 -n 256`\n")
    print("Loops counted by two criteria independent of the guard: tokens (a 4-gram of ids >= 4 times in the last 64 "
          "tokens) / words (a 4-gram of words >= 3 times in the last 40 words).\n")
    print("| model | loop without guard (tokens / words) | loop with guard (tokens / words) | guard fired | unguarded tokens dropped (mean) "
          "| guarded tokens = a prefix of the unguarded |")
    print("|---|---|---|---|---|---|")
    for model in models:
        name = os.path.basename(model)
        off_loops = on_loops = off_wloops = on_wloops = fired = cut = prefix_ok = 0
        for i, prompt in enumerate(OPEN):
            off = run(model, prompt, 256, False, f"open{i}")
            on = run(model, prompt, 256, True, f"open{i}")
            off_loops += loops(off["tokens"])
            on_loops += loops(on["tokens"])
            off_wloops += loops_words(off["text"])
            on_wloops += loops_words(on["text"])
            if on["stop_reason"] == "repetition":
                fired += 1
                cut += len(off["tokens"]) - len(on["tokens"])
            prefix_ok += off["tokens"][:len(on["tokens"])] == on["tokens"]
            open_details.append((name, i, loops(off["tokens"]) or loops_words(off["text"]), on["stop_reason"],
                                 re.findall(r"span \d+ x \d+", on["stderr"]), loops(on["tokens"]) or loops_words(on["text"])))
        mean_cut = f"{cut / fired:.0f}" if fired else "-"
        print(f"| {name} | {off_loops} / {off_wloops} of {len(OPEN)} | {on_loops} / {on_wloops} of {len(OPEN)} | "
              f"{fired}/{len(OPEN)} | {mean_cut} | "
              f"{prefix_ok}/{len(OPEN)} |")


def copy_section():
    PASSAGES = passages()
    INSTR = "\n\nRepeat the text above exactly:\n\n"
    print(f"\n## copy: {len(PASSAGES)} passages (the last 4 repeat inside themselves), prompt = passage + "
          f"\"Repeat the text above exactly:\" + its first 3 words, -n = passage tokens + 16\n")
    print("Passages whose prompt + output do not fit a model's context are skipped (the tiny models have 128 "
          "positions; a context shift would drop part of the passage).\n")
    print("| model | passages run | copied whole (unguarded) | guard fired | fired on a whole copy (must be 0) |")
    print("|---|---|---|---|---|")
    for model in models:
        name = os.path.basename(model)
        ran = copied = fired = fired_on_copy = 0
        # COPY_ORDER="8 9 10 11": only these passages, in this order.
        order = [int(x) for x in os.environ.get("COPY_ORDER", "").split()] or range(len(PASSAGES))
        for i in order:
            passage = PASSAGES[i]
            start = " ".join(passage.split(" ")[:3])
            rest = passage[len(start):]
            prompt = passage + INSTR + start
            n_passage, n_prompt = n_tokens(model, passage), n_tokens(model, prompt)
            if n_passage is None or n_prompt is None:
                continue
            n = n_passage + 16
            if n_prompt + 1 + n > CTX.get(name, 1 << 30):
                continue
            on = run(model, prompt, n, True, f"copy{i}", NO_SHIFT)
            off = run(model, prompt, n, False, f"copy{i}", NO_SHIFT) if on["stop_reason"] == "repetition" else on
            ran += 1
            is_copy = off["text"].startswith(rest)
            copied += is_copy
            if on["stop_reason"] == "repetition":
                fired += 1
                fired_on_copy += is_copy
                print(f"<!-- {name} copy{i} ({'a whole copy' if is_copy else 'no copy'}): "
                      f"{on['stderr'].strip().splitlines()[0]}; unguarded: {json.dumps(off['text'][:160])} -->")
        print(f"| {name} | {ran}/{len(PASSAGES)} | {copied}/{ran} | {fired}/{ran} | {fired_on_copy} |")


if "open" in PARTS:
    open_section()
if "copy" in PARTS:
    copy_section()
if open_details:
    print("\n<details><summary>open: per prompt (model, prompt #, loops without guard, stop with guard, span, "
          "loops with guard)</summary>\n")
    for d in open_details:
        print(f"- {d[0]} #{d[1]}: loops={'yes' if d[2] else 'no'} stop={d[3]} {' '.join(d[4])} "
              f"guarded-loops={'yes' if d[5] else 'no'}")
    print("\n</details>")
PYEOF
