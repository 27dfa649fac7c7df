#!/usr/bin/env python3
"""Full offload: `localinfer bench -ngl 99` next to `llama-bench -ngl 99` on the same device, and
`run`/`batch` with every layer offloaded, as ratios to llama-bench (the floor: bench >= 0.95).

The device is a CUDA GPU (benchmarks/gpu_check.sh) or a ggml-rpc-server (``--rpc``: both tools
use the same server, one after the other). llama-bench must be built from the llama.cpp that the
llama-cpp-python under test vendors, with the same backend (build_rpc.sh BENCH=1, gpu_check.sh).

    python benchmarks/offload_vs_llama_bench.py --llama-bench benchmarks/.build/rpc/bin/llama-bench \\
        --python .venv-rpc/bin/python --rpc 127.0.0.1:50052
    python benchmarks/offload_vs_llama_bench.py --llama-bench B --python P --ngl 99 --run --batch

Rounds alternate the two tools. The verdict uses the ratio of each tool's best round: on a shared
machine other work only ever slows a round down, so the best round is the tool's own speed (the
median of the per-round ratios is printed too; a busy 2-core machine moves it by +-5 %).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FLOOR = 0.95
PROMPTS = ["Water boils at", "The moon is", "Cats like to", "Paris is the", "One plus one is", "Trees need", "Rain falls", "Bees make"]


def models(names: list[str], python: str) -> dict[str, str]:
    """name -> GGUF path: the two test models (from their packages, via tests/models.py) or paths."""
    out = {}
    for name in names:
        if name in ("smollm2", "gemma"):
            code = f"import sys; sys.path.insert(0, 'tests'); import models; print(models.{name}_path())"
            out[name] = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True, cwd=HERE.parent).stdout.strip()
        else:
            out[Path(name).stem] = name
    return out


def _localinfer(python: str, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([python, "-m", "localinfer", *args], capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"localinfer {args[0]} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def ours(a: argparse.Namespace, path: str) -> dict[str, float]:
    rpc = ["--rpc", a.rpc] if a.rpc else []
    out = _localinfer(a.python, "bench", "-m", path, "-ngl", str(a.ngl), "-t", str(a.threads), "-p", str(a.n_prompt),
                      "-n", str(a.n_gen), "-r", str(a.reps), "-o", "json", "--no-log", *rpc).stdout  # fmt: skip
    return {row["kind"]: row["avg_ts"] for row in json.loads(out)}


def theirs(a: argparse.Namespace, path: str) -> dict[str, float]:
    cmd = [a.llama_bench, "-m", path, "-ngl", str(a.ngl), "-t", str(a.threads), "-p", str(a.n_prompt),
           "-n", str(a.n_gen), "-r", str(a.reps), "-o", "json"] + (["--rpc", a.rpc] if a.rpc else [])  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"llama-bench failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    out = proc.stdout
    return {("pp" if int(r["n_gen"]) == 0 else "tg"): float(r["avg_ts"]) for r in json.loads(out[out.find("[") : out.rfind("]") + 1])}


def run_and_batch(a: argparse.Namespace, path: str, tmp: Path) -> dict[str, float]:
    """run's decode/prefill and batch --parallel 4's aggregate rate, every layer offloaded."""
    rpc = ["--rpc", a.rpc] if a.rpc else []
    common = ["-m", path, "-ngl", "all", "-t", str(a.threads), "--temperature", "0", "--no-log", *rpc]
    figures: dict[str, float] = {}
    if a.run:
        prompt = " ".join(["The history of the river and the town that grew on its banks."] * 24)
        data = json.loads(_localinfer(a.python, "run", "--json", "--raw", "--ignore-eos", "-n", str(a.n_gen), *common, "-p", prompt).stdout)
        figures.update(run_decode=data["timings"]["decode_tokens_per_s"], run_prefill=data["timings"]["prefill_tokens_per_s"],
                       run_layers=data["offload"]["gpu_layers"], layers=data["offload"]["layers"])  # fmt: skip
    if a.batch:
        prompts = tmp / "prompts.txt"
        prompts.write_text("".join(p + "\n" for p in PROMPTS))
        t0 = time.perf_counter()
        out = _localinfer(a.python, "batch", str(prompts), "--raw", "-n", "32", "--parallel", "4", *common).stdout
        tokens = sum(json.loads(line)["usage"]["completion_tokens"] for line in out.splitlines())
        figures["batch4_aggregate"] = tokens / (time.perf_counter() - t0)  # includes the load: a floor
    return figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--python", default=sys.executable, help="the python whose localinfer (and llama-cpp-python) is measured")
    ap.add_argument("--rpc", default=None, help="HOST:PORT[,...] of ggml-rpc-servers (both tools)")
    ap.add_argument("--ngl", type=int, default=99)
    ap.add_argument("--models", default="smollm2,gemma")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", "--n-prompt", type=int, default=128)
    ap.add_argument("-n", "--n-gen", type=int, default=32)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--run", action="store_true", help="also run's decode and prefill, every layer offloaded")
    ap.add_argument("--batch", action="store_true", help="also batch --parallel 4's aggregate rate")
    ap.add_argument("--expect-layers", choices=("all", "none"), help="with --run: fail unless run offloaded all (none) of the layers")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    print(f"llama-bench {a.llama_bench} vs localinfer bench ({a.python}); -ngl {a.ngl}, -t {a.threads}, "
          f"-p {a.n_prompt}, -n {a.n_gen}, -r {a.reps}, {a.rounds} alternating rounds" + (f", --rpc {a.rpc}" if a.rpc else ""))  # fmt: skip
    verdict = True
    for name, path in models(a.models.split(","), a.python).items():
        rounds = []
        for i in range(a.rounds):
            load = os.getloadavg()[0]
            rounds.append((theirs(a, path), ours(a, path)))
            print(f"  {name} round {i + 1} (load {load:.1f}): " + ", ".join(
                f"{k} llama-bench {rounds[-1][0][k]:.1f} ours {rounds[-1][1][k]:.1f}" for k in ("pp", "tg")), file=sys.stderr)  # fmt: skip
        print(f"\n{name}: {path}")
        print("| test | llama-bench t/s (best) | localinfer t/s (best) | ratio of bests | ratio (median) | per round |")
        print("| ---- | ---------------------: | --------------------: | -------------: | -------------: | --------- |")
        native = {}
        for kind, size in (("pp", a.n_prompt), ("tg", a.n_gen)):
            ratios = [o[kind] / t[kind] for t, o in rounds]
            native[kind], best = max(t[kind] for t, _ in rounds), max(o[kind] for _, o in rounds)
            verdict &= best / native[kind] >= FLOOR
            print(f"| {kind}{size:<4} | {native[kind]:22.2f} | {best:21.2f} | {best / native[kind]:14.3f} | "
                  f"{statistics.median(ratios):14.3f} | {', '.join(f'{r:.3f}' for r in ratios)} |")  # fmt: skip
        if a.run or a.batch:
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                f = run_and_batch(a, path, Path(tmp))
            if a.run and a.expect_layers:
                verdict &= f["run_layers"] == (f["layers"] if a.expect_layers == "all" else 0)
            if a.run:
                print(f"run: {f['run_layers']}/{f['layers']} layers offloaded; decode {f['run_decode']:.2f} t/s = "
                      f"{f['run_decode'] / native['tg']:.3f} x llama-bench tg (after its prompt, not at depth 0); prefill {f['run_prefill']:.2f} t/s = "
                      f"{f['run_prefill'] / native['pp']:.3f} x llama-bench pp (a different prompt length)")  # fmt: skip
            if a.batch:
                print(f"batch --parallel 4: {f['batch4_aggregate']:.2f} t/s aggregate, load included "
                      f"= {f['batch4_aggregate'] / native['tg']:.2f} x llama-bench tg (one sequence)")  # fmt: skip
    print(f"\nfloor bench >= {FLOOR} x llama-bench (pp and tg, best rounds){', layers as expected' if a.expect_layers else ''}: "
          f"{'met' if verdict else 'NOT met'}; "
          f"{time.perf_counter() - t_start:.0f} s, load now {os.getloadavg()[0]:.1f}")  # fmt: skip
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
