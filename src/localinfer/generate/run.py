"""The core of `run` (and the base of `chat`): a request prepared (``generate.prepare``: the prompt,
the context window), its answer streamed and measured, on a model generate.loading loaded. Takes
plain values, never Typer objects.

The engine module is imported inside functions so that importing this module stays cheap.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from localinfer.answer.answer import Answer
from localinfer.engine.types import GenerationStats
from localinfer.errors import Interrupted, UsageError
from localinfer.generate.prepare import prepare
from localinfer.request.request import Request

if TYPE_CHECKING:
    from localinfer.generate.finish import Step
    from localinfer.generate.loading import LoadedModel


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (the model's mmapped pages included)."""
    try:
        import resource  # POSIX only
    except ImportError:  # Windows: psutil gives the peak working set there
        import psutil

        info = psutil.Process().memory_info()
        return int(getattr(info, "peak_wset", 0) or info.rss)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


class Generation:
    """One answer, streamed: iterate for its text pieces; ``result`` is complete once the iteration
    ends, however it ends (the last piece, an exception, or the consumer closing it early).

    TTFT runs from this object's creation (the request's arrival, after loading, before its prompt is
    built) to the first answer text (docs/metrics.md). ``prompt``: tokens, stops and dropped count
    already built (as build_prompt returns them; chat splices its turns onto the cached tokens).
    """

    def __init__(
        self,
        loaded: LoadedModel,
        request: Request,
        *,
        load_s: float = 0.0,
        prompt: tuple[Sequence[int], tuple[str, ...], int] | None = None,
    ) -> None:
        self._t_request = time.perf_counter()
        stats = GenerationStats()
        self._prepared = prepared = prepare(loaded, request, prompt=prompt)
        stats.truncated_tokens = prepared.dropped
        # what was measured so far; the finished answer replaces it when the iteration ends (``parts``)
        self.result = Answer("", loaded.name, stats, load_s, mode=request.mode, plan=loaded.plan, buffers=loaded.buffers)
        self.on_reasoning: Callable[[str], None] | None = None  # each piece of thinking, as it comes
        self._steps = loaded.model.run(prepared.job(), stats)  # the one sequence takes the batch's job

    def __iter__(self) -> Iterator[str]:
        """The answer's text; thinking goes to ``on_reasoning``."""
        for kind, text in self.parts():
            if kind == "text":
                yield text
            elif self.on_reasoning is not None:
                self.on_reasoning(text)

    def parts(self) -> Iterator[tuple[str, str]]:
        """``("reasoning" | "text", piece)`` as they come (a model whose template marks no thinking
        gives text alone). The answer is finished by ``localinfer.generate.finish`` (thinking split,
        tool calls parsed out, its finish reason, TTFT from this object's creation), as on every
        surface; the text and thinking kept are what the consumer took."""
        pieces: list[str] = []
        thoughts: list[str] = []
        finish = self._prepared.finish()
        try:
            for step in self._steps:
                if step.text:
                    yield from self._hand(finish.feed(step.text), pieces, thoughts)
            yield from self._hand(finish.close(), pieces, thoughts)
        finally:
            self._steps.close()  # a consumer that stopped early: the engine finishes its stats and cache now
            r = self.result
            done = finish.result(stats=r.stats, t0=self._t_request, t_end=time.perf_counter(),
                                 taken=("".join(pieces), "".join(thoughts) or None))  # fmt: skip
            self.result = Answer.of_finished(done, r.model, load_s=r.load_s, mode=r.mode, plan=r.plan, buffers=r.buffers,
                                             peak_rss=peak_rss_bytes())  # fmt: skip

    @staticmethod
    def _hand(steps: list[Step], pieces: list[str], thoughts: list[str]) -> Iterator[tuple[str, str]]:
        """The finished steps' thinking and text, kept once the consumer took them (calls stay in the finish)."""
        from localinfer.generate.finish import Text, Thought

        for step in steps:
            if isinstance(step, Thought) and step.text:
                yield "reasoning", step.text
                thoughts.append(step.text)  # only once the consumer took it (it may raise instead)
            elif isinstance(step, Text) and step.text:
                yield "text", step.text
                pieces.append(step.text)


def generate(
    loaded: LoadedModel,
    request: Request,
    write: Callable[[str], None],
    *,
    load_s: float = 0.0,
    prompt: tuple[Sequence[int], tuple[str, ...], int] | None = None,
    on_reasoning: Callable[[str], None] | None = None,
) -> Answer:
    """Stream one answer through ``write`` (its thinking through ``on_reasoning``) and return what
    was measured (``Generation``). If ``write`` or the user interrupts, the stats stay correct for
    what was produced; Ctrl-C raises ``Interrupted`` carrying the partial Answer."""
    gen = Generation(loaded, request, load_s=load_s, prompt=prompt)
    gen.on_reasoning = on_reasoning
    pieces = iter(gen)
    try:
        for text in pieces:
            write(text)
    except KeyboardInterrupt as exc:
        pieces.close()
        raise Interrupted(gen.result) from exc  # chat keeps an interrupted answer
    finally:
        pieces.close()
    return gen.result


def combine_stdin_and_prompt(stdin_text: str | None, prompt: str | None) -> str:
    """Piped text becomes context before the prompt, as Ollama does."""
    parts = [p for p in (stdin_text, prompt) if p and p.strip()]
    if not parts:
        raise UsageError("no prompt given", hint="pass --prompt TEXT, or pipe text on stdin")
    return "\n\n".join(p.rstrip("\n") if i == 0 and len(parts) > 1 else p for i, p in enumerate(parts))
