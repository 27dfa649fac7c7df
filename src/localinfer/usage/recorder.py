"""Recording requests as commands run: one (``recording``: run, bench) or many (``RequestLog``: batch).

Both write through ``usage.history`` and never break the command: a failure is one call of the
``warn`` the command passes (render's warning line in the CLI; None: nothing shown).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localinfer.usage.history import (
    UsageRecord,
    append,
    exit_status_of,
    logging_enabled,
    record_from_result,
    text_logging_enabled,
)

if TYPE_CHECKING:
    from localinfer.generate import Result
    from localinfer.store import ResolvedModel

Warn = Callable[[str], None]


@dataclass
class Recorder:
    """Filled in by a command as it goes; written when the command's ``with`` block ends."""

    command: str
    enabled: bool
    model: ResolvedModel | None = None  # set once a model is involved: only then is anything recorded
    result: Result | None = None
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
                append(
                    record_from_result(
                        command,
                        rec.result,
                        rec.model,
                        exit_status=status,
                        prompt_text=rec.prompt_text,
                        finish_reason=reason,
                        extra=rec.extra,
                    ),
                    warn=warn,
                )
            except Exception as exc:  # noqa: BLE001 - never let the history break the command
                if warn is not None:
                    warn(f"could not record this request in the usage history: {exc}")


class RequestLog:
    """Records for a command that answers many requests (batch): one row per output record,
    written in one transaction every ``flush_every`` rows or ``flush_s`` seconds, and at the end.

    ``flush()`` in the command's ``finally`` also records a failed job (exit status != 0) when an
    exception is on its way out; ``wrap(write)`` passes each output record on and logs it.
    """

    def __init__(self, command: str, model: ResolvedModel, *, no_log: bool = False, extra: dict[str, Any] | None = None,
                 flush_every: int = 64, flush_s: float = 5.0, warn: Warn | None = None) -> None:
        self.command, self.model, self.extra, self.warn = command, model, extra, warn
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
            return UsageRecord(command=self.command, model=self.model.name, model_sha256=sha, exit_status=1, finish_reason="error", extra=extra)
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
                    extra={**(self.extra or {}), "job": True},
                )
            )
        try:
            self._write()
        except Exception as err:  # noqa: BLE001 - never let the history break the command
            if self.warn is not None:
                self.warn(f"could not record these requests in the usage history: {err}")
