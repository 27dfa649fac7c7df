"""The core of `localinfer bench`: llama-bench's method, measured through our own engine.

Like llama-bench: random prompt tokens (the first one BOS when the model adds one), the end of
generation disabled so every repetition generates exactly ``n`` tokens, one warm-up, ``reps``
repetitions, mean and sample standard deviation of the per-repetition rates. Unlike a separate
harness, every token goes through ``engine.model.LlamaModel.run`` - the code path of ``run`` -
and the time spent inside ``llama_decode`` is reported next to it ("raw"), so our own per-token
overhead shows. Exact definitions of pp, tg, pp+tg and depth: docs/bench.md.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from localinfer.bench.facts import Progress, Setup
from localinfer.engine.types import GenerationStats, SeqJob
from localinfer.request.sampling import SamplingOptions
from localinfer.errors import GenerationError, UsageError
from localinfer.units import json_number as _r

if TYPE_CHECKING:
    from localinfer.usage.cost import Pricing
    from localinfer.engine.model import LlamaModel
    from localinfer.request.structured import Format

# The sampler chain of `run` with its defaults (top-k 40, top-p 0.95, min-p 0.05, temperature 0.8),
# with a fixed seed: sampling is part of what a real request pays for each token.
BENCH_SAMPLING = SamplingOptions(seed=1234)
T = TypeVar("T")


@dataclass(frozen=True)
class BenchTest:
    """One test: ``pp`` (n_prompt > 0, n_gen = 0), ``tg`` (n_prompt = 0) or ``pp+tg``, at a depth."""

    n_prompt: int = 0
    n_gen: int = 0
    depth: int = 0

    def __post_init__(self) -> None:
        if self.n_prompt < 0 or self.n_gen < 0 or self.depth < 0:
            raise UsageError("prompt, generation and depth sizes must not be negative")
        if self.n_prompt == 0 and self.n_gen == 0:
            raise UsageError("a bench test needs prompt tokens (-p) or generated tokens (-n)")

    @property
    def kind(self) -> str:
        if self.n_gen == 0:
            return "pp"
        return "tg" if self.n_prompt == 0 else "pp+tg"

    @property
    def name(self) -> str:
        """llama-bench's names: pp512, tg128, pp512+tg128, with " @ d1024" for a depth."""
        base = {"pp": f"pp{self.n_prompt}", "tg": f"tg{self.n_gen}"}.get(self.kind, f"pp{self.n_prompt}+tg{self.n_gen}")
        return f"{base} @ d{self.depth}" if self.depth else base

    @property
    def tokens(self) -> int:
        """Tokens one repetition processes (and the rate counts): prompt plus generated."""
        return self.n_prompt + self.n_gen

    @property
    def ctx_needed(self) -> int:
        """Context cells one repetition fills: depth, the prompt (one token for tg), the decodes."""
        return self.depth + max(self.n_prompt, 1) + self.n_gen


def expand_tests(
    n_prompt: Sequence[int], n_gen: Sequence[int], pg: Sequence[tuple[int, int]], depths: Sequence[int]
) -> tuple[BenchTest, ...]:
    """llama-bench's order: every pp, then every tg, then every pp+tg, each at every depth."""
    tests: list[BenchTest] = []
    for d in depths or (0,):
        tests += [BenchTest(n_prompt=p, depth=d) for p in n_prompt if p > 0]
        tests += [BenchTest(n_gen=n, depth=d) for n in n_gen if n > 0]
        tests += [BenchTest(n_prompt=p, n_gen=n, depth=d) for p, n in pg]
    if not tests:
        raise UsageError("nothing to measure: -p and -n are both 0 and no --pg was given")
    return tuple(dict.fromkeys(tests))


