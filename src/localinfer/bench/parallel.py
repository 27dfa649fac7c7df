"""`localinfer bench --parallel N`: N requests arriving together, served by the batch engine.

Each of the N sequences gets a prompt of ``n_prompt`` random tokens and generates exactly ``n_gen``
tokens (end of generation disabled), through ``engine.batch.BatchDecoder`` - the code path of
``localinfer batch``. Per repetition: the aggregate throughput (generated tokens of all sequences
over the wall time, prefill included), llama-batched-bench's S_TG (tokens over the decode-only
steps), and every sequence's TTFT and latency from the moment the N requests arrived.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localinfer.bench.facts import Progress, Setup
from localinfer.bench.method import BENCH_SAMPLING, BenchTest, bos_token, mean_sd, now, random_tokens, repeated
from localinfer.engine.types import LoadOptions
from localinfer.request.sampling import SamplingOptions
from localinfer.errors import GenerationError, UsageError
from localinfer.units import json_ms as _ms
from localinfer.units import json_number as _r

if TYPE_CHECKING:
    from localinfer.usage.cost import Pricing
    from localinfer.engine.model import LlamaModel


@dataclass(frozen=True)
class ParallelRep:
    """One repetition: N sequences from their common arrival to the last token of the last one."""

    wall_s: float
    prompt_tokens: int  # all sequences
    gen_tokens: int  # all sequences
    ttft_s: tuple[float, ...]  # per sequence: arrival -> its first generated token
    latency_s: tuple[float, ...]  # per sequence: arrival -> its last token
    s_tg: float | None  # aggregate decode tok/s over decode-only steps (llama-batched-bench's S_TG)
    llama_decode_s: float  # of wall_s, inside llama_decode

    @property
    def tps(self) -> float:
        return self.gen_tokens / self.wall_s if self.wall_s > 0 else math.nan


def percentile(values: Sequence[float], q: float) -> float | None:
    from localinfer.usage.stats import percentile as pct

    return pct(values, q)


def measure_parallel(
    model: LlamaModel, n_parallel: int, n_prompt: int, n_gen: int, rng: random.Random, sampling: SamplingOptions = BENCH_SAMPLING
) -> ParallelRep:
    """Start ``n_parallel`` sequences at once and run them to exactly ``n_gen`` tokens each."""
    from localinfer.engine.batch import BatchDecoder, BatchStats, SeqJob

    bos = bos_token(model)
    jobs = [
        SeqJob(
            key=i,
            tokens=random_tokens(rng, n_prompt, model.n_vocab, bos),
            sampling=dataclasses.replace(sampling, seed=(sampling.seed or 0) + i),
            max_tokens=n_gen,
            ignore_eos=True,
        )
        for i in range(n_parallel)
    ]
    stats = BatchStats()
    with BatchDecoder(model, n_parallel) as decoder:
        decoder.stats = stats
        t0 = time.perf_counter()
        results = list(decoder.run(jobs))
    t_end = max((r.t_end for r in results), default=t0)
    for r in results:
        if r.error is not None or r.stats.completion_tokens != n_gen:
            raise GenerationError(
                f"bench --parallel: a sequence generated {r.stats.completion_tokens} of {n_gen} tokens"
                + (f" ({r.error})" if r.error else "")
            )
    return ParallelRep(
        wall_s=t_end - t0,
        prompt_tokens=n_parallel * n_prompt,
        gen_tokens=n_parallel * n_gen,
        ttft_s=tuple(r.t_admit + (r.stats.first_token_s or 0.0) - t0 for r in results),
        latency_s=tuple(r.t_end - t0 for r in results),
        s_tg=stats.decode_tps,
        llama_decode_s=stats.llama_decode_s,
    )


@dataclass(frozen=True)
class ParallelResult(Setup):
    """One shape (prompt, generation) at one level of concurrency, every repetition kept."""

    n_parallel: int
    n_prompt: int
    n_gen: int
    reps: tuple[ParallelRep, ...]
    build: str = ""
    test_time: str = ""

    @property
    def name(self) -> str:
        return f"pp{self.n_prompt}+tg{self.n_gen} x{self.n_parallel}"

    def cost(self, pricing: Pricing) -> dict[str, Any] | None:
        """Per million generated tokens at the aggregate rate; a request's share of the wall time."""
        from localinfer.usage.cost import for_workload

        avg = mean_sd([r.tps for r in self.reps])[0]
        wall = sum(r.wall_s for r in self.reps) / len(self.reps)
        cost = for_workload(pricing, tokens_per_second=avg, request_seconds=wall / self.n_parallel, prompt_tokens=0, gen_tokens=self.n_gen)
        if cost is not None:
            cost["api_per_request"] = pricing.api_cost(self.n_prompt, self.n_gen)
        return cost

    def to_json(self, pricing: Pricing | None = None) -> dict[str, Any]:
        m = self.model
        tps = [r.tps for r in self.reps]
        raw = [r.gen_tokens / r.llama_decode_s if r.llama_decode_s > 0 else math.nan for r in self.reps]
        s_tg = [r.s_tg for r in self.reps if r.s_tg is not None]
        ttft = [t for r in self.reps for t in r.ttft_s]
        latency = [t for r in self.reps for t in r.latency_s]
        avg, sd = mean_sd(tps)
        out: dict[str, Any] = {
            "model": m.name, "model_path": m.path, "model_sha256": m.sha256, "model_type": m.description,
            "quant": m.quant, "model_size": m.size_bytes, "model_n_params": m.n_params, "backend": m.backend,
            "n_gpu_layers": self.options.n_gpu_layers, "n_threads": self.n_threads, "n_ctx": self.n_ctx,
            "n_batch": self.n_batch, "n_ubatch": min(self.options.n_ubatch, self.n_batch),
            "flash_attn": self.options.flash_attn, "type_k": self.options.cache_type_k, "type_v": self.options.cache_type_v,
            "test": self.name, "kind": "parallel", "n_prompt": self.n_prompt, "n_gen": self.n_gen, "n_depth": 0,
            "n_parallel": self.n_parallel, "reps": len(self.reps), "sampling": "default",
            "avg_ts": _r(avg), "stddev_ts": _r(sd),
            "raw_avg_ts": _r(mean_sd(raw)[0]), "raw_stddev_ts": _r(mean_sd(raw)[1]),
            "s_tg_avg_ts": _r(mean_sd(s_tg)[0]) if s_tg else None,
            "ttft_p50_ms": _ms(percentile(ttft, 50)), "ttft_p95_ms": _ms(percentile(ttft, 95)),
            "latency_p50_ms": _ms(percentile(latency, 50)), "latency_p95_ms": _ms(percentile(latency, 95)),
            "samples_ts": [_r(x) for x in tps],
            "samples_ns": [round(r.wall_s * 1e9) for r in self.reps],
            "samples_tokens": [r.gen_tokens for r in self.reps],
            "llama_cpp_python": self.build, "test_time": self.test_time,
        }
        if pricing is not None:
            cost = self.cost(pricing)
            if cost is not None:
                out["cost"] = {k: _r(v, 9) for k, v in cost.items()}
        return out


