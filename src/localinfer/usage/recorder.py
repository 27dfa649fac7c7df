"""Recording requests as commands run: one (``recording``: run), many (``RequestLog``: batch), or
one answer at a time (``record_of``: chat, serve) — every answer's row is made by ``record_of``.

All write through ``usage.history`` and never break the command: a failure is one call of the
``warn`` the command passes (render's warning line in the CLI; None: nothing shown).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from localinfer.usage.history import (
    UsageRecord,
    append,
    exit_status_of,
    logging_enabled,
    text_logging_enabled,
)

if TYPE_CHECKING:
    from localinfer.answer.answer import Answer


class Named(Protocol):
    """The model a request went to: a ResolvedModel, a Backend, a ModelId (``endpoint`` optional)."""

    name: str
    sha256: str | None


@dataclass(frozen=True)
class ModelId:
    """A model known by its name alone (on a server, before it answered)."""

    name: str
    sha256: str | None = None
    endpoint: str | None = None


def record_of(
    command: str,
    answer: Answer | None,
    model: Named | None,
    *,
    exit_status: int = 0,
    finish_reason: str | None = None,
    prompt_text: str | None = None,
    extra: dict[str, Any] | None = None,
) -> UsageRecord:
    """The usage-history row of one request (``answer`` None: it failed before answering). A count
    nobody reported is stored as 0 and named in ``extra["unknown"]`` (the columns are NOT NULL)."""
    keep = text_logging_enabled()
    prompt = prompt_text if keep else None
    sha, endpoint = getattr(model, "sha256", None), getattr(model, "endpoint", None)
    if answer is None:
        return UsageRecord(command=command, model=model.name if model is not None else None, model_sha256=sha,
                           endpoint=endpoint, exit_status=exit_status, finish_reason=finish_reason, prompt_text=prompt,
                           extra=extra)  # fmt: skip
    unknown = [k for k in ("prompt_tokens", "completion_tokens") if getattr(answer, k) is None]
    if unknown:
        extra = {**(extra or {}), "unknown": unknown}
    if answer.reasoning_tokens is not None:  # of completion_tokens, a reasoning model's thinking
        extra = {**(extra or {}), "reasoning_tokens": answer.reasoning_tokens}
    evaluated = answer.prompt_eval_tokens
    return UsageRecord(
        command=command,
        model=answer.model,
        model_sha256=sha,
        endpoint=answer.backend,
        prompt_tokens=answer.prompt_tokens or 0,
        prompt_eval_tokens=evaluated if evaluated is not None else (answer.prompt_tokens or 0),
        cached_tokens=answer.cached_tokens or 0,
        completion_tokens=answer.completion_tokens or 0,
        ttft_ms=None if answer.ttft_s is None else answer.ttft_s * 1000.0,
        prefill_tps=answer.prefill_tps,
        decode_tps=answer.decode_tps,
        load_ms=answer.load_ms,
        total_ms=answer.total_s * 1000.0,
        finish_reason=finish_reason or answer.finish_reason,
        exit_status=exit_status,
        prompt_text=prompt,
        answer_text=answer.text if keep else None,
        extra=extra,
    )

Warn = Callable[[str], None]


@dataclass
class Recorder:
    """Filled in by a command as it goes; written when the command's ``with`` block ends."""

    command: str
    enabled: bool
    model: Named | None = None  # set once a model is involved: only then is anything recorded
    result: Answer | None = None
    prompt_text: str | None = None
    extra: dict[str, Any] | None = None


@contextlib.contextmanager
def recording(command: str, *, no_log: bool = False, warn: Warn | None = None) -> Iterator[Recorder]:
    """Record the request when the block ends, successful or not (failed runs keep their exit status).

    Use inside the command's ``handle_errors()`` so it sees the original exception.
    """
    rec = Recorder(command=command, enabled=logging_enabled(no_log))
    exc_seen: BaseException | None = None
    try:
        yield rec
    except BaseException as exc:
        exc_seen = exc
        raise
    finally:
        if rec.enabled and rec.model is not None:
            status = exit_status_of(exc_seen)
            reason = None
            if exc_seen is not None and rec.result is None:
                reason = "interrupted" if isinstance(exc_seen, KeyboardInterrupt) else "error"
            try:
                append(record_of(command, rec.result, rec.model, exit_status=status, prompt_text=rec.prompt_text,
                                 finish_reason=reason, extra=rec.extra), warn=warn)  # fmt: skip
            except Exception as exc:  # never let the history break the command
                if warn is not None:
                    warn(f"could not record this request in the usage history: {exc}")