@dataclass(frozen=True)
class Rep:
    """One timed repetition: ``tokens`` processed in ``seconds``, ``raw_seconds`` of them in llama_decode."""

    seconds: float
    tokens: int
    raw_seconds: float

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else math.nan

    @property
    def raw_tps(self) -> float:
        return self.tokens / self.raw_seconds if self.raw_seconds > 0 else math.nan


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1), as llama-bench reports; sd 0 for one value."""
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


@dataclass(frozen=True)
class BenchResult(Setup):
    """One test of one model under one configuration, with every repetition kept."""

    test: BenchTest
    reps: tuple[Rep, ...]
    sampling: str = "default"
    build: str = ""  # llama-cpp-python's version
    test_time: str = ""  # when the test ran (ISO 8601, local time)
    constraint: str | None = None  # the answer was constrained (--json-schema...): the Format's kind
    plain_avg_ts: float | None = None  # the same test's rate without the constraint (the draft), measured just before
    draft: str | None = None  # speculative decoding on a prompt (bench/drafting.py): "ngram copy", "ngram free"
    draft_counts: tuple[int, int, int] | None = None  # with draft: tokens drafted, kept, drafts verified

    @property
    def samples_tps(self) -> list[float]:
        return [r.tps for r in self.reps]

    @property
    def samples_raw_tps(self) -> list[float]:
        return [r.raw_tps for r in self.reps]

    @property
    def avg_ts(self) -> float:
        return mean_sd(self.samples_tps)[0]

    @property
    def stddev_ts(self) -> float:
        return mean_sd(self.samples_tps)[1]

    @property
    def raw_avg_ts(self) -> float:
        return mean_sd(self.samples_raw_tps)[0]

    @property
    def raw_stddev_ts(self) -> float:
        return mean_sd(self.samples_raw_tps)[1]

    @property
    def overhead(self) -> float | None:
        """Share of the time spent outside llama_decode (our Python path, sampling)."""
        total = sum(r.seconds for r in self.reps)
        raw = sum(r.raw_seconds for r in self.reps)
        return (total - raw) / total if total > 0 else None

    @property
    def mean_seconds(self) -> float:
        return statistics.fmean(r.seconds for r in self.reps) if self.reps else math.nan

    def cost(self, pricing: Pricing) -> dict[str, Any] | None:
        """Per million of the tokens this test counts, per repetition, and the API's price for the same."""
        from localinfer.usage.cost import for_workload

        t = self.test
        return for_workload(pricing, tokens_per_second=self.avg_ts, request_seconds=self.mean_seconds,
                            prompt_tokens=t.n_prompt, gen_tokens=t.n_gen)

    def to_json(self, pricing: Pricing | None = None) -> dict[str, Any]:
        m, t = self.model, self.test
        out: dict[str, Any] = {
            "model": m.name,
            "model_path": m.path,
            "model_sha256": m.sha256,
            "model_type": m.description,
            "quant": m.quant,
            "model_size": m.size_bytes,
            "model_n_params": m.n_params,
            "backend": m.backend,
            "n_gpu_layers": self.options.n_gpu_layers,
            "n_threads": self.n_threads,
            "n_ctx": self.n_ctx,
            "n_batch": self.n_batch,
            "n_ubatch": min(self.options.n_ubatch, self.n_batch),
            "flash_attn": self.options.flash_attn,
            "type_k": self.options.cache_type_k,
            "type_v": self.options.cache_type_v,
            "test": f"{t.name} [{self.constraint or self.draft}]" if self.constraint or self.draft else t.name,
            "kind": t.kind,
            "n_prompt": t.n_prompt,
            "n_gen": t.n_gen,
            "n_depth": t.depth,
            "reps": len(self.reps),
            "sampling": self.sampling,
            "avg_ts": _r(self.avg_ts),
            "stddev_ts": _r(self.stddev_ts),
            "raw_avg_ts": _r(self.raw_avg_ts),
            "raw_stddev_ts": _r(self.raw_stddev_ts),
            "overhead": _r(self.overhead, 4),
            "samples_ts": [_r(x) for x in self.samples_tps],
            "samples_raw_ts": [_r(x) for x in self.samples_raw_tps],
            "samples_ns": [round(r.seconds * 1e9) for r in self.reps],
            "samples_tokens": [r.tokens for r in self.reps],
            "llama_cpp_python": self.build,
            "test_time": self.test_time,
        }
        if self.constraint is not None and self.plain_avg_ts:
            # what the constraint costs each token: the mask, on top of the plain row's time per token
            out["constraint"] = self.constraint
            out["constraint_us_per_token"] = _r((1 / self.avg_ts - 1 / self.plain_avg_ts) * 1e6, 1)
            out["constraint_ratio"] = _r(self.avg_ts / self.plain_avg_ts, 4)
        if self.draft is not None and self.plain_avg_ts and self.draft_counts is not None:
            drafted, kept, drafts = self.draft_counts
            out.update(draft=self.draft, draft_tokens=drafted, draft_accepted=kept, drafts=drafts,
                       plain_avg_ts=_r(self.plain_avg_ts), draft_ratio=_r(self.avg_ts / self.plain_avg_ts, 4))  # fmt: skip
        if pricing is not None:
            cost = self.cost(pricing)
            if cost is not None:
                out["cost"] = {k: _r(v, 9) for k, v in cost.items()}
        return out


# -- measuring -------------------------------------------------------------------------------------


def random_tokens(rng: random.Random, n: int, n_vocab: int, bos: int | None) -> list[int]:
    """``n`` uniformly random token ids, the first one BOS when the model adds one (as llama-bench)."""
    tokens = [rng.randrange(n_vocab) for _ in range(n)]
    if tokens and bos is not None:
        tokens[0] = bos
    return tokens


def bos_token(model: LlamaModel) -> int | None:
    if not model.add_bos:
        return None
    ids = model.tokenize("", add_special=True)
    return ids[0] if ids else None


def generate_exactly(
    model: LlamaModel, prompt: list[int], max_tokens: int, sampling: SamplingOptions, constraint: Format | None = None
) -> GenerationStats:
    """``model.run`` with the end of generation disabled: ``max_tokens`` tokens come out
    unless the context fills up first. Under a ``constraint`` the end of the document ends it (the
    constraint allows nothing after it)."""
    stats = GenerationStats()
    for _ in model.run(SeqJob(0, prompt, sampling, max_tokens, ignore_eos=constraint is None, constraint=constraint), stats):
        pass
    return stats


