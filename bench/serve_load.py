#!/usr/bin/env python3
"""Load driver for OpenAI-compatible servers (tern serve, llama-server): prints one JSON object.

  serve_load.py streams --port P --clients N --max-tokens T --prompts FILE
      N concurrent streamed /v1/completions (greedy), prompt i = line i of FILE (cycled). Reports each
      stream's time to first token, tokens, text; the aggregate tok/s (all generated tokens over the wall
      time from the first request sent to the last stream's end) and the aggregate decode tok/s (the
      tokens after each stream's first, over the time from the earliest first token to the last end).
  serve_load.py ttft --port P --busy B --prompt TEXT [--rounds R]
      Time to first token of a new request, R times on an idle server, then R times while B other
      streams decode (each started and producing tokens before the probe is sent). Medians.
  serve_load.py badreq --port P --model NAME
      Malformed and hostile requests (bad JSON, wrong types, huge max_tokens, an over-long prompt, an
      unknown model, 1000 connections at once): the status each got and the first words of its error,
      then whether /health still answers.

Only the standard library; every request goes to the host given (default 127.0.0.1); every wait is
bounded by --timeout.
"""
import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "serve"))
from connection_flood import connection_flood, raise_fd_limit  # noqa: E402  (shared with the serve tests)


def post_stream(host, port, path, body, timeout, stop_event=None):
    """One streamed request: {'sent','first','end','n','text','status'} (times from time.perf_counter()).
    stop_event set: the connection is closed early (a client going away)."""
    out = {"sent": time.perf_counter(), "first": None, "end": None, "n": 0, "text": "", "status": 0}
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        out["status"] = r.status
        if r.status != 200:
            out["error"] = r.read(400).decode("utf-8", "replace")
            return out
        pieces = []
        while True:
            if stop_event is not None and stop_event.is_set():
                break
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            usage = chunk.get("usage")
            if usage:
                out["n"] = usage.get("completion_tokens", out["n"])
            for choice in chunk.get("choices") or []:
                piece = choice.get("text") or ""
                if piece:
                    if out["first"] is None:
                        out["first"] = time.perf_counter()
                    pieces.append(piece)
        out["text"] = "".join(pieces)
    finally:
        out["end"] = time.perf_counter()
        conn.close()
    return out


def completion_body(prompt, max_tokens):
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}


def run_streams(args, prompts, clients, max_tokens):
    results = [None] * clients
    def client(i):
        results[i] = post_stream(args.host, args.port, "/v1/completions",
                                 completion_body(prompts[i % len(prompts)], max_tokens), args.timeout)
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = max(r["end"] for r in results) - t0
    total = sum(r["n"] for r in results)
    # Decode alone: the tokens after each stream's first, over the time from the earliest first token to
    # the last stream's end (the prompts' prefill, before any stream's first token, left out).
    firsts = [r["first"] for r in results if r["first"] is not None]
    window = max(r["end"] for r in results) - min(firsts) if firsts else 0.0
    decoded = sum(max(r["n"] - 1, 0) for r in results)
    return {
        "clients": clients,
        "wall_s": wall,
        "tokens": total,
        "aggregate_tok_s": total / wall if wall > 0 else 0.0,
        "decode_tok_s": decoded / window if window > 0 else 0.0,
        "failed": sum(1 for r in results if r["status"] != 200),
        "streams": [{"ttft_ms": (r["first"] - r["sent"]) * 1e3 if r["first"] else None, "n": r["n"],
                     "text": r["text"], "status": r["status"]} for r in results],
    }


def probe_ttft(args, prompt):
    r = post_stream(args.host, args.port, "/v1/completions", completion_body(prompt, 4), args.timeout)
    if r["status"] != 200 or r["first"] is None:
        raise RuntimeError(f"probe failed: status {r['status']} {r.get('error', '')}")
    return (r["first"] - r["sent"]) * 1e3


