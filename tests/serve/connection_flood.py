"""Many HTTP connections at once against one server: each connects and sends a GET without waiting for
the others (non-blocking sockets on one selector), then every reply is read. Used by
tests/serve/test_openai_client.py and bench/serve_load.py (badreq)."""
import resource
import selectors
import socket
import time


def raise_fd_limit(need):
    """Raises this process's open-file limit to at least `need` where the hard limit allows; True if it is."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need and (hard == resource.RLIM_INFINITY or hard >= need):
        resource.setrlimit(resource.RLIMIT_NOFILE, (need if hard == resource.RLIM_INFINITY else min(hard, 4 * need), hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= need


def connection_flood(host, port, n=1000, timeout=90, path="/health"):
    """{status: count} over the n replies (0: no HTTP reply, the connection closed or failed)."""
    request = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    sel = selectors.DefaultSelector()
    replies = {}
    for i in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.connect_ex((host, port))
        sel.register(s, selectors.EVENT_WRITE, i)
        replies[i] = b""
    open_socks, deadline = n, time.time() + timeout
    while open_socks and time.time() < deadline:
        for key, events in sel.select(timeout=1):
            s, i = key.fileobj, key.data
            try:
                if events & selectors.EVENT_WRITE:
                    s.sendall(request)
                    sel.modify(s, selectors.EVENT_READ, i)
                    continue
                chunk = s.recv(65536)
            except OSError:
                chunk = b""
            if chunk:
                replies[i] += chunk
            else:
                sel.unregister(s)
                s.close()
                open_socks -= 1
    for key in list(sel.get_map().values()):
        key.fileobj.close()
    statuses = {}
    for data in replies.values():
        status = int(data.split(b" ")[1]) if data.startswith(b"HTTP/1.1 ") else 0
        statuses[status] = statuses.get(status, 0) + 1
    return statuses
