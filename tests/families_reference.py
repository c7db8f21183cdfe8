#!/usr/bin/env python3
"""Every family's tiny `tern synth` files against llama.cpp's greedy ids, recorded in tests/data/families
(bench/family_vs_llamacpp.sh --save-reference: the llama.cpp peer, its flash attention off).

Per case (shape, type, prompt): tern writes the file (the recorded seed gives the same bytes), `tern run --json`
decodes greedily, and its prompt tokens must equal llama.cpp's and its ids llama.cpp's up to the first step
where llama.cpp's own top-1/top-2 margin is below the type's noise (there the paths may part legitimately;
shared/reference/README.md). A step whose margin llama.cpp did not report (a byte token that ends
mid-character) is compared like any other. Exit 1 on a difference, with the case and step.

Usage: families_reference.py --tern BIN --data DIR
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile


def comparable_steps(margins, noise):
    for i, m in enumerate(margins):
        if m is not None and m < noise:
            return i
    return len(margins)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", required=True)
    ap.add_argument("--data", required=True)
    args = ap.parse_args()
    files = sorted(glob.glob(os.path.join(args.data, "*.json")))
    if not files:
        print("families_reference: no reference files in %s" % args.data)
        return 1
    failures, checked = [], 0
    with tempfile.TemporaryDirectory(prefix="tern-families.") as work:
        for path in files:
            ref = json.load(open(path))
            model = os.path.join(work, "%s-%s.gguf" % (ref["shape"], ref["type"]))
            synth = subprocess.run([args.tern, "synth", model, "--shape", ref["shape"], "--type", ref["type"],
                                    "--seed", str(ref["seed"]), "-t", "2"], capture_output=True, text=True)
            if synth.returncode != 0:
                failures.append("%s: tern synth: %s" % (os.path.basename(path), synth.stderr.strip()[-200:]))
                continue
            for case in ref["cases"]:
                n = len(case["tokens"])
                out = subprocess.run([args.tern, "run", "-m", model, "-p", case["prompt"], "-n", str(n), "--temp", "0",
                                      "--seed", "1", "-c", "512", "-t", "2", "--no-prompt-cache", "--json"],
                                     capture_output=True, text=True, timeout=600)
                name = "%s-%s %s" % (ref["shape"], ref["type"], json.dumps(case["prompt"]))
                if out.returncode != 0:
                    failures.append("%s: tern run exit %d: %s" % (name, out.returncode, out.stderr.strip()[-200:]))
                    continue
                got = json.loads(out.stdout)
                if got["prompt_tokens"] != case["prompt_tokens"]:
                    failures.append("%s: prompt tokens %s, llama.cpp %s" % (name, got["prompt_tokens"],
                                                                            case["prompt_tokens"]))
                    continue
                upto = comparable_steps(case["margins"], ref["noise"])
                mine = got["tokens"][:upto]
                first = next((i for i, (a, b) in enumerate(zip(mine, case["tokens"][:upto])) if a != b), None)
                if first is None and len(mine) < upto:
                    first = len(mine)
                checked += 1
                status = "ok" if first is None else "DIFFERS at step %d" % first
                print("%-40s %2d comparable steps: %s" % (name, upto, status))
                if first is not None:
                    failures.append("%s: step %d: tern %d, llama.cpp %d (llama.cpp's margin there: %s)" % (
                        name, first, got["tokens"][first] if first < len(got["tokens"]) else -1,
                        case["tokens"][first], case["margins"][first]))
    print("families_reference: %d cases, %d failures" % (checked, len(failures)))
    for f in failures:
        print("  " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
