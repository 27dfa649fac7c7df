#!/usr/bin/env python3
"""Where decode time goes, against llama-bench: our loop, llama_decode alone, and the sampler.

In one process, alternating with `llama-bench tg N @ dD` (same model, threads, depth, repacking):

* loop (sampled):  the engine's generate() with the default sampler chain (tok/s over tokens after the first)
* loop (greedy):   the same with temperature 0
* llama_decode:    the time inside llama_decode only (GenerationStats.decode_calls_s), same runs
* per token:       medians, inside generate() with the default chain: the time in llama_decode, the
                   time between two llama_decode calls (sampling + our Python), and of that the
                   llama_sampler_sample call alone. Medians of single tokens are steady where whole-run
                   tok/s drift by a few percent. (The sampler builds a candidate array of the whole
                   vocabulary for every token, with caches that llama_decode has just flushed;
                   llama-bench samples nothing.)
* sampler (warm):  the same call repeated on the same logits, for comparison

    .venv/bin/python benchmarks/decode_breakdown.py [-t 2] [--pairs 6] [-n 128] [-d 48]

The model is loaded as ``run`` loads it (localinfer.engine.model.LlamaModel), and llama-bench repacks
weights exactly when the engine does (engine.backend.cpu_repack_enabled: off on AMX CPUs, on
elsewhere; LOCALINFER_CPU_REPACK=1|0 decides for both).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import native  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", "-m", default=None)
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("-n", type=int, default=128, help="tokens generated")
    ap.add_argument("-d", type=int, default=48, help="depth: prompt tokens in the cache before decoding")
    args = ap.parse_args()
    model = args.model or native.default_model()

    from localinfer.engine.backend import cpu_repack_enabled, llama_cpp
    from localinfer.engine.model import LlamaModel
    from localinfer.engine.types import GenerationStats, LoadOptions
    from localinfer.request.sampling import SamplingOptions

    repack = cpu_repack_enabled(None)
    bench_args = ["-d", str(args.d)]
    m = LlamaModel(model, LoadOptions(n_ctx=4096, n_threads=args.threads))
    words = "Write a long story about a robot who learns to paint. Describe every painting in detail. "
    prompt = m.tokenize(words * (args.d // 8 + 2))[: args.d]

    def loop(sampling: SamplingOptions) -> tuple[float, float]:
        m.reset()
        st = GenerationStats()
        for _ in m.generate(prompt, sampling, st, max_tokens=args.n + 1, ignore_eos=True):
            pass
        n = st.completion_tokens - 1
        return n / st.decode_s, n / st.decode_calls_s

    def sampler_us(sampling: SamplingOptions, n: int = 64) -> float:
        m.reset()
        m._decode(prompt)
        chain, _ = m.new_sampler(sampling, prompt)
        try:
            t0 = time.perf_counter()
            for _ in range(n):
                llama_cpp.llama_sampler_sample(chain, m._ctx, -1)
            return (time.perf_counter() - t0) / n * 1e6
        finally:
            m.free_sampler(chain)

    def per_token(sampling: SamplingOptions) -> tuple[float, float, float]:
        """Medians (us) of: llama_decode, the gap between two decodes, the sampler call in that gap."""
        clock = time.perf_counter
        decode, sample = llama_cpp.llama_decode, llama_cpp.llama_sampler_sample
        marks: list[tuple[float, float]] = []
        samples: list[float] = []

        def timed_decode(ctx, batch):
            t0 = clock()
            rc = decode(ctx, batch)
            marks.append((t0, clock()))
            return rc

        def timed_sample(chain, ctx, idx):
            t0 = clock()
            token = sample(chain, ctx, idx)
            samples.append(clock() - t0)
            return token

        llama_cpp.llama_decode, llama_cpp.llama_sampler_sample = timed_decode, timed_sample
        try:
            m.reset()
            for _ in m.generate(prompt, sampling, GenerationStats(), max_tokens=args.n + 1, ignore_eos=True):
                pass
        finally:
            llama_cpp.llama_decode, llama_cpp.llama_sampler_sample = decode, sample
        steps = marks[2:]  # the prompt, then the first token's decode (a new graph)
        inside = [b - a for a, b in steps]
        between = [steps[i + 1][0] - steps[i][1] for i in range(len(steps) - 1)]
        return (statistics.median(inside) * 1e6, statistics.median(between) * 1e6, statistics.median(samples[2:]) * 1e6)

    rows: dict[str, list[float]] = {"llama-bench": [], "loop (sampled)": [], "loop (greedy)": [], "llama_decode only": []}
    for i in range(args.pairs):
        bench = native.llama_bench(model, args.threads, 0, args.n, 1, extra_args=bench_args, repack=repack)["tg"][0]
        sampled, raw1 = loop(SamplingOptions(seed=100 + i))
        greedy, raw2 = loop(SamplingOptions(temperature=0.0))
        rows["llama-bench"].append(bench)
        rows["loop (sampled)"].append(sampled)
        rows["loop (greedy)"].append(greedy)
        rows["llama_decode only"].append(statistics.fmean((raw1, raw2)))
        print(f"pair {i + 1}/{args.pairs}: llama-bench {bench:.2f}, sampled {sampled:.2f}, greedy {greedy:.2f}, "
              f"llama_decode {rows['llama_decode only'][-1]:.2f} t/s", file=sys.stderr, flush=True)
    ref = rows["llama-bench"]
    print(f"model {model}, -t {args.threads}, tg{args.n} @ d{args.d}, repack {int(repack)}, "
          f"{args.pairs} pairs, medians")
    print("| measure | tok/s | ratio to llama-bench (median of pairs) |")
    print("| --- | ---: | ---: |")
    for name, vals in rows.items():
        ratio = statistics.median(v / r for v, r in zip(vals, ref))
        print(f"| {name} | {statistics.median(vals):.2f} | {ratio:.3f} |")
    runs = [per_token(SamplingOptions(seed=7 + i)) for i in range(3)]
    dec, gap, smp = (statistics.median(r[j] for r in runs) for j in range(3))
    print(f"per token (medians, default chain): llama_decode {dec:.0f} us; between two decodes {gap:.0f} us "
          f"= {gap / (dec + gap) * 100:.2f}% of the step, of which the sampler call {smp:.0f} us "
          f"and our Python {gap - smp:.0f} us")
    print(f"sampler (warm, same logits again): default chain {sampler_us(SamplingOptions(seed=1)):.0f} us/token, "
          f"greedy {sampler_us(SamplingOptions(temperature=0.0)):.0f} us/token")
    m.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
