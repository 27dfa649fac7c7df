#!/usr/bin/env python3
"""`run --endpoint` against a warm server: its first token, whole process, <= 0.5 x a cold local `run`'s.

Both are timed the same way, from the process's start to the first byte of the answer on its stdout:
a cold local `localinfer run` (a new process: imports, resolving and verifying the model from the
cached digest, loading it, prefill, first token; the OS page cache is warm, as for any second run),
and `localinfer run --endpoint URL` (a new process: imports, /v1/models, the request, the server's
prefill, the first chunk) against llama-server holding SmolLM2 already (it answered one request).
Same prompt, greedy, -n 8, -t 2 on both sides. Rounds alternate the two; the verdict is the median
of the per-round ratios (the machine is shared).

    .venv/bin/python benchmarks/remote_first_token.py [--rounds 9] [--out FILE|-]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))

FLOOR = 0.5
PROMPT = "Write a haiku about the sea."


def first_byte_s(cmd: list[str], env: dict[str, str]) -> float:
    """Seconds from spawning ``cmd`` to the first byte on its stdout (it must exit 0)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    first = os.read(proc.stdout.fileno(), 1)
    t = time.perf_counter() - t0
    _, err = proc.communicate()
    if proc.returncode != 0 or not first:
        raise RuntimeError(f"{cmd[3:5]} failed ({proc.returncode}): {err.decode()[-400:]}")
    return t


def start_server(model: str, binary: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(binary), "-m", model, "--host", "127.0.0.1", "--port", str(port), "-c", "4096", "-np", "1",
                             "-t", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    for _ in range(900):
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, base + "/v1"
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("llama-server did not start")


def main() -> int:
    from models import smollm2_path

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--server", default=str(ROOT / "benchmarks" / ".build" / "bin" / "llama-server"))
    ap.add_argument("--out", default=str(HERE / "results" / f"remote-first-token-{dt.date.today()}.txt"))
    args = ap.parse_args()
    model = str(smollm2_path())
    common = ["-p", PROMPT, "-n", "8", "--temperature", "0", "--no-log"]
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "LOCALINFER_HOME": home}
        env.pop("LOCALINFER_ENDPOINT", None)
        local = [sys.executable, "-m", "localinfer", "run", "-t", "2", *common]  # the default model, smollm2:135m
        server, url = start_server(model, Path(args.server))
        remote = [sys.executable, "-m", "localinfer", "run", "--endpoint", url, *common]
        try:
            first_byte_s(local, env)  # untimed: the model's digest is verified once, then cached
            first_byte_s(remote, env)  # untimed: the server's first request
            rows = []
            for i in range(args.rounds):
                pair = (first_byte_s(local, env), first_byte_s(remote, env)) if i % 2 == 0 else tuple(
                    reversed((first_byte_s(remote, env), first_byte_s(local, env))))  # fmt: skip
                rows.append(pair)
                print(f"round {i + 1}: local {pair[0] * 1000:.0f} ms, endpoint {pair[1] * 1000:.0f} ms", file=sys.stderr)
        finally:
            server.terminate()
            server.wait()
    ratios = [r / lo for lo, r in rows]
    ratio = statistics.median(ratios)
    lines = [
        f"# remote_first_token.py {dt.datetime.now().isoformat(timespec='seconds')} on {platform.node()}: {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f} at the end; SmolLM2-135M Q4_1, -t 2, {args.rounds} rounds",
        f"cold local run, process start -> first answer byte: median {statistics.median(lo for lo, _ in rows) * 1000:.0f} ms "
        f"(min {min(lo for lo, _ in rows) * 1000:.0f})",
        f"run --endpoint (warm llama-server), same: median {statistics.median(r for _, r in rows) * 1000:.0f} ms "
        f"(min {min(r for _, r in rows) * 1000:.0f})",
        f"ratio endpoint / local: median {ratio:.3f} (per round {min(ratios):.3f}-{max(ratios):.3f}); floor <= {FLOOR} -> "
        f"{'PASS' if ratio <= FLOOR else 'FAIL'}",
        "per round (ms, local / endpoint): " + ", ".join(f"{lo * 1000:.0f}/{r * 1000:.0f}" for lo, r in rows),
    ]  # fmt: skip
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out != "-":
        Path(args.out).write_text(text)
    return 0 if ratio <= FLOOR else 1


if __name__ == "__main__":
    sys.exit(main())
