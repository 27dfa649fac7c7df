"""`bench --draft ngram`: what speculative decoding does to generation, as rows after each tg test -
``tg128 [ngram copy]`` on a prompt whose continuation copies it, ``tg128 [ngram free]`` on one
with nothing to copy - each against the same test without drafting on the same prompts.

The copy prompt is a passage said twice and begun a third time: a model goes on with it (what an
answer that quotes its prompt does), so n-gram drafts are mostly kept (random tokens said over do
not work: a small model does not go on with them). The free prompt begins a story. Repetitions alternate plain and drafted runs, so a machine whose load
changes meanwhile weighs on both alike; the row's ``plain_avg_ts`` is the plain runs' rate and
``draft_ratio`` the drafted over it. The model's drafter keeps what it learnt of this machine's
step costs across repetitions (engine/speculate.py), as it does across the answers of a session.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from localinfer.bench.method import BenchResult, BenchTest, Rep, generate_exactly, mean_sd, now

if TYPE_CHECKING:
    from localinfer.bench.facts import Progress
    from localinfer.engine.model import LlamaModel
    from localinfer.request.sampling import SamplingOptions

PASSAGE = (
    "The lighthouse keeper, Mara Quint, logged every ship that passed the northern reef. In 1887 she "
    "recorded forty-one vessels, three of which ran aground in the October storms. The harbour board "
    "awarded her a silver medal and a pension of twelve pounds a year, and the logbook is kept in the "
    "town museum, open on its last page, beside the lamp she trimmed each night for thirty years."
)
STORY = "Once upon a time, in a village at the edge of a great forest, there lived"


def prompt(kind: str, model: LlamaModel) -> list[int]:
    """The ``copy`` or ``free`` prompt's tokens (with the model's BOS where it wants one)."""
    text = f"{PASSAGE}\n\n{PASSAGE}\n\n{PASSAGE[: len(PASSAGE) // 3]}" if kind == "copy" else STORY
    return model.tokenize(text)


def _once(model: LlamaModel, tokens: list[int], test: BenchTest, sampling: SamplingOptions, draft: str | None) -> tuple[Rep, Any]:
    plain_options = model.options
    model.options = dataclasses.replace(plain_options, draft=draft)
    try:
        model.reset()
        stats = generate_exactly(model, tokens, test.n_gen + 1, sampling)
    finally:
        model.options = plain_options
    return Rep(seconds=stats.decode_s, tokens=stats.completion_tokens - 1, raw_seconds=stats.decode_calls_s), stats


def draft_rows(
    model: LlamaModel, test: BenchTest, reps: int, stamp: dict[str, Any], *, draft: str, warmup: bool,
    sampling: SamplingOptions, progress: Progress | None,
) -> Iterator[BenchResult]:  # fmt: skip
    """The ``[ngram copy]`` and ``[ngram free]`` rows of a tg test."""
    for kind in ("copy", "free"):
        tokens = prompt(kind, model)
        plain: list[Rep] = []
        drafted: list[Rep] = []
        counts = [0, 0, 0]  # drafted, kept, drafts
        for i in range(reps + int(warmup)):
            if progress:
                progress(f"{test.name} [{draft} {kind}]: repetition {i + 1 - int(warmup)}/{reps}")
            order = (None, draft) if i % 2 == 0 else (draft, None)
            for d in order:
                rep, stats = _once(model, tokens, test, sampling, d)
                if warmup and i == 0:
                    continue
                (drafted if d else plain).append(rep)
                if d:
                    counts[0] += stats.draft_tokens
                    counts[1] += stats.draft_accepted
                    counts[2] += stats.draft_steps
        plain_ts = mean_sd([r.tps for r in plain])[0]
        yield BenchResult(**stamp, test=test, reps=tuple(drafted), sampling="greedy" if sampling.greedy else "default",
                          test_time=now(), plain_avg_ts=plain_ts, draft=f"{draft} {kind}",
                          draft_counts=(counts[0], counts[1], counts[2]))  # fmt: skip
