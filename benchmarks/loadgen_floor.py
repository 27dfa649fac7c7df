#!/usr/bin/env python3
"""The load generator of `bench --endpoint` is not the bottleneck: its floors, against a stub server.

The stub (tests/stubserver.py) runs in its own process on 127.0.0.1 and streams its answer at once
(raw asyncio: it costs next to nothing per request). Both processes read the same clock
(``time.perf_counter`` is CLOCK_MONOTONIC on Linux), so the stub's record of when it read each request
and wrote its first token can be set against the client's measurements.

1. throughput: the rate the client sustains. At a Poisson rate R (default 200 req/s, 2000 requests)
   the achieved request throughput must be >= 0.97 x R (what Poisson arrivals scaled to n/R allow)
   with no failure; at rate inf, the most it does (printed, no floor).
2. TTFT accuracy: with the stub waiting ``--first-delay`` (20 ms) before the first token, at rate R,
   per request: client TTFT - the stub's own time to first token (request read -> first token
   written) = what the client adds (sending, loopback, reading, its event loop). Floor: the median
   <= 1 ms. The mean, p90 and p99 are printed: on a 2-core machine shared with the stub (and, here,
   with other builds) their tail is the OS scheduling the two processes, so the load average is too.

    .venv/bin/python benchmarks/loadgen_floor.py [--rate 200] [--requests 2000] [--out FILE|-]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from localinfer.remote import loadtest, metrics  # noqa: E402
from localinfer.remote.connection import endpoint  # noqa: E402

THROUGHPUT_SHARE, TTFT_FLOOR_MS = 0.97, 1.0


def _stub(*args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, str(HERE.parent / "tests" / "stubserver.py"), *args], stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().strip()


def _traffic(url: str, n: int, rate: float, tokens: int, seed: int) -> tuple[list[dict], list, float, dict]:
    ep = endpoint(url)
    samples = loadtest.random_samples(n, 16, tokens, seed)
    bodies = [loadtest.body_for("stub", s, ignore_eos=True, temperature=0.0) for s in samples]
    outs, dur = loadtest.drive(ep, bodies, loadtest.arrival_offsets(n, rate, 1.0, seed), None)
    return bodies, outs, dur, metrics.compute(outs, dur, percentiles=(50, 90, 99))


def _pct(xs: list[float], p: float) -> float:
    return metrics.percentile(xs, p) or 0.0  # type: ignore[attr-defined]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=16, help="tokens the stub streams per answer")
    ap.add_argument("--first-delay", type=float, default=0.02)
    ap.add_argument("--out", default=str(HERE / "results" / f"loadgen-{dt.date.today()}.txt"))
    args = ap.parse_args()
    lines = [f"# loadgen_floor.py {dt.datetime.now().isoformat(timespec='seconds')} on {platform.node()}: "
             f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start",
             f"# stub: tests/stubserver.py, {args.tokens} tokens per answer; client: the load test's fast path (remote.fastclient)"]  # fmt: skip
    ok = True

    proc, url = _stub("--tokens", str(args.tokens))
    try:
        _traffic(url, 200, float("inf"), args.tokens, 9)  # warm up: connections, imports
        _, _, _, r = _traffic(url, args.requests, args.rate, args.tokens, 1)
        share = r["request_throughput"] / args.rate
        passed = share >= THROUGHPUT_SHARE and r["failed"] == 0
        ok &= passed
        lines.append(f"throughput at {args.rate:g} req/s (Poisson, {args.requests} requests): {r['request_throughput']:.1f} req/s achieved "
                     f"({share:.3f} of the rate; floor {THROUGHPUT_SHARE}), {r['failed']} failed, TTFT p50 {r['median_ttft_ms']:.2f} ms "
                     f"p99 {r['p99_ttft_ms']:.2f} ms -> {'PASS' if passed else 'FAIL'}")  # fmt: skip
        _, _, _, r = _traffic(url, args.requests, float("inf"), args.tokens, 2)
        lines.append(f"throughput at rate inf ({args.requests} requests at once): {r['request_throughput']:.1f} req/s, "
                     f"{r['output_throughput']:.0f} tok/s, {r['failed']} failed (no floor)")  # fmt: skip
    finally:
        proc.kill()

    proc, url = _stub("--tokens", str(args.tokens), "--first-delay", str(args.first_delay))
    try:
        _traffic(url, 100, float("inf"), args.tokens, 9)
        bodies, outs, _, r = _traffic(url, args.requests, args.rate, args.tokens, 3)
        with urllib.request.urlopen(url.rsplit("/v1", 1)[0] + "/timeline") as resp:
            timeline = json.load(resp)
        added, lag = [], []
        for body, o in zip(bodies, outs):
            t_recv, t_first = timeline[body["messages"][-1]["content"]]
            added.append((o.ttft - (t_first - t_recv)) * 1000.0)
            lag.append((o.start + o.ttft - t_first) * 1000.0)
        med, p90, p99 = (_pct(added, p) for p in (50, 90, 99))
        passed = med <= TTFT_FLOOR_MS
        ok &= passed
        lines.append(f"TTFT accuracy at {args.rate:g} req/s, stub first token after {args.first_delay * 1000:.0f} ms: client TTFT - stub's own "
                     f"= p50 {med:.3f} ms (floor <= {TTFT_FLOOR_MS} ms), mean {statistics.mean(added):.3f}, p90 {p90:.3f}, p99 {p99:.3f}, max {max(added):.3f} ms "
                     f"-> {'PASS' if passed else 'FAIL'}")  # fmt: skip
        lines.append(f"  of which on the receiving side (client timestamp - stub wrote the token): p50 {_pct(lag, 50):.3f} ms, "
                     f"p99 {_pct(lag, 99):.3f} ms; mean client TTFT {statistics.mean(o.ttft for o in outs) * 1000:.2f} ms")  # fmt: skip
    finally:
        proc.kill()
    lines.append(f"# load average at the end {os.getloadavg()[0]:.1f}; verdict: {'PASS' if ok else 'FAIL'}")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out != "-":
        Path(args.out).write_text(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
