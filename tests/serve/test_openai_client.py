#!/usr/bin/env python3
"""`tern serve` end to end through the official openai Python client (installed by setup_venv.sh).

Starts the server on a free loopback port with the smallest shared model and checks: the model list,
chat and text completions streamed and not (equal to `tern run` for the same greedy request), usage
counts; the error cases (malformed JSON, wrong types, huge max_tokens, an over-long prompt, an unknown
model, a missing or wrong API key, an unknown route, a body over --max-body); a client that goes away
cancels its request; 64 concurrent clients all answered with memory bounded; 1000 connections at once
all answered; nothing listens beyond 127.0.0.1; SIGTERM finishes the request in flight and exits 0.

Usage: test_openai_client.py --tern BIN --shared SHARED_DIR   (exit 0 when every check passes)
Every request goes to 127.0.0.1 only; every loop is bounded.
"""
import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

import openai

from connection_flood import connection_flood, raise_fd_limit
from server_suite import run_cases_against

ARGS = None
SERVER = None      # the Server every test but the last shares
API_KEY = "test-key-123"
MODEL_FILE = "llama2xs-tok512-q4_0.gguf"
MODEL = "llama2xs-tok512-q4_0"
CTX = 2048


class Server:
    def __init__(self, extra=()):
        self.model_path = os.path.join(ARGS.shared, "models", "gguf", MODEL_FILE)
        cmd = [ARGS.tern, "serve", "-m", self.model_path, "--port", "0", "--device", "cpu", "-t", "1",
               "-c", str(CTX), "--no-repeat-guard", "--no-prompt-cache", "--api-key", API_KEY, "--max-body", "64K",
               *extra]
        self.stderr_lines = []
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "TERN_API_KEY": ""})
        self.port = None
        deadline = time.time() + 60
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.stderr_lines.append(line)
            if "serving" in line and "http://127.0.0.1:" in line:
                self.port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
                break
        if self.port is None:
            self.proc.kill()
            raise RuntimeError("tern serve did not start: " + "".join(self.stderr_lines))
        # Keep reading stderr so the server never blocks on a full pipe.
        self.reader = threading.Thread(target=self._drain_stderr, daemon=True)
        self.reader.start()
        self.base = f"http://127.0.0.1:{self.port}/v1"

    def _drain_stderr(self):
        for line in self.proc.stderr:
            self.stderr_lines.append(line)

    def client(self, **kw):
        return openai.OpenAI(base_url=self.base, api_key=kw.pop("api_key", API_KEY), timeout=60, **kw)

    def raw(self, method, path, body=None, headers=None, key=API_KEY):
        """(status, parsed JSON or text) of one request on a fresh connection."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        h = {"Content-Type": "application/json", **(headers or {})}
        if key:
            h["Authorization"] = "Bearer " + key
        data = body.encode() if isinstance(body, str) else body
        conn.request(method, path, body=data, headers=h)
        r = conn.getresponse()
        text = r.read().decode("utf-8", "replace")
        conn.close()
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text

    def metrics(self):
        status, text = self.raw("GET", "/metrics")
        assert status == 200, text
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(5)
        self.proc.stderr.close()


def tern_run(prompt, n, chat=False):
    """What `tern run` prints for a greedy request (the server's reference)."""
    model_path = os.path.join(ARGS.shared, "models", "gguf", MODEL_FILE)
    cmd = [ARGS.tern, "run", "-m", model_path, "-p", prompt, "-n", str(n), "--temp", "0", "--device", "cpu",
           "-t", "1", "-c", str(CTX), "--no-repeat-guard", "--no-prompt-cache", "--no-escape"]
    if chat:
        cmd.append("--chat")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def wait_for(predicate, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


class Api(unittest.TestCase):
    def test_models(self):
        models = SERVER.client().models.list()
        self.assertEqual([m.id for m in models.data], [MODEL])
        self.assertEqual(SERVER.client().models.retrieve(MODEL).id, MODEL)
        with self.assertRaises(openai.NotFoundError):
            SERVER.client().models.retrieve("gpt-4o")

    def test_chat_completion_streamed_and_not(self):
        c = SERVER.client()
        messages = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hello"}]
        r = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0)
        self.assertEqual(r.object, "chat.completion")
        self.assertEqual(r.model, MODEL)
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertIn(r.choices[0].finish_reason, ("stop", "length"))
        self.assertGreater(r.usage.prompt_tokens, 0)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)
        self.assertLessEqual(r.usage.completion_tokens, 20)
        text = r.choices[0].message.content

        chunks = list(c.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0,
                                                stream=True, stream_options={"include_usage": True}))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        self.assertEqual(streamed, text)
        finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        self.assertEqual(finish, [r.choices[0].finish_reason])
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, r.usage.completion_tokens)
        self.assertEqual(len({ch.id for ch in chunks}), 1)

        # The chat template `tern run --chat` uses (the model has none: chatml), so the same text.
        one_turn = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello"}],
                                             max_tokens=12, temperature=0)
        self.assertEqual(one_turn.choices[0].message.content, tern_run("Hello", 12, chat=True))

    def test_text_completion_streamed_and_not_equal_tern_run(self):
        c = SERVER.client()
        want = tern_run("Once upon a time", 24)
        r = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=0)
        self.assertEqual(r.object, "text_completion")
        self.assertEqual(r.choices[0].text, want)
        self.assertEqual(r.usage.completion_tokens, 24)
        self.assertEqual(r.choices[0].finish_reason, "length")
        pieces = list(c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=0,
                                           stream=True))
        self.assertEqual("".join(p.choices[0].text for p in pieces), want)
        self.assertEqual(pieces[-1].choices[0].finish_reason, "length")
        # stop strings, seeds, echo
        r = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=40, temperature=0, stop=["girl"])
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertNotIn("girl", r.choices[0].text)
        a = c.completions.create(model=MODEL, prompt="The dog", max_tokens=16, temperature=0.9, seed=7)
        b = c.completions.create(model=MODEL, prompt="The dog", max_tokens=16, temperature=0.9, seed=7)
        self.assertEqual(a.choices[0].text, b.choices[0].text)
        e = c.completions.create(model=MODEL, prompt="Once", max_tokens=4, temperature=0, echo=True)
        self.assertTrue(e.choices[0].text.startswith("Once"))

    def test_logprobs_equal_tern_run(self):
        c = SERVER.client()
        model_path = os.path.join(ARGS.shared, "models", "gguf", MODEL_FILE)
        run = subprocess.run([ARGS.tern, "run", "-m", model_path, "-p", "Once upon a time", "-n", "8", "--temp", "0",
                              "--device", "cpu", "-t", "1", "-c", str(CTX), "--no-repeat-guard", "--no-prompt-cache",
                              "--json", "--logprobs", "3"], capture_output=True, text=True, timeout=120)
        self.assertEqual(run.returncode, 0, run.stderr)
        want = json.loads(run.stdout)["logprobs"]
        r = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0, logprobs=3)
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 8)
        self.assertEqual(lp.token_logprobs, [w["logprob"] for w in want])
        self.assertEqual(sorted(lp.top_logprobs[0].values(), reverse=True)[:1], [want[0]["logprob"]])
        self.assertEqual(lp.text_offset[0], 0)
        ch = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=6,
                                       temperature=0, logprobs=True, top_logprobs=2)
        content = ch.choices[0].logprobs.content
        self.assertEqual(len(content), ch.usage.completion_tokens)
        for t in content:
            self.assertEqual(len(t.top_logprobs), 2)
            self.assertEqual(t.logprob, t.top_logprobs[0].logprob)   # greedy: the chosen token is the likeliest
            self.assertTrue(t.bytes and all(0 <= x < 256 for x in t.bytes))
        plain = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=2)
        self.assertIsNone(plain.choices[0].logprobs)
        with self.assertRaises(openai.BadRequestError):
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], logprobs=True,
                                      stream=True)

    def test_bad_requests_get_openai_errors(self):
        c = SERVER.client()
        status, body = SERVER.raw("POST", "/v1/chat/completions", '{"model": "x", "messages": [')
        self.assertEqual(status, 400)
        self.assertEqual(body["error"]["code"], "invalid_json")
        self.assertEqual(body["error"]["type"], "invalid_request_error")
        status, body = SERVER.raw("POST", "/v1/completions", "[1, 2, 3]")
        self.assertEqual(status, 400)
        status, body = SERVER.raw("POST", "/v1/completions", "")
        self.assertEqual(status, 400)

        with self.assertRaises(openai.BadRequestError) as cm:
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                      max_tokens="many")
        self.assertEqual(cm.exception.body["param"], "max_tokens")
        with self.assertRaises(openai.BadRequestError) as cm:
            c.chat.completions.create(model=MODEL, messages="Hi")
        self.assertEqual(cm.exception.body["param"], "messages")
        with self.assertRaises(openai.BadRequestError) as cm:
            c.completions.create(model=MODEL, prompt="Hi", temperature="hot")
        self.assertEqual(cm.exception.body["param"], "temperature")
        with self.assertRaises(openai.BadRequestError) as cm:
            c.completions.create(model=MODEL, prompt="Hi", max_tokens=10**12)
        self.assertIn("out of range", cm.exception.body["message"])
        with self.assertRaises(openai.BadRequestError) as cm:
            c.completions.create(model=MODEL, prompt="Hi", max_tokens=CTX + 1)
        self.assertEqual(cm.exception.body["code"], "context_length_exceeded")
        with self.assertRaises(openai.BadRequestError) as cm:
            c.completions.create(model=MODEL, prompt="Once upon a time " * 1000, max_tokens=4)
        self.assertEqual(cm.exception.body["code"], "context_length_exceeded")
        with self.assertRaises(openai.BadRequestError) as cm:
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=3)
        self.assertEqual(cm.exception.body["param"], "n")

        with self.assertRaises(openai.NotFoundError) as cm:
            c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}])
        self.assertEqual(cm.exception.body["code"], "model_not_found")
        with self.assertRaises(openai.AuthenticationError):
            SERVER.client(api_key="wrong").models.list()
        status, body = SERVER.raw("GET", "/v1/models", key=None)
        self.assertEqual(status, 401)
        self.assertEqual(body["error"]["code"], "invalid_api_key")
        status, body = SERVER.raw("GET", "/health", key=None)   # health needs no key
        self.assertEqual((status, body["status"]), (200, "ok"))
        status, body = SERVER.raw("GET", "/v1/nothing")
        self.assertEqual(status, 404)
        self.assertEqual(body["error"]["code"], "unknown_url")
        big = json.dumps({"model": MODEL, "prompt": "a" * 100_000})
        status, body = SERVER.raw("POST", "/v1/completions", big)
        self.assertEqual(status, 413)
        # A chunked body has no Content-Length to check first: it is bounded while read.
        conn = http.client.HTTPConnection("127.0.0.1", SERVER.port, timeout=30)
        conn.request("POST", "/v1/completions", body=iter([b'{"prompt": "' + b"a" * 50_000, b"a" * 50_000 + b'"}']),
                     headers={"Authorization": "Bearer " + API_KEY, "Transfer-Encoding": "chunked"},
                     encode_chunked=True)
        r = conn.getresponse()
        self.assertEqual(r.status, 413)
        conn.close()
        self.assertEqual(SERVER.raw("GET", "/health")[0], 200)

    def test_disconnect_cancels(self):
        before = SERVER.metrics()
        # Streamed: read the first piece, then go away.
        s = socket.create_connection(("127.0.0.1", SERVER.port), timeout=30)
        body = json.dumps({"model": MODEL, "prompt": "Once upon a time", "max_tokens": CTX - 10, "temperature": 0,
                           "stream": True})
        s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
        got = b""
        while b"data: " not in got:
            chunk = s.recv(4096)
            self.assertTrue(chunk)
            got += chunk
        s.close()
        self.assertTrue(wait_for(lambda: SERVER.metrics()['tern_requests_total{outcome="cancelled"}'] >=
                                 before['tern_requests_total{outcome="cancelled"}'] + 1, 20),
                        "a streamed request whose client went away was not cancelled")
        # Not streamed: send, wait a moment, go away. A tiny model generates the whole context in ~0.2 s on an idle
        # machine, so the moment is short and the server looks at its client every 50 ms.
        s = socket.create_connection(("127.0.0.1", SERVER.port), timeout=30)
        body = json.dumps({"model": MODEL, "prompt": "Once upon a time", "max_tokens": CTX - 10, "temperature": 0})
        s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
        time.sleep(0.05)
        s.close()
        self.assertTrue(wait_for(lambda: SERVER.metrics()['tern_requests_total{outcome="cancelled"}'] >=
                                 before['tern_requests_total{outcome="cancelled"}'] + 2, 20),
                        "a waiting request whose client went away was not cancelled")
        self.assertTrue(wait_for(lambda: SERVER.metrics()["tern_requests_running"] == 0, 20))
        after = SERVER.metrics()
        self.assertEqual(after['tern_requests_total{outcome="completed"}'],
                         before['tern_requests_total{outcome="completed"}'])

    def test_load_64_concurrent_clients(self):
        rss_before = SERVER.rss_kib()
        before = SERVER.metrics()
        errors, done = [], []
        lock = threading.Lock()

        def client(i):
            c = SERVER.client(max_retries=5)
            try:
                for k in range(2):
                    if (i + k) % 2:
                        chunks = list(c.chat.completions.create(
                            model=MODEL, messages=[{"role": "user", "content": f"Story {i}"}], max_tokens=16,
                            temperature=0.8, seed=i, stream=True))
                        ok = any(ch.choices and ch.choices[0].finish_reason for ch in chunks)
                    else:
                        r = c.completions.create(model=MODEL, prompt=f"Once upon a time {i}", max_tokens=16,
                                                 temperature=0.8, seed=i)
                        ok = r.choices[0].finish_reason in ("stop", "length")
                    with lock:
                        (done if ok else errors).append(i)
            except Exception as e:   # noqa: BLE001 - any failure is the test's finding
                with lock:
                    errors.append(f"{i}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=client, args=(i,)) for i in range(64)]
        t0 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join(240)
        elapsed = time.time() - t0
        self.assertEqual(errors, [])
        self.assertEqual(len(done), 128)
        after = SERVER.metrics()
        self.assertGreaterEqual(after['tern_requests_total{outcome="completed"}'] -
                                before['tern_requests_total{outcome="completed"}'], 128)
        self.assertEqual(SERVER.raw("GET", "/health")[0], 200)
        growth_mib = (SERVER.rss_kib() - rss_before) / 1024
        print(f"load: 128 requests from 64 clients in {elapsed:.1f} s, RSS {rss_before // 1024} MiB -> "
              f"{SERVER.rss_kib() // 1024} MiB", file=sys.stderr)
        self.assertLess(growth_mib, 256, "memory grew by more than 256 MiB under load")

    def test_1000_connections_at_once(self):
        if not raise_fd_limit(1200):
            self.skipTest("fewer than 1200 file descriptors allowed")
        statuses = connection_flood("127.0.0.1", SERVER.port, 1000, timeout=90)
        print(f"1000 connections: statuses {statuses}", file=sys.stderr)
        self.assertEqual(set(statuses) - {200, 503}, set(), statuses)   # every one answered, 503 when too many
        self.assertEqual(SERVER.raw("GET", "/health")[0], 200)
        r = SERVER.client().completions.create(model=MODEL, prompt="Once", max_tokens=4, temperature=0)
        self.assertEqual(r.usage.completion_tokens, 4)

    def test_listens_on_loopback_only(self):
        listening = []
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            if not os.path.exists(table):
                continue
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    local, state = fields[1], fields[3]
                    addr, port = local.split(":")
                    if state == "0A" and int(port, 16) == SERVER.port:
                        listening.append(addr)
        self.assertEqual(listening, ["0100007F"])   # 127.0.0.1, and no IPv6 or wildcard socket

    def test_metrics_text(self):
        m = SERVER.metrics()
        for name in ("tern_prompt_tokens_total", "tern_generated_tokens_total", "tern_requests_waiting",
                     "tern_kv_used", "tern_kv_capacity", 'tern_request_duration_seconds_bucket{le="+Inf"}',
                     "tern_time_to_first_token_seconds_count", "tern_time_per_output_token_seconds_sum",
                     "tern_queue_seconds_count"):
            self.assertIn(name, m)
        self.assertEqual(m["tern_kv_capacity"], CTX)


class Shutdown(unittest.TestCase):
    def test_sigterm_finishes_the_request_in_flight_and_exits_0(self):
        server = Server()
        try:
            c = server.client()
            stream = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=300, temperature=0,
                                          stream=True)
            first = next(iter(stream))
            server.proc.send_signal(signal.SIGTERM)
            rest = list(stream)
            self.assertEqual(rest[-1].choices[0].finish_reason, "length")
            text = first.choices[0].text + "".join(p.choices[0].text for p in rest)
            self.assertEqual(text, tern_run("Once upon a time", 300))
            self.assertEqual(server.proc.wait(30), 0)
            self.assertTrue(any("shutting down" in line for line in server.stderr_lines), server.stderr_lines)
        finally:
            server.stop()

    def test_sigint_with_nothing_running_exits_0_at_once(self):
        server = Server()
        try:
            t0 = time.time()
            server.proc.send_signal(signal.SIGINT)
            self.assertEqual(server.proc.wait(30), 0)
            self.assertLess(time.time() - t0, 10)
        finally:
            server.stop()


def main():
    global ARGS, SERVER
    parser = argparse.ArgumentParser()
    parser.add_argument("--tern", required=True)
    parser.add_argument("--shared", required=True)
    ARGS, rest = parser.parse_known_args()
    if not os.path.exists(os.path.join(ARGS.shared, "models", "gguf", MODEL_FILE)):
        print(f"skipped: {MODEL_FILE} not found under {ARGS.shared}", file=sys.stderr)
        return 77
    SERVER = Server()
    return run_cases_against(SERVER, rest)


if __name__ == "__main__":
    sys.exit(main())
