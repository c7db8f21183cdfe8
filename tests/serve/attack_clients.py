"""Hostile and well-behaved HTTP clients on raw sockets, for attacking `tern serve`: a response reader that
keeps every header line as sent, a slowloris (many connections dripping an unfinished head), a header flood
(huge heads as fast as the server takes them), a timed well-behaved client, and a process's resident memory
from /proc. Used by tests/serve/test_hardening.py and bench/serve_attack.py.

Only the standard library. Every socket has a timeout and every loop a bound in count and time."""
import json
import selectors
import socket
import threading
import time


def rss_kib(pid):
    """VmRSS of a process in KiB (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class RssSampler:
    """Samples a process's VmRSS every `interval` seconds on a thread while in a `with` block; peak_kib after."""

    def __init__(self, pid, interval=0.05):
        self.pid, self.interval = pid, interval
        self.peak_kib = rss_kib(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(self.interval):
            self.peak_kib = max(self.peak_kib, rss_kib(self.pid))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)
        self.peak_kib = max(self.peak_kib, rss_kib(self.pid))


class Response:
    """One HTTP response as it came: status, every header line in order (names lower-cased), the body."""

    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    def header_values(self, name):
        return [v for n, v in self.headers if n == name.lower()]

    def json(self):
        return json.loads(self.body.decode("utf-8", "replace"))


class RawConnection:
    """A client socket that sends exactly the bytes given and reads responses one by one, so that what a
    library would tidy up (duplicate headers, pipelining, a close instead of an answer) stays visible."""

    def __init__(self, host, port, timeout):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect((host, port))
        self.buf = b""

    def send(self, data):
        self.sock.sendall(data.encode() if isinstance(data, str) else data)

    def close(self):
        self.sock.close()

    def receive(self):
        """Reads what has come into buf (waiting up to the timeout); False when the server closed (or reset)
        the connection."""
        try:
            chunk = self.sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return False
        self.buf += chunk
        return bool(chunk)

    def _take_until(self, marker, limit=1 << 20):
        while marker not in self.buf:
            if len(self.buf) > limit or not self.receive():
                return None
        head, _, self.buf = self.buf.partition(marker)
        return head

    def _take(self, n):
        while len(self.buf) < n:
            if not self.receive():
                return None
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_response(self):
        """The next Response, or None when the connection closed before a whole one came (socket.timeout
        propagates: a server that neither answers nor closes is a hang, the caller's finding)."""
        head = self._take_until(b"\r\n\r\n")
        if head is None:
            return None
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise ValueError(f"not an HTTP status line: {lines[0]!r}")
        headers = []
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers.append((name.strip().lower(), value.strip()))
        response = Response(int(parts[1]), headers, b"")
        if "chunked" in ",".join(response.header_values("transfer-encoding")).lower():
            body = []
            while True:
                size_line = self._take_until(b"\r\n")
                if size_line is None:
                    return None
                size = int(size_line.split(b";")[0], 16)
                data = self._take(size + 2)
                if data is None:
                    return None
                if size == 0:
                    break
                body.append(data[:-2])
            response.body = b"".join(body)
        elif response.header_values("content-length"):
            body = self._take(int(response.header_values("content-length")[0]))
            if body is None:
                return None
            response.body = body
        else:   # no framing: the body runs to the close
            while self.receive():
                pass
            response.body, self.buf = self.buf, b""
        return response

    def receive_until(self, marker):
        """Reads until buf holds `marker`; False if the connection closed first."""
        while marker not in self.buf:
            if not self.receive():
                return False
        return True

    def closed_by_server(self, within):
        """True if the server closes the connection within `within` seconds (bytes it sends first are kept)."""
        deadline = time.monotonic() + within
        old = self.sock.gettimeout()
        try:
            while time.monotonic() < deadline:
                self.sock.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    if not self.receive():
                        return True
                except socket.timeout:
                    return False
            return False
        finally:
            self.sock.settimeout(old)


def request_bytes(method, path, headers=(), body=b"", host="x"):
    """An HTTP/1.1 request as bytes: the request line, Host (unless host is None), headers, Content-Length
    when there is a body."""
    if isinstance(body, str):
        body = body.encode()
    lines = [f"{method} {path} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {host}")
    lines += [f"{n}: {v}" for n, v in headers]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def first_status(data):
    """The status code at the start of what a server sent, 0 if it sent no status line."""
    if data.startswith(b"HTTP/1.") and len(data) >= 12 and data[9:12].isdigit():
        return int(data[9:12])
    return 0


