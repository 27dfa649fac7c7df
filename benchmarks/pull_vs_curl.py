#!/usr/bin/env python3
"""How fast is `localinfer pull` compared with `curl -o` on the same URL?

A loopback fake Hub (tests/fakehub.py, the same server the tests use) serves one GGUF file (a synthetic
one of --size-mb MB by default, or --file). Runs alternate between:

* ``curl -s -o OUT URL``                        (no hashing, no fsync)
* the same, then ``fsync(OUT)``                  (no hashing; the bytes are on disk when it ends, as pull's are)
* ``python -m localinfer pull owner/repo:Q4_K_M``   (fresh store each run: HEAD + GET, sha256 while
                                                   writing, fsync, GGUF header check, rename, manifest)

Two figures per tool, medians over --runs:

* transfer: from the moment the server receives the GET for the file to the moment the process has
  exited (for localinfer this includes hashing, fsync, header validation and registering)
* end to end: the whole process, including interpreter start-up and metadata requests

and the throughput ratio localinfer/curl for each (target: >= 0.9 for the transfer).
``os.sync()`` runs before every run so one run's dirty pages do not slow the next one down.

    python benchmarks/pull_vs_curl.py [--size-mb 256] [--runs 5] [--file PATH] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakehub import FakeHub  # noqa: E402
from ggufsynth import gguf_bytes  # noqa: E402

REPO = "bench/Big-GGUF"
NAME = "big-Q4_K_M.gguf"


def _get_time(hub: FakeHub, since: int) -> float:
    for rec in hub.log[since:]:
        if rec["method"] == "GET" and NAME in rec["path"]:
            return rec["time"]
    raise RuntimeError("the server never saw the GET")


def run_curl(hub: FakeHub, url: str, out: Path, durable: bool = False) -> tuple[float, float]:
    os.sync()
    n = len(hub.log)
    t0 = time.monotonic()
    subprocess.run(["curl", "-s", "-f", "-o", str(out), url], check=True)
    if durable:  # what pull also does before it registers the file: wait until the bytes are on disk
        fd = os.open(out, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    t1 = time.monotonic()
    out.unlink()
    return t1 - _get_time(hub, n), t1 - t0


def run_pull(hub: FakeHub, home: Path, env: dict[str, str], sha256: str) -> tuple[float, float]:
    shutil.rmtree(home, ignore_errors=True)
    os.sync()
    n = len(hub.log)
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "localinfer", "pull", f"{REPO}:Q4_K_M"],
        env={**env, "LOCALINFER_HOME": str(home)},
        capture_output=True,
        text=True,
    )
    t1 = time.monotonic()
    if proc.returncode != 0:
        raise RuntimeError(f"pull failed ({proc.returncode}): {proc.stderr}")
    blob = home / "models" / "blobs" / f"sha256-{sha256}"
    assert blob.is_file(), "the pulled blob is missing"
    return t1 - _get_time(hub, n), t1 - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=256, help="size of the synthetic GGUF (default 256)")
    ap.add_argument("--file", type=Path, help="serve this GGUF instead of a synthetic one")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if shutil.which("curl") is None:
        print("curl is not installed", file=sys.stderr)
        return 2

    work = Path(tempfile.mkdtemp(prefix="pull-vs-curl-"))
    try:
        hub = FakeHub(work / "hub").start()
        data: Path | bytes = args.file if args.file else gguf_bytes(payload=os.urandom(args.size_mb * 1_000_000))
        f = hub.add_file(REPO, NAME, data)
        del data
        url = f"{hub.url}/{REPO}/resolve/main/{NAME}"
        env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_TOKEN")}
        env.update(HF_ENDPOINT=hub.url, HF_HOME=str(work / "hf"), HF_HUB_DISABLE_TELEMETRY="1")
        curl_t, curl_e2e, pull_t, pull_e2e, durable_t = [], [], [], [], []
        for _ in range(args.runs):
            a, b = run_curl(hub, url, work / "curl.out")
            curl_t.append(a)
            curl_e2e.append(b)
            durable_t.append(run_curl(hub, url, work / "curl.out", durable=True)[0])
            a, b = run_pull(hub, work / "home", env, f.sha256)
            pull_t.append(a)
            pull_e2e.append(b)
        hub.stop()

        mb = f.size / 1e6

        def rate(ts: list[float]) -> float:
            return mb / statistics.median(ts)

        result = {
            "file_mb": round(mb, 1),
            "runs": args.runs,
            "cpus": os.cpu_count(),
            "curl_transfer_mb_s": round(rate(curl_t), 1),
            "curl_fsync_transfer_mb_s": round(rate(durable_t), 1),
            "pull_transfer_mb_s": round(rate(pull_t), 1),
            "transfer_ratio": round(rate(pull_t) / rate(curl_t), 3),
            "transfer_ratio_vs_curl_fsync": round(rate(pull_t) / rate(durable_t), 3),
            "curl_end_to_end_mb_s": round(rate(curl_e2e), 1),
            "pull_end_to_end_mb_s": round(rate(pull_e2e), 1),
            "end_to_end_ratio": round(rate(pull_e2e) / rate(curl_e2e), 3),
            "curl_transfer_s": [round(t, 3) for t in curl_t],
            "curl_fsync_transfer_s": [round(t, 3) for t in durable_t],
            "pull_transfer_s": [round(t, 3) for t in pull_t],
            "pull_end_to_end_s": [round(t, 3) for t in pull_e2e],
        }
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print(f"file: {mb:.1f} MB over loopback, {args.runs} runs each, medians, {os.cpu_count()} CPUs")
            print(f"curl -o          transfer {result['curl_transfer_mb_s']:8.1f} MB/s   end to end {result['curl_end_to_end_mb_s']:8.1f} MB/s")
            print(f"curl -o + fsync  transfer {result['curl_fsync_transfer_mb_s']:8.1f} MB/s")
            print(f"localinfer pull  transfer {result['pull_transfer_mb_s']:8.1f} MB/s   end to end {result['pull_end_to_end_mb_s']:8.1f} MB/s")
            print(f"ratio (pull/curl) transfer {result['transfer_ratio']:.2f}   end to end {result['end_to_end_ratio']:.2f}   (target >= 0.90 for the transfer)")
            print(f"ratio (pull/curl+fsync) transfer {result['transfer_ratio_vs_curl_fsync']:.2f}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
