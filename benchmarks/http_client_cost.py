#!/usr/bin/env python3
"""Do the two hand-written HTTP/1.1 clients pay for themselves over httpx? (issue 35 item 4)

1. The load test's fast path (``remote.fastclient``) against httpx (the same load test with
   ``LOCALINFER_LOADGEN_HTTPX=1``): the client's CPU time per streamed request, at rate inf against
   the stub server (tests/stubserver.py, its own process), rounds interleaved A/B in one process.
   "httpx" is the stack --endpoint uses: httpx2 where installed (Python >= 3.11), else httpx.
2. The resident client (``resident/client.py``, stdlib over a Unix socket) against importing httpx
   as well: what a `run --keep-alive` would pay at start-up, as the CPU time of a fresh interpreter
   importing the client alone and the client plus httpx, interleaved.

CPU time, not wall: the machine is shared; ratios are what to read.

    .venv/bin/python benchmarks/http_client_cost.py [--requests 1000] [--rounds 5] [--out FILE|-]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from localinfer.remote import loadtest  # noqa: E402
from localinfer.remote.connection import endpoint  # noqa: E402


def _stub(*args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, str(HERE.parent / "tests" / "stubserver.py"), *args],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def _load_cpu_ms(url: str, n: int, httpx: bool) -> tuple[float, int]:
    """Client CPU ms per request for n streamed requests at once (and how many failed)."""
    if httpx:
        os.environ["LOCALINFER_LOADGEN_HTTPX"] = "1"
    else:
        os.environ.pop("LOCALINFER_LOADGEN_HTTPX", None)
    ep = endpoint(url)
    samples = loadtest.random_samples(n, 16, 16, 1)
    bodies = [loadtest.body_for("stub", s, ignore_eos=True, temperature=0.0) for s in samples]
    t0 = time.process_time()
    outs, _ = loadtest.drive(ep, bodies, loadtest.arrival_offsets(n, float("inf"), 1.0, 1), None)
    cpu = time.process_time() - t0
    return cpu * 1000.0 / n, sum(1 for o in outs if not o.success)


def _import_cpu_ms(code: str) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(HERE.parent / "src")})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(HERE / "results" / f"http-client-cost-{dt.date.today()}.txt"))
    args = ap.parse_args()
    lines = [f"# http_client_cost.py {dt.datetime.now().isoformat(timespec='seconds')}: {os.cpu_count()} CPUs, "
             f"load average {os.getloadavg()[0]:.1f} at start"]  # fmt: skip

    proc, url = _stub("--tokens", "16")
    try:
        _load_cpu_ms(url, 200, False), _load_cpu_ms(url, 200, True)  # warm up: imports, connections
        fast, slow, failed = [], [], 0
        for _ in range(args.rounds):
            for httpx, acc in ((False, fast), (True, slow)):
                ms, bad = _load_cpu_ms(url, args.requests, httpx)
                acc.append(ms)
                failed += bad
    finally:
        proc.kill()
    ratio = statistics.median(s / f for f, s in zip(fast, slow))
    lines.append(f"load test, {args.requests} streamed requests (16 tokens) at once x {args.rounds} rounds, client CPU ms "
                 f"per request: fastclient median {statistics.median(fast):.3f}, httpx median {statistics.median(slow):.3f}; "
                 f"httpx / fastclient = {ratio:.2f} (per round: {', '.join(f'{s / f:.2f}' for f, s in zip(fast, slow))}); "
                 f"{failed} failed")  # fmt: skip

    alone, with_httpx = [], []
    for _ in range(args.rounds * 2):
        alone.append(_import_cpu_ms("import localinfer.resident.client"))
        # the HTTP stack --endpoint uses: httpx2 where installed, else httpx (remote.connection.httpx)
        with_httpx.append(_import_cpu_ms("import localinfer.resident.client\n"
                                         "from localinfer.remote.connection import httpx\nhttpx()"))
    lines.append(f"a fresh interpreter importing resident.client: CPU median {statistics.median(alone):.0f} ms; "
                 f"with the httpx stack as well: {statistics.median(with_httpx):.0f} ms "
                 f"(+{statistics.median(with_httpx) - statistics.median(alone):.0f} ms per `run --keep-alive`)")  # fmt: skip
    lines.append(f"# load average at the end {os.getloadavg()[0]:.1f}")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out != "-":
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
