#!/usr/bin/env python3
"""tern quantize against llama-quantize's recorded outputs (tests/data/quantize, written by
bench/quantize_families_vs_llamacpp.sh --save-reference): for every file, tern synth writes the same source
(its SHA-256 must equal the recorded one: synth is deterministic by seed, so a different hash means the synth
shape changed and the reference must be regenerated, not that quantize is wrong), tern quantize converts it, and
every tensor must have llama-quantize's type and the SHA-256 of its bytes, in llama-quantize's order.
The *.types files hold llama-quantize's --dry-run plans of deeper and wider mixtures (tiny-qwen3moe scaled by
tests/gguf_scaled_header.py to N layers of E experts): tern quantize --dry-run must plan every tensor's type the same.

Usage: quantize_reference.py --tern BIN --data DIR
"""
import argparse
import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_scaled_header import scaled_header  # noqa: E402
from gguf_tensor_digest import digest  # noqa: E402


def read_reference(path):
    fields, source, tensors = None, None, []
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        words = line.split()
        if words[0] == "shape":
            fields = dict(zip(words[0::2], words[1::2]))
        elif words[0] == "source_sha256":
            source = words[1]
        else:
            tensors.append((words[0], int(words[1]), words[2]))
    if fields is None or source is None or not tensors:
        raise ValueError("%s: no shape/source_sha256 line or no tensors" % path)
    return fields, source, tensors


def read_plans(path):
    """(source sha256, {"layers", "experts", ...}, [type names], [(tensor, [type per type name])])."""
    source, fields, types, rows = None, None, None, []
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        words = line.split()
        if words[0] == "source_sha256":
            source = words[1]
        elif words[0] == "scaled":
            # scaled SHAPE SOURCE seed S layers N experts E
            fields = dict(zip(words[3::2], words[4::2]), shape=words[1], source=words[2])
        elif words[0] == "name":
            types = words[1:]
        else:
            rows.append((words[0], words[1:]))
    if source is None or fields is None or types is None or not rows:
        raise ValueError("%s: no source_sha256, scaled or name line, or no tensors" % path)
    return source, fields, types, rows


def check_plans(args, path, work, failures):
    label = os.path.basename(path)
    want_source, f, types, rows = read_plans(path)
    src = os.path.join(work, "moe.gguf")
    deep = os.path.join(work, "deep.gguf")
    r = subprocess.run([args.tern, "synth", src, "--shape", f["shape"], "--type", f["source"], "--seed", f["seed"],
                        "-t", "2"], capture_output=True, text=True)
    if r.returncode != 0 or sha256(src) != want_source:
        failures.append("%s: tern synth wrote a different source: regenerate with "
                        "bench/quantize_families_vs_llamacpp.sh --save-reference" % label)
        return 0
    scaled_header(src, deep, int(f["layers"]), int(f["experts"]))
    bad = []
    for k, ty in enumerate(types):
        r = subprocess.run([args.tern, "quantize", deep, os.path.join(work, "x.gguf"), "--type", ty, "--dry-run",
                            "--json"], capture_output=True, text=True)
        if r.returncode != 0:
            bad.append("%s: tern quantize --dry-run: %s" % (ty, r.stderr.strip()[-200:]))
            continue
        got = [(t["name"], t["to"].lower()) for t in json.loads(r.stdout)["tensors"]]
        want = [(name, per_type[k]) for name, per_type in rows]
        if [g[0] for g in got] != [w[0] for w in want]:
            bad.append("%s: tensor names/order differ (tern %d, llama-quantize %d)" % (ty, len(got), len(want)))
            continue
        bad += ["%s: %s planned %s, llama-quantize %s" % (ty, g[0], g[1], w[1]) for g, w in zip(got, want) if g != w]
    print("%-36s %3d tensors x %d types: %s" % (label, len(rows), len(types),
                                                "same plan" if not bad else "%d DIFFER" % len(bad)))
    failures += ["%s: %s" % (label, b) for b in bad]
    return 1


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", required=True)
    ap.add_argument("--data", required=True)
    args = ap.parse_args()
    files = sorted(glob.glob(os.path.join(args.data, "*.txt")))
    plans = sorted(glob.glob(os.path.join(args.data, "*.types")))
    if not files:
        print("quantize_reference: no reference files in %s" % args.data)
        return 1
    failures, checked = [], 0
    with tempfile.TemporaryDirectory(prefix="tern-qref.") as work:
        for path in files:
            label = os.path.basename(path)
            f, want_source, want = read_reference(path)
            src = os.path.join(work, "src.gguf")
            out = os.path.join(work, "out.gguf")
            r = subprocess.run([args.tern, "synth", src, "--shape", f["shape"], "--type", f["source"], "--seed",
                                f["seed"], "-t", "2"], capture_output=True, text=True)
            if r.returncode != 0:
                failures.append("%s: tern synth: %s" % (label, r.stderr.strip()[-200:]))
                continue
            got_source = sha256(src)
            if got_source != want_source:
                failures.append("%s: tern synth wrote a different source (sha256 %s, recorded %s): the shape "
                                "changed; regenerate with bench/quantize_families_vs_llamacpp.sh --save-reference"
                                % (label, got_source[:12], want_source[:12]))
                continue
            r = subprocess.run([args.tern, "quantize", src, out, "--type", f["type"], "--force", "-t", "2"],
                               capture_output=True, text=True)
            if r.returncode != 0:
                failures.append("%s: tern quantize: %s" % (label, r.stderr.strip()[-200:]))
                continue
            got = digest(out)
            checked += 1
            bad = []
            if [g[0] for g in got] != [w[0] for w in want]:
                bad.append("tensor names/order differ: tern %d tensors, llama-quantize %d" % (len(got), len(want)))
            mine = {g[0]: g for g in got}
            for name, ty, h in want:
                g = mine.get(name)
                if g is None:
                    bad.append("%s missing" % name)
                elif g[1] != ty:
                    bad.append("%s: type %d, llama-quantize %d" % (name, g[1], ty))
                elif g[2] != h:
                    bad.append("%s: same type %d, different bytes" % (name, ty))
            print("%-36s %3d tensors: %s" % (label, len(want), "identical" if not bad else "%d DIFFER" % len(bad)))
            failures += ["%s: %s" % (label, b) for b in bad]
        for path in plans:
            checked += check_plans(args, path, work, failures)
    print("quantize_reference: %d files, %d failures" % (checked, len(failures)))
    for f in failures:
        print("  " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
