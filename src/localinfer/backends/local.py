"""The engine here as a :class:`~localinfer.backends.Backend`: one sequence per answer (``generate``),
or many decoded together (``engine.batch.BatchDecoder``) for batch; embeddings in a context of their
own beside the generation one (``engine.embed.Embedder``, made on first use)."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from localinfer.backends import Backend, Items, OnText, ToRequest
from localinfer.errors import ContextOverflowError, LocalInferError, UsageError, line_error

if TYPE_CHECKING:
    from localinfer.answer.answer import Answer
    from localinfer.request.request import BatchRequest, InputError
    from localinfer.answer.answer import BatchResult
    from localinfer.embed.embedding import Embedding
    from localinfer.engine.batch import BatchStats, SeqJob
    from localinfer.engine.embed import Embedder
    from localinfer.engine.batch import SeqResult
    from localinfer.generate.finish import Finish
    from localinfer.generate.loading import LoadedModel
    from localinfer.request.request import Request


def _ignore(_text: str) -> None:
    pass


class LocalBackend(Backend):
    """A model loaded here (which it owns: ``close`` frees it). Its load time is reported with the
    first answer after the load."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        self.name = loaded.name
        self.sha256 = loaded.resolved.sha256 if loaded.resolved is not None else None
        self.load_s = loaded.load_s
        self._embedder: Embedder | None = None
        self._embedder_key: tuple[str | None, int | None] = (None, None)

    @property
    def can_chat(self) -> bool:
        return self.loaded.template is not None

    def answer(self, request: Request, on_text: OnText | None = None, *, on_reasoning: OnText | None = None,
               prompt: tuple[Sequence[int], tuple[str, ...], int] | None = None) -> Answer:  # fmt: skip
        """``prompt``: tokens, stops and dropped count already built (chat splices its turns onto
        the cached tokens); else built from ``request`` (``generate.prepare``)."""
        from localinfer.generate.run import generate

        load_s, self.load_s = self.load_s, 0.0  # the load is counted once, in the first answer
        return generate(self.loaded, request, on_text or _ignore, load_s=load_s, prompt=prompt, on_reasoning=on_reasoning)

    def prompt_text(self, request: Request) -> tuple[str, int] | None:
        from localinfer.generate.prepare import rendered_prompt

        return rendered_prompt(self.loaded, request)

    def batch_stats(self) -> BatchStats:
        from localinfer.engine.batch import BatchStats

        return BatchStats()

    def run_batch(self, items: Items, to_request: ToRequest, parallel: int, *, stats: Any = None) -> Iterator[BatchResult]:
        """One context of ``parallel`` sequences (loaded with ``batch.job.batch_load_options``): a
        prompt is built when a sequence is free for it, checked against one sequence's context."""
        from localinfer.request.request import InputError
        from localinfer.answer.answer import BatchResult
        from localinfer.engine.batch import BatchDecoder
        from localinfer.engine.templates import TemplateRefusedError
        from localinfer.generate.prepare import prepare

        loaded = self.loaded
        outbox: collections.deque[BatchResult] = collections.deque()
        started: dict[int, tuple[BatchRequest, float, int, Request, Finish]] = {}
        decoder = BatchDecoder(loaded.model, parallel)

        def failed(index: int, item: BatchRequest | InputError, reason: str, exc: LocalInferError) -> BatchResult:
            return BatchResult(index, item.id, item.line, error=reason, exc=exc)

        def jobs() -> Iterator[SeqJob]:
            for index, item in enumerate(items):
                if isinstance(item, InputError):
                    outbox.append(failed(index, item, item.reason, UsageError(f"line {item.line}: {item.reason}")))
                    continue
                t0 = time.perf_counter()
                try:
                    request = to_request(item)
                    prepared = prepare(loaded, request, n_ctx=decoder.n_ctx_seq)
                except (UsageError, ContextOverflowError, TemplateRefusedError) as exc:
                    reason = line_error(exc)
                    exc.args = (f"line {item.line} (id {item.id!r}): {exc}",)
                    outbox.append(failed(index, item, reason, exc))
                    continue
                finish = prepared.finish()  # the answer is finished as on every surface (localinfer.generate.finish)
                started[index] = (item, t0, prepared.dropped, request, finish)
                yield prepared.job(index, on_text=_fed(finish) if finish.splits else None)

        try:
            if stats is not None:
                decoder.stats = stats
            for res in decoder.run(jobs()):
                while outbox:
                    yield outbox.popleft()
                item, t0, dropped, request, finish = started.pop(res.key)
                if res.error is not None:
                    yield failed(res.key, item, res.error, ContextOverflowError(f"line {item.line} (id {item.id!r}): {res.error}"))
                    continue
                res.stats.truncated_tokens = dropped
                yield BatchResult(res.key, item.id, item.line, _finished(loaded.name, res, finish, request.mode, t0))
            while outbox:
                yield outbox.popleft()
        finally:
            decoder.close()

    def embedder(self, pooling: str | None = None, n_ctx: int | None = None) -> Embedder:
        """The embedding context for ``pooling`` and ``n_ctx`` (None: the defaults), made on first use
        and made again only when they change."""
        from localinfer.engine.embed import Embedder

        key = (pooling, n_ctx)
        if self._embedder is None or self._embedder_key != key:
            self.close_embedder()
            self._embedder = Embedder(self.loaded.model, n_ctx=n_ctx, pooling=pooling)
            self._embedder_key = key
        return self._embedder

    def embeddings(
        self, inputs: Sequence[str | Sequence[int]], *, normalize: bool = True, pooling: str | None = None,
        truncate: bool = False, n_ctx: int | None = None, on_done: Callable[[int], None] | None = None,
    ) -> list[Embedding]:  # fmt: skip
        from localinfer.embed.embedding import Embedding

        embedder = self.embedder(pooling, n_ctx)
        out: list[Embedding | None] = [None] * len(inputs)
        todo: list[tuple[int, list[int], int]] = []
        for i, item in enumerate(inputs):
            try:
                tokens, dropped = embedder.tokens_of(item, truncate=truncate)
            except (UsageError, ContextOverflowError) as exc:
                out[i] = Embedding(None, error=str(exc), exc=exc)
                continue
            todo.append((i, tokens, dropped))
        if on_done is not None and len(todo) < len(inputs):
            on_done(len(inputs) - len(todo))
        vectors = embedder.embed([t for _, t, _ in todo], normalize=normalize, on_done=on_done)
        for (i, tokens, dropped), vec in zip(todo, vectors):
            out[i] = Embedding(vec, len(tokens), dropped)
        return [e for e in out if e is not None]  # every input has its embedding or its error by now

    def close_embedder(self) -> None:
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = None

    def reset(self) -> None:
        self.loaded.model.reset()

    def close(self) -> None:
        self.close_embedder()  # before the model it was made on
        self.loaded.close()


def _fed(finish: Finish) -> Callable[[str], None]:
    """A sequence's ``on_text`` for an answer whose thinking is split (and counted) piece by piece."""

    def feed(piece: str) -> None:
        finish.feed(piece)

    return feed


def _finished(name: str, res: SeqResult, finish: Finish, mode: str, t0: float) -> Answer:
    """One batch answer, finished (``localinfer.generate.finish``) as on every entry: TTFT and total
    from ``t0``, when its line was taken for a free sequence (before its prompt was built)."""
    from localinfer.answer.answer import Answer

    if not finish.splits:
        finish.fill(res.text)  # fed whole: nothing was split while it decoded
    finish.close()
    return Answer.of_finished(finish.of_sequence(res, t0), name, mode=mode)
