#!/usr/bin/env python3
"""The cost of switching models behind one `localinfer serve` (no -m; issue 38). Floors:

- a request for an unloaded model pays its load once: TTFT <= load time + 1.2 x the TTFT of the same
  request once the model is loaded (load time: what the server logs, "loaded NAME in X s");
- a loaded model is not slowed by another one loading: its tokens per second while the other loads
  are >= 0.9 x its tokens per second alone, measured in one run.

Two installed models (SmolLM2 135M as ``smol``, Gemma-3 270M base as ``gemma``; the test packages'
files, registered in a temporary home). Each round: gemma cold (unloaded with Ollama's
``keep_alive: 0``), then warm 5 times (their median); then smol streams a long answer alone, and again while gemma
loads (unloaded first): smol's tokens/s inside gemma's load window vs alone. Ratios are medians over
rounds. The report (load average before and after) goes to
benchmarks/results/serve-switching-YYYY-MM-DD.txt (--out FILE; --out - for stdout).

    .venv/bin/python benchmarks/serve_switching.py              # 3 rounds
    .venv/bin/python benchmarks/serve_switching.py --rounds 1   # a quick proof that it runs
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))
LOADED = re.compile(r"loaded (\S+) in ([\d.]+) s")


class Server:
    def __init__(self, home: Path, *args: str) -> None:
        env = {**os.environ, "LOCALINFER_HOME": str(home), "HF_HUB_OFFLINE": "1"}
        cmd = [sys.executable, "-m", "localinfer", "serve", "--port", "0", "--no-log", *args]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        self.port: int | None = None
        threading.Thread(target=self._read, daemon=True).start()
        while self.port is None:
            if self.proc.poll() is not None:
                sys.exit("serve did not start:\n" + "".join(self.lines))
            time.sleep(0.1)

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))

    def load_s(self, name: str, after: int) -> float:
        """The load time the server logged for ``name`` after line ``after``."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for line in self.lines[after:]:
                m = LOADED.search(line)
                if m and m.group(1) == name:
                    return float(m.group(2))
            time.sleep(0.05)
        raise RuntimeError(f"no load of {name} logged:\n" + "".join(self.lines))

    def post(self, path: str, body: dict) -> dict:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        assert resp.status == 200, data
        return json.loads(data)

    def stream(self, model: str, prompt: str, n: int) -> tuple[float, list[float]]:
        """(time to the first token, the arrival time of every chunk) of one streamed completion."""
        body = {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True, "ignore_eos": True,
                "cache_prompt": False}  # fmt: skip
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        t0 = time.perf_counter()
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        times = []
        for line in resp:
            if line.startswith(b"data: {") and json.loads(line[6:])["choices"][0]["text"]:
                times.append(time.perf_counter())
        return times[0] - t0, times

    def unload(self, model: str) -> None:
        self.post("/api/generate", {"model": model, "keep_alive": 0})
        time.sleep(0.5)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", "-t", default="2")
    parser.add_argument("--out", default=str(HERE / "results" / f"serve-switching-{dt.date.today()}.txt"))
    args = parser.parse_args()
    import models

    load_before = os.getloadavg()
    home = Path(tempfile.mkdtemp(prefix="switching-"))
    env = {**os.environ, "LOCALINFER_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    for path, name in ((models.smollm2_path(), "smol"), (models.gemma_path(), "gemma")):
        subprocess.run([sys.executable, "-m", "localinfer", "pull", str(path), "--name", name], env=env, check=True, capture_output=True)
    s = Server(home, "-np", "2", "-c", "1024", "-t", args.threads, "--keep-alive", "-1")
    cold_rows, ratio_rows = [], []
    try:
        s.stream("smol", "Warm up:", 2)
        for r in range(args.rounds):
            mark = len(s.lines)
            cold, _ = s.stream("gemma", f"Round {r}. The capital of France is", 8)
            load = s.load_s("gemma", mark)
            warm = statistics.median(s.stream("gemma", f"Round {r}. The capital of France is", 8)[0] for _ in range(5))
            cold_rows.append((cold, load, warm, cold / (load + 1.2 * warm)))
            _, alone = s.stream("smol", f"Round {r}. A long story:", 160)
            s.unload("gemma")
            mark = len(s.lines)
            out: dict[str, list[float]] = {}
            reader = threading.Thread(target=lambda: out.setdefault("smol", s.stream("smol", f"Round {r}. A long story:", 160)[1]))
            reader.start()
            time.sleep(1.0)  # smol is decoding
            t_ask = time.perf_counter()
            gemma_ttft, _ = s.stream("gemma", "Hi", 1)
            t_loaded = t_ask + gemma_ttft
            reader.join()
            during = [t for t in out["smol"] if t_ask <= t <= t_loaded]
            rate_alone = (len(alone) - 1) / (alone[-1] - alone[0])
            rate_during = len(during) / (t_loaded - t_ask)
            ratio_rows.append((s.load_s("gemma", mark), rate_alone, rate_during, rate_during / rate_alone))
            s.unload("gemma")  # the next round starts cold
    finally:
        s.stop()
    load_after = os.getloadavg()
    lines = [f"serve switching (issue 38), {dt.datetime.now().isoformat(timespec='minutes')}, -t {args.threads}, "
             f"{args.rounds} round(s); load average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
             f"({os.cpu_count()} CPUs)", "",
             "cold TTFT vs load + 1.2 x warm TTFT (gemma; floor: ratio <= 1.0)",
             "  cold_s   load_s   warm_s   cold/(load+1.2warm)   cold-load-warm (ms)"]  # fmt: skip
    lines += [f"  {c:6.3f}   {lo:6.3f}   {w:6.3f}   {x:19.3f}   {1e3 * (c - lo - w):19.1f}" for c, lo, w, x in cold_rows]
    lines += [f"  median ratio {statistics.median(x for *_, x in cold_rows):.3f}; median cold-load-warm "
              f"{1e3 * statistics.median(c - lo - w for c, lo, w, _ in cold_rows):.1f} ms (the load as the server logs it, in 10 ms steps)", "",
              "smol tok/s while gemma loads vs alone (floor: ratio >= 0.9)",
              "  gemma_load_s   alone_tok_s   during_tok_s   ratio"]  # fmt: skip
    lines += [f"  {lo:12.2f}   {a:11.2f}   {d:12.2f}   {x:.2f}" for lo, a, d, x in ratio_rows]
    lines += [f"  median ratio {statistics.median(x for *_, x in ratio_rows):.2f}"]
    text = "\n".join(lines) + "\n"
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text)
        sys.stdout.write(text + f"(written to {args.out})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