class Slowloris:
    """`count` connections that each send a request line and then drip one byte of an endless header every
    `drip_interval` seconds, all on one thread. Tracks for each when the server closed it and what it answered;
    `held()` is how many the server still keeps open. With `replace`, a connection the server closes is
    replaced by a new one (at most `count` x 20 in all), so the attack keeps `count` going."""

    def __init__(self, host, port, count, drip_interval=0.5, replace=False):
        self.host, self.port, self.count, self.drip_interval = host, port, count, drip_interval
        self.replace = replace
        self.opened_at = {}     # index -> time.monotonic() at connect
        self.closed_at = {}     # index -> when the server closed it (or refused the connection)
        self.answers = {}       # index -> the bytes the server sent before closing
        self.connect_failures = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._sel = selectors.DefaultSelector()

    def start(self):
        for _ in range(self.count):
            self._open()
        self._thread.start()
        return self

    def _open(self):
        i = len(self.opened_at)
        s = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.connect_ex((self.host, self.port))
        self.answers[i] = b""
        with self._lock:
            self.opened_at[i] = time.monotonic()
        self._sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE, i)

    def _closed(self, s, i):
        self._sel.unregister(s)
        s.close()
        with self._lock:
            self.closed_at[i] = time.monotonic()
        if self.replace and not self._stop.is_set() and len(self.opened_at) < 20 * self.count:
            self._open()

    def _run(self):
        started = {}   # index -> True once its request line went out
        next_drip = time.monotonic() + self.drip_interval
        while not self._stop.is_set() and self._sel.get_map():
            now = time.monotonic()
            for key, events in self._sel.select(timeout=max(0.0, min(0.05, next_drip - now))):
                s, i = key.fileobj, key.data
                try:
                    if events & selectors.EVENT_READ:
                        chunk = s.recv(4096)
                        if not chunk:
                            self._closed(s, i)
                            continue
                        self.answers[i] += chunk
                    if events & selectors.EVENT_WRITE and i not in started:
                        s.send(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Drip: ")
                        started[i] = True
                        self._sel.modify(s, selectors.EVENT_READ, i)
                except BlockingIOError:
                    pass
                except OSError:
                    if i not in started:
                        self.connect_failures += 1
                    self._closed(s, i)
            if time.monotonic() >= next_drip:
                next_drip += self.drip_interval
                for key in list(self._sel.get_map().values()):
                    if key.data in started:
                        try:
                            key.fileobj.send(b"a")
                        except BlockingIOError:
                            pass
                        except OSError:
                            self._closed(key.fileobj, key.data)

    def held(self):
        with self._lock:
            return len(self.opened_at) - len(self.closed_at)

    def opened(self):
        with self._lock:
            return len(self.opened_at)

    def statuses(self):
        """{status: count} over the connections the server closed (0: closed without an answer)."""
        out = {}
        with self._lock:
            closed = list(self.closed_at)
        for i in closed:
            code = first_status(self.answers[i])
            out[code] = out.get(code, 0) + 1
        return out

    def wait_all_closed(self, seconds):
        deadline = time.monotonic() + seconds
        while self.held() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.held() == 0

    def stop(self):
        self._stop.set()
        self._thread.join(10)
        for key in list(self._sel.get_map().values()):
            key.fileobj.close()
        self._sel.close()


def flood_one_head(host, port, header_count, header_bytes, timeout):
    """One connection that sends a GET /health head of `header_count` headers of `header_bytes` each, as fast
    as the server reads, then reads the answer. (status, bytes sent); status 0: closed without an answer.
    A server that stops reading makes the send time out; the answer is read then."""
    sock = socket.create_connection((host, port), timeout=timeout)
    sent = 0
    try:
        try:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            value = b"a" * header_bytes
            batch = 64
            for first in range(0, header_count, batch):
                chunk = b"".join(b"X-Flood-%d: %s\r\n" % (k, value)
                                 for k in range(first, min(first + batch, header_count)))
                sock.sendall(chunk)
                sent += len(chunk)
            sock.sendall(b"\r\n")
        except (OSError, socket.timeout):
            pass   # the server closed or stopped reading: what it answered is the finding
        data = b""
        try:
            while len(data) < 65536:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
                if b"\r\n\r\n" in data:
                    break
        except (OSError, socket.timeout):
            pass
        return first_status(data), sent
    finally:
        sock.close()


def header_flood(host, port, connections, header_count, header_bytes, timeout):
    """`connections` flood_one_head at once, on threads: [(status, bytes sent)] in connection order."""
    results = [(0, 0)] * connections

    def one(i):
        try:
            results[i] = flood_one_head(host, port, header_count, header_bytes, timeout)
        except OSError:
            results[i] = (0, 0)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout * 3)
    return results


class RepeatedFlood:
    """header_flood rounds one after another (`pause` seconds apart) on a thread until stop() or `max_rounds`:
    `statuses` {status: count} over every head, `bytes_sent`, `rounds`."""

    def __init__(self, host, port, connections, header_count, header_bytes, timeout, max_rounds=100_000, pause=0.0):
        self.args = (host, port, connections, header_count, header_bytes, timeout)
        self.max_rounds, self.pause = max_rounds, pause
        self.statuses, self.bytes_sent, self.rounds = {}, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set() and self.rounds < self.max_rounds:
            for status, sent in header_flood(*self.args):
                self.statuses[status] = self.statuses.get(status, 0) + 1
                self.bytes_sent += sent
            self.rounds += 1
            self._stop.wait(self.pause)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread.ident is not None:   # started
            self._thread.join(3 * self.args[-1] + 5)


def timed_request(host, port, method, path, body=None, api_key=None, timeout=30):
    """(status, seconds) of one request on a fresh connection, as a well-behaved client sends it;
    status 0 when no answer came within timeout."""
    headers = [("Content-Type", "application/json"), ("Connection", "close")]
    if api_key:
        headers.append(("Authorization", "Bearer " + api_key))
    data = request_bytes(method, path, headers, json.dumps(body) if body is not None else b"")
    t0 = time.monotonic()
    try:
        conn = RawConnection(host, port, timeout)
        try:
            conn.send(data)
            r = conn.read_response()
        finally:
            conn.close()
        return (r.status if r else 0), time.monotonic() - t0
    except (OSError, ValueError):
        return 0, time.monotonic() - t0


def small_completion(model=None):
    """The well-behaved client's completion: a few greedy tokens of a short prompt (model: the server's own
    when None)."""
    body = {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}
    if model:
        body["model"] = model
    return body