def run_ttft(args):
    # Every probe's prompt is new (a numbered first line): a server's prefix reuse must not answer it.
    probes = iter(f"Request {i}.\n{args.prompt}" for i in range(2 * args.rounds))
    idle = [probe_ttft(args, next(probes)) for _ in range(args.rounds)]
    busy = []
    for _ in range(args.rounds):
        stop = threading.Event()
        started = []
        lock = threading.Lock()
        def streamer(i):
            body = completion_body(f"Tell a long story about the number {i}.", args.busy_tokens)
            post_stream_marking(args, body, stop, started, lock)
        threads = [threading.Thread(target=streamer, args=(i,)) for i in range(args.busy)]
        for t in threads:
            t.start()
        deadline = time.perf_counter() + args.timeout
        while len(started) < args.busy and time.perf_counter() < deadline:
            time.sleep(0.01)
        if len(started) < args.busy:
            stop.set()
            raise RuntimeError(f"only {len(started)} of {args.busy} busy streams started")
        time.sleep(0.3)   # let the streams settle into decoding
        busy.append(probe_ttft(args, next(probes)))
        stop.set()
        for t in threads:
            t.join()
        time.sleep(0.5)   # the server notices the closed streams and frees their sequences
    return {"idle_ms": idle, "busy_ms": busy, "idle_median_ms": statistics.median(idle),
            "busy_median_ms": statistics.median(busy),
            "ratio": statistics.median(busy) / statistics.median(idle)}


def post_stream_marking(args, body, stop, started, lock):
    """A streamed request that appends to `started` at its first piece and closes once `stop` is set."""
    conn = http.client.HTTPConnection(args.host, args.port, timeout=args.timeout)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        marked = False
        while not stop.is_set():
            line = r.readline()
            if not line:
                break
            if not marked and line.startswith(b"data:") and b'"text"' in line:
                with lock:
                    started.append(1)
                marked = True
    finally:
        conn.close()


def raw_request(args, method, path, body):
    conn = http.client.HTTPConnection(args.host, args.port, timeout=args.timeout)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        text = r.read(2000).decode("utf-8", "replace")
        try:
            message = json.loads(text).get("error", {}).get("message", text)
        except (ValueError, AttributeError):
            message = text
        return r.status, str(message)[:110].replace("\n", " ")
    finally:
        conn.close()


def run_badreq(args):
    m = args.model
    cases = [
        ("malformed JSON", "/v1/chat/completions", '{"model": "%s", "messages": [' % m),
        ("not an object", "/v1/completions", "[1, 2, 3]"),
        ("empty body", "/v1/completions", ""),
        ("max_tokens a string", "/v1/completions", json.dumps({"prompt": "Hi", "max_tokens": "many"})),
        ("messages a string", "/v1/chat/completions", json.dumps({"messages": "Hi"})),
        ("temperature a string", "/v1/completions", json.dumps({"prompt": "Hi", "temperature": "hot"})),
        ("max_tokens 10^12", "/v1/completions", json.dumps({"prompt": "Hi", "max_tokens": 10**12})),
        ("prompt over the context", "/v1/completions",
         json.dumps({"prompt": "Once upon a time " * args.long_prompt_words, "max_tokens": 4})),
        ("unknown model", "/v1/chat/completions",
         json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}]})),
    ]
    rows = []
    for name, path, body in cases:
        try:
            status, message = raw_request(args, "POST", path, body)
        except OSError as e:
            status, message = 0, f"connection failed: {e}"
        rows.append({"case": name, "status": status, "message": message})
    raise_fd_limit(1200)
    try:
        statuses = {str(k): v for k, v in connection_flood(args.host, args.port, 1000, args.timeout).items()}
    except OSError as e:
        statuses = {"error": str(e)}
    rows.append({"case": "1000 connections at once", "status": statuses, "message": ""})
    try:
        health = raw_request(args, "GET", "/health", None)[0]
    except OSError:
        health = 0
    return {"cases": rows, "health_after": health}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["streams", "ttft", "badreq"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompts", help="file of prompts, one a line")
    p.add_argument("--prompt", default="Summarise the rules of chess in a few sentences.")
    p.add_argument("--busy", type=int, default=7)
    p.add_argument("--busy-tokens", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default="model")
    p.add_argument("--long-prompt-words", type=int, default=20000)
    args = p.parse_args()
    if args.mode == "streams":
        if not args.prompts:
            p.error("streams needs --prompts")
        with open(args.prompts) as f:
            prompts = [line.rstrip("\n") for line in f if line.strip()]
        result = run_streams(args, prompts, args.clients, args.max_tokens)
    elif args.mode == "ttft":
        result = run_ttft(args)
    else:
        result = run_badreq(args)
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
