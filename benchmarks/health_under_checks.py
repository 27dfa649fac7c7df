#!/usr/bin/env python3
"""/health latency of a real `serve` while hostile schemas and grammars are checked (issue 40): GIL or CPU?

Phases, each probing /health every 20 ms: idle; two CPU-burning processes outside the server (CPU
contention alone, no second thread in the server); clients posting hostile formats (the server's
worker thread checks them in Python, sharing the GIL with the event loop). If the third phase is
much slower than the second, the loop waits on the GIL, not only on the CPU. ``--gil-log FILE``
also starts a monitor thread inside the server (through a sitecustomize on PYTHONPATH) that logs
every wait > 40 ms for the GIL and where the other threads stood after it: a Python frame there
means hand-offs were slow, a C call (no frame change) means a call held the GIL.

    PYTHONPATH=src .venv/bin/python benchmarks/health_under_checks.py --rounds 2
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from models import smollm2_path  # noqa: E402
from test_serve_hostile_formats import HI, WIDE, _chain, _wide  # noqa: E402
from test_serve_security import _serve_process, _wait_ready, get  # noqa: E402

_MONITOR = '''import os, sys, threading, time, traceback
if "serve" in sys.argv:
    def _watch():
        out = open(os.environ["HEALTH_GIL_LOG"], "a")
        last = time.perf_counter()
        while True:
            time.sleep(0.002)
            now = time.perf_counter()
            if now - last > 0.04:
                lines = [f"waited {(now - last) * 1e3:.0f} ms for the GIL"]
                for tid, frame in sys._current_frames().items():
                    if tid != threading.get_ident():
                        st = traceback.extract_stack(frame)[-3:]
                        lines.append("  " + " <- ".join(f"{os.path.basename(s.filename)}:{s.lineno} {s.name}" for s in reversed(st)))
                out.write("\\n".join(lines) + "\\n")
                out.flush()
                now = time.perf_counter()
            last = now
    threading.Thread(target=_watch, daemon=True).start()
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--probes", type=int, default=50)
    ap.add_argument("--gil-log", help="log the server's waits for the GIL here")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="health-checks-"))
    if args.gil_log:
        (tmp / "site").mkdir()
        (tmp / "site" / "sitecustomize.py").write_text(_MONITOR)
        os.environ["PYTHONPATH"] = f"{os.environ.get('PYTHONPATH', '')}:{tmp / 'site'}"
        os.environ["HEALTH_GIL_LOG"] = str(Path(args.gil_log).resolve())
    bodies = [{"grammar": _wide(4000)}, {"json_schema": {"type": "string", "pattern": WIDE * 12000}}, {"grammar": _chain(4000)}]
    proc, port = _serve_process(smollm2_path(), tmp / "home", None)
    _wait_ready(proc, port)
    stop = threading.Event()

    def probes(n: int) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            assert get(port)[0] == 200
            out.append((time.perf_counter() - t0) * 1e3)
            time.sleep(0.02)
        return out

    def show(name: str, lat: list[float]) -> None:
        lat = sorted(lat)
        print(f"{name:<30} {len(lat):3d} probes: median {statistics.median(lat):6.1f} ms, p90 {lat[int(len(lat) * 0.9)]:6.1f}, "
              f"max {lat[-1]:6.1f}; load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip

    def poster(start: int) -> None:
        k = start
        while not stop.is_set():
            fields = dict(bodies[k % len(bodies)])
            if "grammar" in fields:  # a new text each time: never from the server's compile cache
                fields["grammar"] = fields["grammar"].replace('"x', f'"y{k}x')
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            conn.request("POST", "/v1/chat/completions", json.dumps({"messages": HI, "max_tokens": 1, **fields}),
                         {"Content-Type": "application/json"})  # fmt: skip
            conn.getresponse().read()
            k += 2

    print(f"# {time.strftime('%Y-%m-%d %H:%M')} UTC, {os.cpu_count()} CPUs")
    try:
        for _ in range(args.rounds):
            show("idle", probes(args.probes))
            hogs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(2)]
            try:
                time.sleep(0.5)
                show("2 CPU hogs outside the server", probes(args.probes))
            finally:
                for h in hogs:
                    h.kill()
                    h.wait()
            stop.clear()
            clients = [threading.Thread(target=poster, args=(i,), daemon=True) for i in range(2)]
            for c in clients:
                c.start()
            time.sleep(0.5)
            show("hostile formats, 2 clients", probes(args.probes))
            stop.set()
            for c in clients:
                c.join()
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
