#!/usr/bin/env python3
"""Each model family tern runs, against llama.cpp, on tiny `tern synth` files (bench/family_vs_llamacpp.sh).

For every shape and file type: tern writes the file, llama-server loads it (a file llama.cpp cannot load is
reported, not skipped; llama.cpp's flash attention off unless --flash-attn says otherwise, so that both attend
in f32), and both decode 3 prompts greedily. Compared per prompt:
  - the prompt's token ids (llama-server's /tokenize against `tern run --json`'s prompt_tokens);
  - the greedy ids over -n tokens. Where they first differ, llama.cpp's own top-1/top-2 logit margin at that
    step says whether it is a near-tie (shared/reference/README.md: greedy ids agree until a step whose margin
    is within the comparison's noise, 0.05 for F16 files and 1.0 for quantized ones here).
Both use the KV cache format --kv-type (f32 by default). --save-reference also records llama.cpp's --top most
likely tokens with their log-probabilities at every step of its greedy path (tests/families_reference.py compares
tern's `run --logprobs` with them, teacher-forced).
Prints a markdown table; exit status 1 when a file does not load or a prompt differs outside a near-tie.
"""
import argparse
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

PROMPTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):"]
NOISE = {"f32": 0.01, "f16": 0.05, "bf16": 0.2}   # other (quantized) types: 1.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body, timeout=120):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    if resp.status != 200:
        raise RuntimeError("%s: HTTP %d: %s" % (path, resp.status, data[:200]))
    return json.loads(data)


def start_server(args, model, log_path):
    port = free_port()
    log = open(log_path, "w")
    proc = subprocess.Popen([args.llama_server, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t",
                             str(args.threads), "-c", "512", "--no-repack", "--no-warmup", "-fa", args.flash_attn,
                             "-ctk", args.kv_type, "-ctv", args.kv_type],
                            stdout=log, stderr=subprocess.STDOUT)
    for _ in range(600):
        if proc.poll() is not None:
            return None, proc
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            ok = conn.getresponse().status == 200
            conn.close()
            if ok:
                return port, proc
        except OSError:
            pass
        time.sleep(0.2)
    return None, proc


def llama_greedy(port, prompt, n):
    tokens = post(port, "/tokenize", {"content": prompt, "add_special": True})["tokens"]
    r = post(port, "/completion", {"prompt": prompt, "n_predict": n, "temperature": 0, "return_tokens": True,
                                   "cache_prompt": False})
    return tokens, r["tokens"]


def llama_top(port, ids, n, plain_id):
    """llama.cpp's n most likely next tokens after the token ids `ids`, [[id, log-probability], ...] (its raw
    logits minus their log-sum-exp: n_probs without post_sampling_probs), or None. One request of one token: its
    completion probabilities come per text piece, so a long run's list need not have an entry per token; and
    llama-server sends none for a token that ends mid-character, so a logit bias makes it pick `plain_id` (a
    token that is whole text): the bias acts in its sampler, after the probabilities are read from the logits."""
    r = post(port, "/completion", {"prompt": ids, "n_predict": 1, "temperature": 0, "n_probs": n,
                                   "return_tokens": True, "cache_prompt": False,
                                   "logit_bias": [[plain_id, 1000.0]] if plain_id is not None else []})
    probs = r.get("completion_probabilities") or [{}]
    top = probs[0].get("top_logprobs") or []
    return [[t["id"], t["logprob"]] for t in top] if top else None


def margin_of(top):
    return top[0][1] - top[1][1] if top and len(top) >= 2 else None


def llama_plain_token(port):
    """A token whose text is whole characters (the last of "a"), for llama_top's logit bias."""
    ids = post(port, "/tokenize", {"content": "a", "add_special": False})["tokens"]
    return ids[-1] if ids else None


def compact_json(obj):
    """indent=0 JSON with every list of numbers on one line (the top lists would otherwise take a line per number)."""
    text = json.dumps(obj, indent=0)
    return re.sub(r"\[\n([^\[\]{}]*?)\n\]", lambda m: "[" + m.group(1).replace(",\n", ", ") + "]", text)


