#!/usr/bin/env python3
"""Every family's tiny `tern synth` files against llama.cpp's greedy ids and log-probabilities, recorded in
tests/data/families (bench/family_vs_llamacpp.sh --save-reference: the llama.cpp peer, its flash attention off).

Per case (shape, type, prompt): tern writes the file (the recorded seed gives the same bytes), `tern run --json`
decodes greedily (with the KV cache format the reference was recorded with, "kv_type", f16 where the file does
not say), and
  - its prompt tokens must equal llama.cpp's and its ids llama.cpp's up to the first step where llama.cpp's own
    top-1/top-2 margin is below the type's noise (there the paths may part legitimately;
    shared/reference/README.md). A step whose margin llama.cpp did not report is compared like any other.
  - where the file records llama.cpp's most likely tokens per step ("top": [[id, log-probability], ...]), tern's
    log-probabilities (`--logprobs`) of those tokens must be within the type's tolerance of llama.cpp's at every
    step of the common greedy prefix (up to and including the first step whose ids differ: until then both
    condition on the same tokens, so the comparison is teacher-forced). A token of llama.cpp's list that tern does
    not list among its own most likely must be unlikely to tern too: llama.cpp's value at most tern's least listed
    one plus the tolerance. Files without "top" are checked on their ids only.
Prints each file's largest |difference|; exit 1 on a difference, with the case and step.

Usage: families_reference.py --tern BIN --data DIR
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile


# Largest |tern - llama.cpp| log-probability accepted per file type, from shared/reference/README.md "How to read
# tolerances": F32 files with an F32 KV cache within about 1e-3 of llama.cpp; F16 files 0.01-0.05 (llama.cpp
# rounds the activations to F16 before F16 matmuls), BF16 about 0.2; quantized files 1.0: tern quantizes the
# activations before a quantized dot product as ggml does, so only a different accumulation order separates them,
# up to 0.8 for llama.cpp against itself (column (b)); exact dequantization would need column (c)'s 1.3. With an
# F16 KV cache an F32 file gets column (a)'s 0.06.
TOLERANCE = {"f32": 1e-3, "f16": 0.05, "bf16": 0.2}
TOLERANCE_QUANTIZED = 1.0
TOLERANCE_F32_KV_F16 = 0.06
# llama.cpp's CPU GELU reads an F16 table (its input and output rounded to F16) where tern computes it in f32: an
# F32 file of a GELU family differs by about 1.3e-3 (tiny-gemma2/3), so it gets 5e-3. The architectures whose FFN
# activation is GELU:
GELU_ARCHITECTURES = {"gemma", "gemma2", "gemma3"}
TOLERANCE_F32_GELU = 5e-3
# gemma4 runs GELU twice a layer (the FFN and the per-layer input's gate): its F32 file differs from llama-server
# by up to 0.0235 on tiny-gemma4 (a NumPy forward with llama.cpp's F16-table GELU comes within 1.5e-3 of llama.cpp,
# one with an f32 GELU within 2e-5 of tern), so it gets 0.03. Its F16 file: up to 0.0229, within F16's own 0.05.
GELU_TWICE_ARCHITECTURES = {"gemma4"}
TOLERANCE_F32_GELU_TWICE = 0.03
TERN_TOP = 20   # tern lists more than llama.cpp's 10, so llama.cpp's tenth is usually among them


def tolerance(ftype, kv_type, architecture):
    if ftype == "f32" and kv_type != "f32":
        return TOLERANCE_F32_KV_F16
    if ftype == "f32" and architecture in GELU_TWICE_ARCHITECTURES:
        return TOLERANCE_F32_GELU_TWICE
    if ftype == "f32" and architecture in GELU_ARCHITECTURES:
        return TOLERANCE_F32_GELU
    return TOLERANCE.get(ftype, TOLERANCE_QUANTIZED)


def compare_logprobs(llama_top, tern_steps, upto, tol):
    """(largest |difference| over the entries both list, steps compared, [problems]) over steps [0, upto)."""
    worst, problems = 0.0, []
    steps = min(upto, len(llama_top), len(tern_steps))
    for i in range(steps):
        if llama_top[i] is None:
            continue
        mine = {t["id"]: t["logprob"] for t in tern_steps[i]["top_logprobs"]}
        least = min(mine.values())
        for tid, lp in llama_top[i]:
            if tid in mine:
                d = abs(mine[tid] - lp)
                worst = max(worst, d)
                if d > tol:
                    problems.append("step %d token %d: log-probability %.4f, llama.cpp %.4f (|d| %.3g > %.3g)" % (
                        i, tid, mine[tid], lp, d, tol))
            elif lp > least + tol:
                problems.append("step %d token %d: llama.cpp %.4f, not among tern's %d most likely (least %.4f)" % (
                    i, tid, lp, len(mine), least))
    return worst, steps, problems


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
    failures, checked, summary = [], 0, []
    with tempfile.TemporaryDirectory(prefix="tern-families.") as work:
        for path in files:
            ref = json.load(open(path))
            model = os.path.join(work, "%s-%s.gguf" % (ref["shape"], ref["type"]))
            synth = subprocess.run([args.tern, "synth", model, "--shape", ref["shape"], "--type", ref["type"],
                                    "--seed", str(ref["seed"]), "-t", "2"], capture_output=True, text=True)
            if synth.returncode != 0:
                failures.append("%s: tern synth: %s" % (os.path.basename(path), synth.stderr.strip()[-200:]))
                continue
            kv_type = ref.get("kv_type", "f16")
            info = subprocess.run([args.tern, "info", model, "--json"], capture_output=True, text=True)
            architecture = json.loads(info.stdout).get("architecture", "") if info.returncode == 0 else ""
            tol = tolerance(ref["type"], kv_type, architecture)
            file_worst, file_steps, file_has_top = 0.0, 0, False
            for case in ref["cases"]:
                n = len(case["tokens"])
                has_top = "top" in case
                file_has_top |= has_top
                out = subprocess.run([args.tern, "run", "-m", model, "-p", case["prompt"], "-n", str(n), "--temp", "0",
                                      "--seed", "1", "-c", "512", "-t", "2", "--no-prompt-cache", "--json",
                                      "--kv-type", kv_type] + (["--logprobs", str(TERN_TOP)] if has_top else []),
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
                # llama-server's ids end with the end-of-generation token it stopped at; tern's stop before it and
                # say "eos": the same path when every earlier id agrees (checked below up to there).
                if got.get("stop_reason") == "eos" and len(got["tokens"]) == len(case["tokens"]) - 1:
                    upto = min(upto, len(got["tokens"]))
                mine = got["tokens"][:upto]
                first = next((i for i, (a, b) in enumerate(zip(mine, case["tokens"][:upto])) if a != b), None)
                if first is None and len(mine) < upto:
                    first = len(mine)
                checked += 1
                status = "ok" if first is None else "DIFFERS at step %d" % first
                if has_top:
                    # Teacher-forced: the steps whose earlier ids are the same on both sides.
                    full = got["tokens"]
                    same = next((i for i, (a, b) in enumerate(zip(full, case["tokens"])) if a != b),
                                min(len(full), len(case["tokens"])))
                    worst, steps, problems = compare_logprobs(case["top"], got["logprobs"], same + 1, tol)
                    file_worst, file_steps = max(file_worst, worst), file_steps + steps
                    status += ", log-probabilities over %d steps: max |d| %.3g%s" % (
                        steps, worst, "" if not problems else " (%d above %.3g)" % (len(problems), tol))
                    failures += ["%s: %s" % (name, p) for p in problems[:5]]
                print("%-40s %2d comparable steps: %s" % (name, upto, status))
                if first is not None:
                    failures.append("%s: step %d: tern %d, llama.cpp %d (llama.cpp's margin there: %s)" % (
                        name, first, got["tokens"][first] if first < len(got["tokens"]) else -1,
                        case["tokens"][first], case["margins"][first]))
            if file_has_top:
                summary.append((os.path.basename(path), ref["shape"], ref["type"], kv_type, file_steps, file_worst, tol))
    if summary:
        print("\n| file | KV cache | teacher-forced steps | max abs log-probability difference | tolerance |")
        print("|---|---|---:|---:|---:|")
        for f, shape, ftype, kv, steps, worst, tol in summary:
            print("| %s | %s | %d | %.3g | %.3g |" % (f, kv, steps, worst, tol))
        print()
    print("families_reference: %d cases, %d failures" % (checked, len(failures)))
    for f in failures:
        print("  " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