def shapes_for(n_prompt: Sequence[int], n_gen: Sequence[int], pg: Sequence[tuple[int, int]]) -> tuple[BenchTest, ...]:
    """The request shapes to serve in parallel: the --pg pairs, else the first -p with the first -n."""
    if pg:
        return tuple(BenchTest(n_prompt=p, n_gen=n) for p, n in pg)
    p = next((x for x in n_prompt if x > 0), 0)
    n = next((x for x in n_gen if x > 0), 0)
    if p <= 0 or n <= 0:
        raise UsageError("--parallel needs a prompt size and a generation size", hint="give -p and -n, or --pg P,N")
    return (BenchTest(n_prompt=p, n_gen=n),)


def level_loads(shapes: Sequence[BenchTest], levels: Sequence[int]) -> Callable[[LoadOptions], Iterator[tuple[LoadOptions, int, str]]]:
    """One load of a configuration per level, each sequence with room for the largest shape."""
    from localinfer.batch.job import batch_load_options

    per_seq = max(t.n_prompt + t.n_gen for t in shapes) + 1

    def loads(options: LoadOptions) -> Iterator[tuple[LoadOptions, int, str]]:
        for level in levels:
            opts = batch_load_options(options, parallel=level, ctx_per_seq=max(per_seq, options.n_ctx or 0))
            yield opts, level, f"for {level} parallel sequences (ctx {opts.n_ctx})"

    return loads


def serve_tests(
    model: LlamaModel, level: int, shapes: Sequence[BenchTest], reps: int, stamp: dict[str, Any], *, warmup: bool, seed: int,
    sampling: SamplingOptions, progress: Progress | None,
) -> Iterator[ParallelResult]:  # fmt: skip
    """Every shape served ``level`` requests at a time (``stamp``: the result fields of the load)."""
    for shape in shapes:
        p, n = shape.n_prompt, shape.n_gen
        done = repeated(lambda rng, warm: measure_parallel(model, level, p, 1 if warm else n, rng, sampling),
                        reps, warmup=warmup, seed=seed, progress=progress, label=f"pp{p}+tg{n} x{level}")  # fmt: skip
        yield ParallelResult(**stamp, n_parallel=level, n_prompt=p, n_gen=n, reps=done, test_time=now())