class RequestLog:
    """Records for a command that answers many requests (batch): one row per output record,
    written in one transaction every ``flush_every`` rows or ``flush_s`` seconds, and at the end.

    ``flush()`` in the command's ``finally`` also records a failed job (exit status != 0) when an
    exception is on its way out; ``wrap(write)`` passes each output record on and logs it.
    """

    def __init__(self, command: str, model: Named, *, no_log: bool = False, extra: dict[str, Any] | None = None,
                 flush_every: int = 64, flush_s: float = 5.0, warn: Warn | None = None) -> None:
        self.command, self.model, self.extra, self.warn = command, model, extra, warn
        self.endpoint: str | None = getattr(model, "endpoint", None)  # the server that answers, if any
        self.enabled = logging_enabled(no_log)
        self.flush_every, self.flush_s = flush_every, flush_s
        self._pending: list[UsageRecord] = []
        self._last_flush = time.monotonic()
        self._count = 0

    def wrap(self, write: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
        def logged(record: dict[str, Any]) -> None:
            write(record)
            self.add_json(record)

        return logged

    def add_json(self, record: dict[str, Any]) -> None:
        """One request's output record (``BatchResult.to_json()``): an answer or an error."""
        if not self.enabled:
            return
        try:
            self._pending.append(self._from_json(record))
        except (KeyError, TypeError, ValueError):  # an unexpected shape must not break the job
            return
        self._count += 1
        if len(self._pending) >= self.flush_every or time.monotonic() - self._last_flush >= self.flush_s:
            self._write()

    def _from_json(self, d: dict[str, Any]) -> UsageRecord:
        sha = self.model.sha256
        if d.get("error") is not None:
            extra = {**(self.extra or {}), "error": d["error"] if text_logging_enabled() else True}
            return UsageRecord(command=self.command, model=self.model.name, model_sha256=sha, exit_status=1,
                               finish_reason="error", extra=extra, endpoint=self.endpoint)  # fmt: skip
        usage, t = d.get("usage") or {}, d.get("timings") or {}
        prompt = int(usage.get("prompt_tokens") or 0)
        prefill_ms = t.get("prefill_ms")
        return UsageRecord(
            command=self.command,
            model=self.model.name,
            model_sha256=sha,
            prompt_tokens=prompt,
            prompt_eval_tokens=prompt,
            completion_tokens=int(usage.get("completion_tokens") or 0),
            ttft_ms=t.get("ttft_ms"),
            prefill_tps=prompt / (prefill_ms / 1000.0) if prefill_ms and prompt else None,
            decode_tps=t.get("decode_tokens_per_s"),
            total_ms=t.get("total_ms"),
            finish_reason=d.get("finish_reason"),
            answer_text=d.get("text") if text_logging_enabled() else None,
            extra=self.extra,
            endpoint=self.endpoint,
        )

    def _write(self) -> None:
        batch, self._pending = self._pending, []
        self._last_flush = time.monotonic()
        if batch:
            append(batch, warn=self.warn)

    def flush(self) -> None:
        """Write what is pending; if the job is failing (called from ``finally``), record that too."""
        if not self.enabled:
            return
        exc = sys.exc_info()[1]
        if exc is not None:
            self._pending.append(
                UsageRecord(
                    command=self.command, model=self.model.name, model_sha256=self.model.sha256,
                    exit_status=exit_status_of(exc),
                    finish_reason="interrupted" if isinstance(exc, KeyboardInterrupt) else "error",
                    extra={**(self.extra or {}), "job": True}, endpoint=self.endpoint,
                )
            )
        try:
            self._write()
        except Exception as err:  # never let the history break the command
            if self.warn is not None:
                self.warn(f"could not record these requests in the usage history: {err}")


def record_embeddings(
    command: str, model: Named, *, inputs: int, embedded: int, tokens: int, total_s: float, load_s: float | None = None,
    exit_status: int = 0, no_log: bool = False, warn: Warn | None = None, extra: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    """One row for an embedding job (`embed`): its tokens are prompt tokens, it generates none; the
    rate is tokens embedded per second. Never raises (a failure is one ``warn``)."""
    if not logging_enabled(no_log):
        return
    row = UsageRecord(
        command=command, model=model.name, model_sha256=getattr(model, "sha256", None), endpoint=getattr(model, "endpoint", None),
        prompt_tokens=tokens, prompt_eval_tokens=tokens, load_ms=None if load_s is None else load_s * 1000.0,
        total_ms=total_s * 1000.0, prefill_tps=tokens / total_s if total_s > 0 and tokens else None,
        finish_reason="stop" if exit_status == 0 else "error", exit_status=exit_status,
        extra={"inputs": inputs, "embedded": embedded, **(extra or {})},
    )  # fmt: skip
    try:
        append(row, warn=warn)
    except Exception as exc:  # never let the history break the command
        if warn is not None:
            warn(f"could not record this job in the usage history: {exc}")