def measure(
    model: LlamaModel, test: BenchTest, rng: random.Random, sampling: SamplingOptions = BENCH_SAMPLING,
    constraint: Format | None = None,
) -> Rep:
    """One repetition on a cleared cache (pre-filled to ``test.depth`` first, untimed).

    pp: time to evaluate ``n_prompt`` random tokens (``stats.prefill_s``).
    tg: after a one-token prompt, ``n_gen + 1`` tokens are sampled; the ``n_gen`` single-token
        decodes between the first and the last sample are timed (``stats.decode_s``), sampling
        included.
    pp+tg: both, from the start of the request to the last sample.
    Under a ``constraint`` a document may end before ``n_gen``: the tokens up to its end count.
    """
    bos = bos_token(model)
    model.reset()
    depth_tokens = random_tokens(rng, test.depth, model.n_vocab, bos) if test.depth else []
    if depth_tokens:
        generate_exactly(model, depth_tokens, 1, sampling)  # fills the cache with exactly these tokens
    first_is_bos = not depth_tokens
    body = random_tokens(rng, max(test.n_prompt, 1), model.n_vocab, bos if first_is_bos else None)
    stats = generate_exactly(model, depth_tokens + body, test.n_gen + 1, sampling, constraint)
    if stats.cached_tokens != len(depth_tokens) or stats.evaluated_tokens != len(body):
        raise GenerationError(
            f"bench: the prompt was not evaluated as planned ({stats.evaluated_tokens} evaluated, "
            f"{stats.cached_tokens} cached; expected {len(body)} and {len(depth_tokens)})"
        )
    n_gen = test.n_gen
    if constraint is not None and 2 <= stats.completion_tokens < n_gen + 1 and stats.finish_reason == "stop":
        n_gen = stats.completion_tokens - 1  # the document ended: the decodes up to its end are timed
    if stats.completion_tokens != n_gen + 1:
        raise GenerationError(
            f"bench: generation stopped after {stats.completion_tokens} of {test.n_gen + 1} tokens "
            f"({stats.finish_reason}); the context ({model.n_ctx}) may be too small"
        )
    if test.kind == "pp":
        return Rep(seconds=stats.prefill_s, tokens=test.n_prompt, raw_seconds=stats.prefill_s)
    if test.kind == "tg":
        return Rep(seconds=stats.decode_s, tokens=n_gen, raw_seconds=stats.decode_calls_s)
    span = (stats.first_token_s or 0.0) + stats.decode_s
    return Rep(seconds=span, tokens=test.n_prompt + n_gen, raw_seconds=stats.prefill_s + stats.decode_calls_s)


def run_test(
    model: LlamaModel,
    test: BenchTest,
    reps: int,
    *,
    warmup: bool = True,
    seed: int = 0,
    sampling: SamplingOptions = BENCH_SAMPLING,
    progress: Progress | None = None,
    constraint: Format | None = None,
) -> tuple[Rep, ...]:
    """Warm up once (a pp of n_prompt tokens and/or one decode, as llama-bench), then ``reps`` times."""
    if reps < 1:
        raise UsageError("--repetitions must be at least 1")
    warm = BenchTest(n_prompt=test.n_prompt, n_gen=min(test.n_gen, 1))
    return repeated(lambda rng, first: measure(model, warm if first else test, rng, sampling, constraint),
                    reps, warmup=warmup, seed=seed, progress=progress, label=test.name)  # fmt: skip


def repeated(once: Callable[[random.Random, bool], T], reps: int, *, warmup: bool, seed: int,
             progress: Progress | None, label: str) -> tuple[T, ...]:  # fmt: skip
    """``once(rng, warm_up)`` untimed once (unless not ``warmup``), then ``reps`` times, the random
    prompts of all drawn from one generator seeded with ``seed``."""
    rng = random.Random(seed)
    if warmup:
        once(rng, True)
    out = []
    for i in range(reps):
        if progress:
            progress(f"{label}: repetition {i + 1}/{reps}")
        out.append(once(rng, False))
    return tuple(out)


def context_for(tests: Sequence[BenchTest], requested: int | None) -> int:
    """The context every test fits in (as llama-bench: no bigger than needed), or the user's -c."""
    needed = max(t.ctx_needed for t in tests)
    if requested is None:
        return max(needed, 16)
    if requested < needed:
        worst = max(tests, key=lambda t: t.ctx_needed)
        raise UsageError(
            f"--ctx-size {requested} is too small for {worst.name} (it needs {needed} tokens)",
            hint="raise --ctx-size, or leave it out: bench sizes the context to the tests",
        )
    return requested


def now() -> str:
    """A result's test_time: local time, to the second."""
    import datetime

    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")
