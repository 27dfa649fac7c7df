"""`localinfer bench`'s sweep: every test of every model under every configuration, one load at a
time, measured by llama-bench's method (bench/method.py) or, with ``parallel`` levels, as N requests
arriving together (bench/parallel.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from localinfer.bench.facts import ModelFacts, Progress, build_version, loaded_model
from localinfer.bench.method import BENCH_SAMPLING, BenchResult, BenchTest, context_for, now, run_test
from localinfer.bench.parallel import level_loads, serve_tests
from localinfer.engine.types import LoadOptions
from localinfer.request.sampling import SamplingOptions

if TYPE_CHECKING:
    from localinfer.engine.model import LlamaModel
    from localinfer.store import ResolvedModel
    from localinfer.request.structured import Format


def run_bench(
    models: Sequence[ResolvedModel],
    configs: Sequence[LoadOptions],
    tests: Sequence[BenchTest],
    reps: int,
    *,
    warmup: bool = True,
    seed: int = 0,
    sampling: SamplingOptions = BENCH_SAMPLING,
    progress: Progress | None = None,
    force: bool = False,
    constraint: Format | None = None,
    parallel: Sequence[int] = (),
    draft: str | None = None,
) -> Iterator[Any]:
    """Every test, for every model under every configuration; results (BenchResult) come as they
    are measured.

    A configuration's ``n_ctx`` of None means "just what the tests need". Each (model,
    configuration) pair loads the model once (the file stays in the page cache after the first).
    With a ``constraint``, a test that generates is measured again under it, in the next row.
    With a ``draft`` (ngram), a tg test is followed by its drafted rows on a copy and a free prompt.
    With ``parallel`` levels, each test (a prompt and a generation) is instead N requests arriving
    together at each level N, one load per level (bench/parallel.py; ParallelResults).
    """
    loads = level_loads(tests, parallel) if parallel else _plain_loads(tests)
    build = build_version()
    for model, facts, opts, level in each_load(models, configs, loads, progress, force=force):
        stamp = dict(model=facts, options=opts, n_threads=model.n_threads, n_ctx=model.n_ctx, n_batch=model.n_batch, build=build)
        if parallel:
            yield from serve_tests(model, level, tests, reps, stamp, warmup=warmup, seed=seed, sampling=sampling, progress=progress)
            continue
        for test in tests:
            reps_done = run_test(model, test, reps, warmup=warmup, seed=seed, sampling=sampling, progress=progress)
            plain = BenchResult(**stamp, test=test, reps=reps_done, sampling="greedy" if sampling.greedy else "default",
                                test_time=now())  # fmt: skip
            yield plain
            if constraint is not None and test.n_gen > 0:
                reps_done = run_test(model, test, reps, warmup=warmup, seed=seed, sampling=sampling,
                                     progress=progress, constraint=constraint)  # fmt: skip
                yield replace(plain, reps=reps_done, constraint=constraint.kind, plain_avg_ts=plain.avg_ts)
            if draft is not None and test.kind == "tg":
                from localinfer.bench.drafting import draft_rows

                yield from draft_rows(model, test, reps, stamp, draft=draft, warmup=warmup, sampling=sampling,
                                      progress=progress)  # fmt: skip


def _plain_loads(tests: Sequence[BenchTest]) -> Callable[[LoadOptions], Iterator[tuple[LoadOptions, None, str]]]:
    """One load of each configuration, with the context the tests need (or the configuration's)."""

    def loads(options: LoadOptions) -> Iterator[tuple[LoadOptions, None, str]]:
        opts = replace(options, n_ctx=context_for(tests, options.n_ctx))
        yield opts, None, f"(threads {opts.n_threads or 'default'}, ctx {opts.n_ctx})"

    return loads


def each_load(
    models: Sequence[ResolvedModel],
    configs: Sequence[LoadOptions],
    loads: Callable[[LoadOptions], Iterable[tuple[LoadOptions, Any, str]]],
    progress: Progress | None,
    *,
    force: bool = False,
) -> Iterator[tuple[LlamaModel, ModelFacts, LoadOptions, Any]]:
    """Each model loaded as ``loads(config)`` says for each configuration: the options of each
    load, a key handed back with it and what the progress line says of it. The RPC servers of every
    configuration are registered first (before any load: llama.cpp picks its devices then)."""
    from localinfer.engine.rpc import add_servers

    add_servers(s for c in configs for s in c.rpc_servers)
    for resolved in models:
        for config in configs:
            for options, key, what in loads(config):
                if progress:
                    progress(f"loading {resolved.name} {what}")
                with loaded_model(resolved, options, progress, force=force) as model:
                    yield model, ModelFacts.of(resolved, model, options.n_gpu_layers), options, key
