#!/usr/bin/env python3
"""Embedding throughput: `localinfer embed` and `localinfer serve`'s /v1/embeddings against
llama.cpp's llama-server (``--embeddings --pooling mean``), and against embedding the same texts one
``llama_decode`` at a time. Same model, threads and pooling; inputs per second.

--texts short texts (about 12 tokens each, all different) are embedded, measured as:

* ``localinfer embed``: the command on a file of the texts; its own summary line's rate (the
  embedding, after the model loaded) - and the whole process's wall time, load included;
* ``serve``: one POST /v1/embeddings with every text, on a warm server (one warm-up request);
* ``llama-server``: the same request, its slots (--np) decoding the texts together in one unified
  KV cache, as ours does (``-np N --kv-unified -b/-ub = our embedding context``);
* ``one at a time``: in this process, our Embedder with one input per ``llama_decode``;
* ``engine``: in this process, our Embedder with all inputs at once (what the others wrap).

Servers are started once (idle, they take no CPU); each round runs every method in an order that
alternates; --rounds medians are reported. Floors: ``localinfer embed`` and ``serve`` >= 0.9x
llama-server; the engine batched >= 5x one at a time.

    .venv/bin/python benchmarks/embed_vs_native.py                          # SmolLM2, 256 texts, 3 rounds
    .venv/bin/python benchmarks/embed_vs_native.py --texts 16 --rounds 1    # a quick check that it runs
    .venv/bin/python benchmarks/embed_vs_native.py --model path/to/gemma.gguf -o json
"""

from __future__ import annotations

import argparse
import http.client
import json
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from serve_vs_native import NATIVE_BIN, WORDS, Server, default_model, free_port

SUMMARY = re.compile(r"embed: (\d+)/(\d+) inputs embedded.* · ([\d.]+) s · ([\d.]+) inputs/s")


def texts(n: int) -> list[str]:
    """``n`` distinct short sentences (about 12 tokens)."""
    return [f"Note {i}: " + " ".join(WORDS[(i * 11 + k * 3) % len(WORDS)] for k in range(8)) for i in range(n)]


