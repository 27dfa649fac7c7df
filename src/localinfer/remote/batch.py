"""`batch --endpoint`'s sending (``backends.remote.RemoteBackend.run_batch``): up to ``parallel``
requests at a time, on threads.

Each request is retried with backoff when the server is busy (429/503, honouring Retry-After), a
gateway times out, or the connection fails or breaks mid-answer; after the last try it becomes an
error record, which ``--resume`` runs again. A failure every request would meet (a refused key, a
wrong URL) stops the job at once (exit 5) instead of writing an error per line. Only the calling
thread writes output, so the resumable-output guarantees of ``batch.io`` hold as they do locally.
"""

from __future__ import annotations

import queue
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localinfer.request.request import BatchRequest, InputError
from localinfer.remote.connection import RemoteError

if TYPE_CHECKING:
    from localinfer.answer.answer import Answer
    from localinfer.remote.client import Received

Done = tuple[int, "BatchRequest | InputError", "Answer | None", "Exception | None"]
DEFAULT_PARALLEL = 4  # a server's own slots decide its concurrency; 4 keeps a small one busy


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to wait: exponential backoff with jitter, or what Retry-After says."""

    retries: int = 4  # tries after the first
    base_s: float = 0.5
    cap_s: float = 30.0
    max_retry_after_s: float = 300.0  # a Retry-After beyond this is taken as this

    def delay(self, attempt: int, err: RemoteError) -> float:
        if err.retry_after is not None:
            return min(err.retry_after, self.max_retry_after_s)
        step = min(self.cap_s, self.base_s * 2**attempt)
        return step / 2 + random.uniform(0, step / 2)  # jitter: parallel workers do not retry in step


def with_retries(send: Callable[[], Received], policy: RetryPolicy, stop: threading.Event) -> Received:
    """``send()`` until it succeeds, fails for good, or the job stops."""
    attempt = 0
    while True:
        try:
            return send()
        except RemoteError as err:
            if not err.retryable or err.fatal or attempt >= policy.retries or stop.is_set():
                if attempt:
                    err.args = (f"{err} (after {attempt + 1} tries)",)
                raise
            if stop.wait(policy.delay(attempt, err)):
                raise
            attempt += 1


class Workers:
    """``parallel`` threads taking the next item and putting ``(index, item, answer, error)`` on a queue
    (an InputError item comes back with neither)."""

    def __init__(self, items: Sequence[BatchRequest | InputError], send: Callable[[BatchRequest], Answer], parallel: int) -> None:
        self.done: queue.Queue[Done] = queue.Queue()
        self.stop = threading.Event()
        self._next = iter(enumerate(items))
        self._lock = threading.Lock()
        self._send = send
        self.threads = [threading.Thread(target=self._run, daemon=True, name=f"batch-{i}") for i in range(max(1, min(parallel, len(items))))]
        for t in self.threads:
            t.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            with self._lock:
                nxt = next(self._next, None)
            if nxt is None:
                return
            index, item = nxt
            if isinstance(item, InputError):
                self.done.put((index, item, None, None))
                continue
            try:
                self.done.put((index, item, self._send(item), None))
            except Exception as exc:  # reported by the writer, per request
                self.done.put((index, item, None, exc))

    def next(self) -> Done:
        while True:  # a timeout, so that Ctrl-C reaches the main thread at once
            try:
                return self.done.get(timeout=0.2)
            except queue.Empty:
                continue
