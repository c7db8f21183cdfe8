#!/usr/bin/env python3
"""A slowloris and a header flood against a running `tern serve` at once, while a well-behaved client times
GET /health and a small completion every --interval seconds (and for --quiet seconds before, with no attack,
to compare). Prints one JSON object (and, with --table, a Markdown table): each probe's p50/p99/max latency
and failures, the server's resident memory before the attack (after the quiet probes), at its peak and after
(from /proc/PID/status), the sockets the slowloris held, and what the flood's heads were answered.

  serve_attack.py --port P --pid PID [--api-key KEY] [--model NAME] [--duration 20] [--slowloris 300]
                  [--flood-connections 4] [--flood-headers 4000] [--flood-header-bytes 8000] [--table]

The flood repeats (a round: --flood-connections heads of --flood-headers fields each) until the window ends;
the slowloris connections drip a header byte every --drip seconds, and one the server closes (its head
deadline) is replaced by a new one, so --slowloris sockets press on the server all the time. Only the
standard library; every socket goes to --host (default 127.0.0.1) and every wait is bounded by --timeout.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "serve"))
from attack_clients import RepeatedFlood, RssSampler, Slowloris, rss_kib, small_completion, timed_request  # noqa: E402
from connection_flood import raise_fd_limit  # noqa: E402


def latency_summary(samples):
    """p50/p99/max in ms over the answered (status 200) probes, and how many were not."""
    ok = sorted(t * 1e3 for status, t in samples if status == 200)
    failed = [status for status, _ in samples if status != 200]
    if not ok:
        return {"n": len(samples), "failures": len(failed), "failure_statuses": failed}
    p99 = ok[min(len(ok) - 1, int(round(0.99 * (len(ok) - 1))))]
    return {"n": len(samples), "failures": len(failed), "failure_statuses": failed[:20],
            "p50_ms": round(statistics.median(ok), 1), "p99_ms": round(p99, 1), "max_ms": round(ok[-1], 1)}


def probe_once(args, health, completion):
    health.append(timed_request(args.host, args.port, "GET", "/health", timeout=args.timeout))
    completion.append(timed_request(args.host, args.port, "POST", "/v1/completions", small_completion(args.model),
                                    args.api_key, timeout=args.timeout))


def quiet_probes(args):
    """The same probes with no attack, for --quiet seconds: the latencies the attack is compared with. They
    also make the server allocate what a completion needs, so RSS 'before' is that of a server in use."""
    health, completion = [], []
    t_end = time.monotonic() + args.quiet
    while True:
        tick = time.monotonic()
        probe_once(args, health, completion)
        if time.monotonic() >= t_end:
            return health, completion
        time.sleep(max(0.0, args.interval - (time.monotonic() - tick)))


def attack(args):
    if not raise_fd_limit(2 * args.slowloris + 64):
        raise SystemExit(f"serve_attack: fewer than {2 * args.slowloris + 64} file descriptors allowed")
    quiet_health, quiet_completion = quiet_probes(args)
    rss_before = rss_kib(args.pid) if args.pid else 0
    health, completion, held = [], [], []
    with RssSampler(args.pid) as sampler:   # pid 0: nothing sampled
        slowloris = Slowloris(args.host, args.port, args.slowloris, args.drip, replace=True).start()
        flood = RepeatedFlood(args.host, args.port, args.flood_connections, args.flood_headers,
                              args.flood_header_bytes, args.timeout, args.max_flood_rounds)
        try:
            time.sleep(0.5)   # the slowloris connected and dripping before the first probe
            flood.start()
            t_end = time.monotonic() + args.duration
            while time.monotonic() < t_end:
                tick = time.monotonic()
                held.append(slowloris.held())
                probe_once(args, health, completion)
                time.sleep(max(0.0, args.interval - (time.monotonic() - tick)))
            held_end = slowloris.held()
            closed_statuses = slowloris.statuses()
        finally:
            flood.stop()
            slowloris.stop()
    time.sleep(args.settle)
    return {
        "server": f"{args.host}:{args.port}",
        "duration_s": args.duration,
        "interval_s": args.interval,
        "quiet_s": args.quiet,
        "quiet_health": latency_summary(quiet_health),
        "quiet_completion": latency_summary(quiet_completion),
        "health": latency_summary(health),
        "completion": latency_summary(completion),
        "slowloris": {"sockets": args.slowloris, "drip_interval_s": args.drip, "opened": slowloris.opened(),
                      "held_min": min(held, default=0), "held_max": max(held, default=0), "held_at_end": held_end,
                      "connect_failures": slowloris.connect_failures,
                      "closed_by_server": {str(k): v for k, v in sorted(closed_statuses.items())}},
        "flood": {"connections": args.flood_connections, "headers": args.flood_headers,
                  "header_bytes": args.flood_header_bytes, "rounds": flood.rounds,
                  "mib_sent": round(flood.bytes_sent / 2**20, 1),
                  "statuses": {str(k): v for k, v in sorted(flood.statuses.items())}},
        "rss_mib": ({"before": round(rss_before / 1024, 1), "peak": round(sampler.peak_kib / 1024, 1),
                     "after": round(rss_kib(args.pid) / 1024, 1)} if args.pid else None),
    }


def table(result):
    rows = ["| probe | answered | failures | p50 ms | p99 ms | max ms |", "|---|---|---|---|---|---|"]
    for name, label in (("quiet_health", "/health, no attack"), ("quiet_completion", "completion, no attack"),
                        ("health", "/health, under attack"), ("completion", "completion, under attack")):
        s = result[name]
        rows.append(f"| {label} | {s['n'] - s['failures']} | {s['failures']} | {s.get('p50_ms', '-')} | "
                    f"{s.get('p99_ms', '-')} | {s.get('max_ms', '-')} |")
    sl, fl, rss = result["slowloris"], result["flood"], result["rss_mib"]
    rows.append("")
    rows.append(f"slowloris: {sl['sockets']} sockets kept dripping ({sl['opened']} opened in all), held by the "
                f"server {sl['held_min']} to {sl['held_max']} at the probes; closed by the server with "
                f"{sl['closed_by_server']}")
    rows.append(f"header flood: {fl['rounds']} rounds of {fl['connections']} heads, {fl['mib_sent']} MiB sent, "
                f"answers {fl['statuses']}")
    if rss:
        rows.append(f"server RSS: {rss['before']} MiB before, {rss['peak']} MiB peak, {rss['after']} MiB after")
    return "\n".join(rows)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--pid", type=int, default=0, help="the server's process id, for its resident memory")
    p.add_argument("--api-key", default=os.environ.get("TERN_API_KEY", ""))
    p.add_argument("--model", default=None, help="the completion's model field (default: none, the server's)")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of attack")
    p.add_argument("--quiet", type=float, default=5.0, help="seconds of probes before the attack")
    p.add_argument("--interval", type=float, default=0.2)
    p.add_argument("--slowloris", type=int, default=300)
    p.add_argument("--drip", type=float, default=1.0, help="seconds between a slowloris socket's bytes")
    p.add_argument("--flood-connections", type=int, default=4)
    p.add_argument("--flood-headers", type=int, default=4000)
    p.add_argument("--flood-header-bytes", type=int, default=8000)
    p.add_argument("--max-flood-rounds", type=int, default=100000)
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--settle", type=float, default=2.0, help="seconds after the attack before RSS 'after'")
    p.add_argument("--table", action="store_true")
    args = p.parse_args()
    result = attack(args)
    print(json.dumps(result))
    if args.table:
        print(table(result))


if __name__ == "__main__":
    main()
