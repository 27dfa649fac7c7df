"""`batch --endpoint`: the requests of a batch file sent to a server, up to ``parallel`` at a time.

Each request is retried with backoff when the server is busy (429/503, honouring Retry-After), a
gateway times out, or the connection fails or breaks mid-answer; after the last try it becomes an
error record, which ``--resume`` runs again. A failure every request would meet (a refused key, a
wrong URL) stops the job at once (exit 5) instead of writing an error per line. Only the calling
thread writes output, so the resumable-output guarantees of ``batch.io`` hold as they do locally.
"""

from __future__ import annotations

import dataclasses
import queue
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localinfer.batch.io import BatchRequest, InputError, OutputOrder
from localinfer.remote.connection import RemoteError
from localinfer.usage.recorder import RequestLog

if TYPE_CHECKING:
    from localinfer.batch.job import BatchDefaults, BatchSummary, Progress
    from localinfer.remote.client import Client, Outcome

Write = Callable[[dict[str, Any]], None]
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


def with_retries(send: Callable[[], Outcome], policy: RetryPolicy, stop: threading.Event) -> Outcome:
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


def request_body(item: BatchRequest, model: str, defaults: BatchDefaults) -> dict[str, Any]:
    """The request a batch line makes, with the command's defaults where the line is silent."""
    from localinfer.generate import messages_for
    from localinfer.remote import client

    sampling = item.sampling_over(defaults.sampling)
    common: dict[str, Any] = {
        "sampling": sampling,
        "max_tokens": item.max_tokens if item.max_tokens is not None else defaults.max_tokens,
        "stop": item.stop if item.stop is not None else defaults.stop,
        "ignore_eos": item.ignore_eos,
    }
    if item.messages is not None:
        return client.request_body(model, messages=item.messages, **common)
    if defaults.raw:
        text = f"{defaults.system}\n\n{item.prompt}" if defaults.system else item.prompt
        return client.request_body(model, prompt=text, **common)
    return client.request_body(model, messages=messages_for(item.prompt or "", defaults.system), **common)


@dataclass
class _Done:
    index: int
    item: BatchRequest | InputError
    outcome: Outcome | None = None
    error: Exception | None = None


def _record(done: _Done) -> dict[str, Any]:
    from localinfer.remote.results import batch_record

    if done.outcome is not None:
        return batch_record(done.item.id, done.outcome)
    reason = done.item.reason if isinstance(done.item, InputError) else str(done.error)
    return {"id": done.item.id, "line": done.item.line, "error": reason}


def _account(summary: BatchSummary, done: _Done) -> None:
    if done.outcome is None:
        summary.errors += 1
        return
    o = done.outcome
    summary.completed += 1
    summary.prompt_tokens += o.prompt_tokens or 0
    summary.completion_tokens += o.completion_tokens or 0
    summary.latencies.append(o.total_s)


class _Workers:
    """``parallel`` threads taking the next item and putting its outcome on a queue."""

    def __init__(self, items: Sequence[BatchRequest | InputError], send: Callable[[BatchRequest], Outcome], parallel: int) -> None:
        self.done: queue.Queue[_Done] = queue.Queue()
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
                self.done.put(_Done(index, item))
                continue
            try:
                self.done.put(_Done(index, item, outcome=self._send(item)))
            except Exception as exc:  # noqa: BLE001 - reported by the writer, per request
                self.done.put(_Done(index, item, error=exc))

    def next(self) -> _Done:
        while True:  # a timeout, so that Ctrl-C reaches the main thread at once
            try:
                return self.done.get(timeout=0.2)
            except queue.Empty:
                continue


def execute(
    items: Sequence[BatchRequest | InputError],
    client: Client,
    model: str,
    parallel: int,
    defaults: BatchDefaults,
    write: Write,
    *,
    on_error: str = "skip",
    keep_order: bool = False,
    progress: Progress | None = None,
    summary: BatchSummary,
    policy: RetryPolicy = RetryPolicy(),
) -> BatchSummary:
    """Send ``items`` to the server and hand each output record to ``write`` (as local
    ``batch.job.execute`` does: completion or input order, error records, abort, progress)."""
    summary.parallel = parallel
    workers: _Workers | None = None
    stop = threading.Event()

    def send(item: BatchRequest) -> Outcome:
        body = request_body(item, model, defaults)
        return with_retries(lambda: client.stream(body), policy, stop)

    order: OutputOrder[_Done] = OutputOrder(keep_order)
    t0 = time.perf_counter()
    try:
        workers = _Workers(items, send, parallel)
        for _ in range(len(items)):
            done = workers.next()
            if done.error is not None and (getattr(done.error, "fatal", False) or on_error == "abort"):
                raise done.error
            for r in order.release(done.index, done):
                write(_record(r))
                _account(summary, r)
            summary.wall_s = time.perf_counter() - t0
            if progress is not None:
                progress(summary, len(items))
    except KeyboardInterrupt:
        summary.interrupted = True
        raise
    finally:
        stop.set()
        if workers is not None:
            workers.stop.set()
        summary.wall_s = time.perf_counter() - t0
    return summary


class RemoteRequestLog(RequestLog):
    """The job's history rows (one per output record), each marked with the server that answered."""

    def __init__(self, command: str, model: str, endpoint: str, **kw: Any) -> None:
        super().__init__(command, _Named(model), **kw)  # type: ignore[arg-type]
        self.endpoint = endpoint

    def _write(self) -> None:
        self._pending = [dataclasses.replace(r, endpoint=self.endpoint) for r in self._pending]
        super()._write()


@dataclass(frozen=True)
class _Named:
    """A model known only by its name on the server (RequestLog wants a name and a sha256)."""

    name: str
    sha256: None = None
