"""Every request the engine ran, in the usage history (command ``serve``), written by a thread of its
own in one transaction per second at most: neither the engine nor the event loop waits on SQLite."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localinfer.serve.scheduler.worker import EmbedOutcome, Ended, Ticket
    from localinfer.store import ResolvedModel
    from localinfer.usage.history import UsageRecord

FLUSH_S = 1.0


class UsageWriter:
    def __init__(self, resolved: ResolvedModel, name: str, parallel: int, warn: Callable[[str], None] | None = None) -> None:
        self.resolved, self.name, self.parallel, self.warn = resolved, name, parallel, warn
        self._queue: queue.Queue[UsageRecord | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="localinfer-history", daemon=True)
        self._thread.start()

    def add(self, ticket: Ticket, outcome: Ended) -> None:
        """Any thread (the engine's): one request, as ``run`` records one (its text only with
        LOCALINFER_LOG_TEXT=1)."""
        from localinfer.answer.answer import Answer
        from localinfer.generate.run import peak_rss_bytes
        from localinfer.usage.recorder import record_of

        envelope, request = ticket.prepared.asked, ticket.prepared.request
        mode = request.mode
        result = Answer.of_finished(outcome, self.name, load_s=0.0, peak_rss=peak_rss_bytes(), mode=mode)
        extra = {"endpoint": "chat" if mode == "chat" else "completions", "stream": envelope.stream,
                 "parallel": self.parallel, "queue_ms": round(outcome.queue_s * 1000.0, 3)}  # fmt: skip
        prompt = "\n".join(m["content"] for m in request.messages) if mode == "chat" else request.raw_text
        self._queue.put(record_of(
            "serve", result, self.resolved, exit_status=0 if outcome.error is None else 1,
            prompt_text=None if envelope.prompt_ids is not None else prompt, extra=extra,
        ))  # fmt: skip

    def add_embedding(self, outcome: EmbedOutcome) -> None:
        """Any thread (the engine's): one /v1/embeddings request, its tokens as prompt tokens."""
        from localinfer.usage.history import UsageRecord

        self._queue.put(UsageRecord(
            command="serve", model=self.name, model_sha256=self.resolved.sha256, prompt_tokens=outcome.tokens,
            prompt_eval_tokens=outcome.tokens, total_ms=outcome.total_s * 1000.0, exit_status=0 if outcome.error is None else 1,
            finish_reason="stop" if outcome.error is None else "error",
            extra={"endpoint": "embeddings", "inputs": len(outcome.vectors), "queue_ms": round(outcome.queue_s * 1000.0, 3)},
        ))  # fmt: skip

    def close(self, timeout: float = 5.0) -> None:
        """Write what is pending and stop."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        from localinfer.usage.history import append

        done = False
        while not done:
            batch = [self._queue.get()]
            deadline = time.monotonic() + FLUSH_S  # what else comes by then joins the same transaction
            while batch[-1] is not None and (left := deadline - time.monotonic()) > 0:
                try:
                    batch.append(self._queue.get(timeout=left))
                except queue.Empty:
                    break
            done = batch[-1] is None
            records = [r for r in batch if r is not None]
            if records:
                append(records, warn=self.warn)