def tern_greedy(args, model, prompt, n):
    out = subprocess.run([args.tern, "run", "-m", model, "-p", prompt, "-n", str(n), "--temp", "0", "--seed", "1",
                          "-c", "512", "-t", str(args.threads), "--no-prompt-cache", "--json",
                          "--kv-type", args.kv_type],
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError("tern run: exit %d: %s" % (out.returncode, out.stderr.strip()[-300:]))
    d = json.loads(out.stdout)
    return d["prompt_tokens"], d["tokens"], d.get("stop_reason")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tern", required=True)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--shapes", default="tiny tiny-qwen2 tiny-qwen3 tiny-gemma2 tiny-gemma3 tiny-qwen3moe "
                                        "tiny-qwen3-yarn tiny-longrope tiny-mistral3 tiny-gpt-oss tiny-mixtral "
                                        "tiny-smollm3 tiny-phi3 tiny-phi3-longrope tiny-granite tiny-olmo2 tiny-glm4moe tiny-gemma4")
    ap.add_argument("--types", default="f16 q4_k_m")
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("-t", "--threads", type=int, default=2)
    # llama.cpp's CPU flash attention rounds its operands to F16 whatever the KV type: "auto" (its default) turns
    # it on, and greedy paths then part from an f32 attention's (tern's) where margins are small. Off, llama.cpp
    # attends in f32 as tern does.
    ap.add_argument("--flash-attn", choices=("on", "off", "auto"), default="off")
    # Both sides' KV cache format. f32 (not llama.cpp's default f16, which rounds the attention's operands) makes
    # the teacher-forced log-probabilities of an F32 file comparable within about 1e-3 (shared/reference/README.md
    # "How to read tolerances").
    ap.add_argument("--kv-type", choices=("f32", "f16"), default="f32")
    ap.add_argument("--top", type=int, default=10,
                    help="--save-reference: llama.cpp's most likely tokens recorded at every step (default 10)")
    ap.add_argument("--save-reference", metavar="DIR",
                    help="also write llama.cpp's side of every case (prompt tokens, greedy ids, its top-2 margin and "
                         "its --top most likely tokens with their log-probabilities at every step of its greedy path) "
                         "to DIR/<shape>-<type>.json: tests/families_reference.py checks tern against them")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="tern-family.")
    rows, bad = [], 0
    for shape in args.shapes.split():
        for ftype in args.types.split():
            model = os.path.join(work, "%s-%s.gguf" % (shape, ftype))
            synth = subprocess.run([args.tern, "synth", model, "--shape", shape, "--type", ftype],
                                   capture_output=True, text=True)
            if synth.returncode != 0:
                rows.append((shape, ftype, "-", "tern synth failed: " + synth.stderr.strip()[-120:], "", "", "FAILED"))
                bad += 1
                continue
            log_path = os.path.join(work, "%s-%s.llama.log" % (shape, ftype))
            port, proc = start_server(args, model, log_path)
            if port is None:
                tail = open(log_path).read().strip().splitlines()[-1:] or ["?"]
                rows.append((shape, ftype, "-", "llama.cpp cannot load it: " + tail[0][:120], "", "", "FAILED"))
                bad += 1
                proc.kill()
                continue
            reference = {"shape": shape, "type": ftype, "seed": 1, "noise": NOISE.get(ftype, 1.0),
                         "kv_type": args.kv_type, "cases": []}
            try:
                plain = llama_plain_token(port)
                for prompt in PROMPTS:
                    l_prompt, l_gen = llama_greedy(port, prompt, args.n)
                    if args.save_reference:
                        tops = [llama_top(port, l_prompt + l_gen[:i], args.top, plain) for i in range(len(l_gen))]
                        reference["cases"].append({
                            "prompt": prompt, "prompt_tokens": l_prompt, "tokens": l_gen,
                            "margins": [margin_of(t) for t in tops], "top": tops})
                    # llama.cpp's side is recorded whatever tern does with the file: a family whose forward is not
                    # written yet still gets its reference, and its rows say why tern failed.
                    try:
                        t_prompt, t_gen, t_stop = tern_greedy(args, model, prompt, args.n)
                    except (RuntimeError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
                        rows.append((shape, ftype, json.dumps(prompt), "-", "", "error: %s" % str(e)[:160], "FAILED"))
                        bad += 1
                        continue
                    same_prompt = l_prompt == t_prompt
                    first = next((i for i, (a, b) in enumerate(zip(l_gen, t_gen)) if a != b), None)
                    # llama-server's ids end with the end-of-generation token it stopped at; tern's stop before it.
                    if first is None and t_stop == "eos" and len(t_gen) == len(l_gen) - 1:
                        t_gen = t_gen + l_gen[-1:]
                    if first is None and len(l_gen) != len(t_gen):
                        first = min(len(l_gen), len(t_gen))
                    noise = NOISE.get(ftype, 1.0)
                    if not same_prompt:
                        verdict, where = "DIFFERS (prompt tokens)", ""
                    elif first is None:
                        verdict, where = "equal", ""
                    else:
                        m = margin_of(llama_top(port, l_prompt + l_gen[:first], 2, plain))
                        if m is None:   # a byte token that ends mid-character: llama-server sends no probabilities
                            where = "step %d, llama.cpp margin unknown (a partial UTF-8 token)" % first
                            verdict = "undecided"
                        else:
                            where = "step %d, llama.cpp margin %.3g" % (first, m)
                            verdict = "near-tie" if m <= noise else "DIFFERS"
                    if verdict.startswith("DIFFERS"):
                        bad += 1
                    equal = len(l_gen) if first is None else first
                    rows.append((shape, ftype, json.dumps(prompt), "yes" if same_prompt else "no",
                                 "%d/%d" % (equal, max(len(l_gen), len(t_gen))), where, verdict))
                if args.save_reference:
                    os.makedirs(args.save_reference, exist_ok=True)
                    with open(os.path.join(args.save_reference, "%s-%s.json" % (shape, ftype)), "w") as f:
                        f.write(compact_json(reference) + "\n")
            except (RuntimeError, OSError, ValueError, KeyError) as e:
                rows.append((shape, ftype, "-", "error: %s" % str(e)[:160], "", "", "FAILED"))
                bad += 1
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    print("| shape | type | prompt | prompt tokens equal | greedy ids equal | first difference | verdict |")
    print("|---|---|---|---|---:|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print("\nnear-tie: llama.cpp's own top-1/top-2 margin at the first differing step (asked for that step alone, "
          "the path so far as its prompt) is within the comparison's noise (F16 0.05, BF16 0.2, quantized 1.0; "
          "shared/reference/README.md), so the paths may part there. undecided: llama-server gives no probabilities "
          "for a token that ends mid-character.")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