def post(port: int, inputs: list[str]) -> float:
    """Seconds for one /v1/embeddings request with ``inputs`` (checked: one vector per input)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/embeddings", body=json.dumps({"input": inputs}), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    body = resp.read()
    dt = time.perf_counter() - t0
    if resp.status != 200:
        raise SystemExit(f"port {port}: HTTP {resp.status}: {body[:300]!r}")
    if len(json.loads(body)["data"]) != len(inputs):
        raise SystemExit(f"port {port}: the answer does not have {len(inputs)} vectors")
    return dt


def cli_rate(args: argparse.Namespace, path: Path) -> tuple[float, float]:
    """(inputs/s of the embedding as `localinfer embed` reports it, wall seconds of the process)."""
    cmd = [sys.executable, "-m", "localinfer", "embed", str(path), "-m", str(args.model), "-t", str(args.threads),
           "-c", str(args.ctx), "--no-log", "--offline", "-o", "/dev/null"]  # fmt: skip
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    m = SUMMARY.search(res.stderr)
    if res.returncode != 0 or m is None or m.group(1) != m.group(2):
        raise SystemExit(f"localinfer embed failed ({res.returncode}):\n{res.stderr[-2000:]}")
    return float(m.group(4)), wall


class InProcess:
    """Our Embedder on the model, loaded once: batched, and one input per llama_decode."""

    def __init__(self, args: argparse.Namespace, inputs: list[str]) -> None:
        from localinfer.engine.embed import Embedder
        from localinfer.engine.model import LlamaModel
        from localinfer.engine.types import LoadOptions

        self.model = LlamaModel(args.model, LoadOptions(n_ctx=256, n_threads=args.threads))
        self.embedder = Embedder(self.model, n_ctx=args.ctx, pooling="mean")
        self.tokens = [self.embedder.tokens_of(t)[0] for t in inputs]
        self.embedder.embed(self.tokens[:4])  # warm-up: the first decode of a context allocates

    def batched(self) -> float:
        t0 = time.perf_counter()
        self.embedder.embed(self.tokens)
        return time.perf_counter() - t0

    def one_at_a_time(self) -> float:
        t0 = time.perf_counter()
        for t in self.tokens:
            self.embedder.embed([t])
        return time.perf_counter() - t0

    def close(self) -> None:
        self.embedder.close()
        self.model.close()


def servers(args: argparse.Namespace) -> list[Server]:
    from localinfer.engine.backend import cpu_repack_enabled

    model, t = str(args.model), str(args.threads)
    repack = ["--repack"] if cpu_repack_enabled(None) else ["--no-repack"]  # as our engine does (README, AMX)
    ours = Server("serve", [sys.executable, "-m", "localinfer", "serve", "-m", model, "--port", str(free_port()), "-np", "1", "-c", "256",
                            "--embedding-ctx", str(args.ctx), "-t", t, "--no-log", "--offline"])  # fmt: skip
    native = Server("llama-server", [str(NATIVE_BIN / "llama-server"), "-m", model, "--port", str(free_port()), "--embeddings",
                                     "--pooling", "mean", "-np", str(args.np), "--kv-unified", "-c", str(args.np * 64),
                                     "-b", str(args.ctx), "-ub", str(args.ctx), "-t", t, "--no-webui", *repack])  # fmt: skip
    return [ours, native]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="GGUF (default: the SmolLM2 test model)")
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=512, help="our embedding context = llama-server's -b/-ub (tokens per decode)")
    ap.add_argument("--np", type=int, default=64, help="llama-server's slots (inputs it decodes together)")
    ap.add_argument("--no-cli", action="store_true", help="skip `localinfer embed` (it loads the model each round)")
    ap.add_argument("-o", "--output", choices=["text", "json"], default="text")
    args = ap.parse_args()
    args.model = args.model or default_model()
    inputs = texts(args.texts)
    tmp = Path(tempfile.mkdtemp(prefix="embed-bench-"))
    src = tmp / "texts.txt"
    src.write_text("\n".join(inputs) + "\n")
    running = servers(args)
    rates: dict[str, list[float]] = {}
    extra: dict[str, list[float]] = {"localinfer embed (process wall s)": []}
    local = None
    try:
        for s in running:
            s.start(tmp / f"{s.name}.log")
            post(s.port, inputs[:8])  # warm-up
        local = InProcess(args, inputs)
        methods = {s.name: (lambda s=s: post(s.port, inputs)) for s in running}
        methods["engine (batched)"] = local.batched
        methods["one at a time"] = local.one_at_a_time
        for r in range(args.rounds):
            order = list(methods) if r % 2 == 0 else list(reversed(methods))
            for name in order:
                rates.setdefault(name, []).append(len(inputs) / methods[name]())
            if not args.no_cli:
                rate, wall = cli_rate(args, src)
                rates.setdefault("localinfer embed", []).append(rate)
                extra["localinfer embed (process wall s)"].append(wall)
    finally:
        if local is not None:
            local.close()
        for s in running:
            s.stop()
    med = {k: statistics.median(v) for k, v in rates.items()}
    native = med["llama-server"]
    floors = {"serve / llama-server >= 0.9": med["serve"] / native, "engine / one at a time >= 5": med["engine (batched)"] / med["one at a time"]}
    if "localinfer embed" in med:
        floors["localinfer embed / llama-server >= 0.9"] = med["localinfer embed"] / native
    report = {"model": str(args.model), "texts": args.texts, "rounds": args.rounds, "threads": args.threads, "ctx": args.ctx,
              "np": args.np, "machine": platform.processor() or platform.machine(), "inputs_per_s": med, "rounds_inputs_per_s": rates,
              "ratios": floors, "extra": {k: statistics.median(v) for k, v in extra.items() if v}}  # fmt: skip
    if args.output == "json":
        print(json.dumps(report, indent=2))
        return
    print(f"{args.texts} texts · {args.model.name} · {args.threads} threads · embedding context {args.ctx} · median of {args.rounds}")
    for name, v in sorted(med.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<22} {v:9.1f} inputs/s")
    for k, v in report["extra"].items():
        print(f"  {k:<22} {v:9.2f}")
    for name, ratio in floors.items():
        need = float(name.rsplit(" ", 1)[1])
        print(f"  {name:<40} {ratio:6.2f}  {'ok' if ratio >= need else 'BELOW'}")


if __name__ == "__main__":
    main()
