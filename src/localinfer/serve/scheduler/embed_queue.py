"""The server's embedding requests while they wait and run: each a ticket of token lists, embedded on
the engine thread one decode (a batch of inputs) at a time between the chat requests' steps, and
ended with an ``EmbedOutcome`` (its vectors, or why not). The engine (``serve.scheduler.worker``) decides when.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localinfer.engine.embed import Embedder


@dataclass(frozen=True)
class EmbedOutcome:
    """An embedding request's vectors (in input order) and tokens, or its ``error``."""

    vectors: list[list[float]]
    tokens: int
    queue_s: float
    total_s: float
    error: str | None = None


class EmbedTicket:
    """An embedding request in the queue: token lists in, ``on_end(EmbedOutcome)`` out."""

    __slots__ = ("inputs", "on_end", "t_arrival", "t_start", "cancelled", "vectors")

    def __init__(self, inputs: list[list[int]], on_end: Callable[[EmbedOutcome], None]) -> None:
        self.inputs, self.on_end = inputs, on_end
        self.t_arrival = time.perf_counter()
        self.t_start: float | None = None  # its first decode
        self.cancelled = threading.Event()
        self.vectors: list[list[float]] = []  # of inputs[:len(vectors)], so far

    def cancel(self) -> None:
        self.cancelled.set()


def embed_step(waiting: collections.deque[EmbedTicket], embedder: Callable[[], Embedder]) -> tuple[EmbedTicket, EmbedOutcome] | None:
    """One embedding decode: the next batch of the first waiting request's inputs (``embedder()``
    makes the embedding context on first use). The request and its outcome when it is over - its last
    batch done, failed, or cancelled - else None (engine thread)."""
    ticket = waiting[0]
    if ticket.t_start is None:
        ticket.t_start = time.perf_counter()
    error = "the request was cancelled" if ticket.cancelled.is_set() else None
    if error is None:
        try:
            emb = embedder()
            done = len(ticket.vectors)
            end = emb.batch_end(ticket.inputs, done)
            ticket.vectors.extend(emb.embed(ticket.inputs[done:end]))
        except Exception as exc:  # the request fails, the engine goes on
            error = f"{type(exc).__name__}: {exc}"
    if error is None and len(ticket.vectors) < len(ticket.inputs):
        return None
    waiting.popleft()
    now = time.perf_counter()
    vectors = ticket.vectors if error is None else []
    return ticket, EmbedOutcome(vectors, sum(map(len, ticket.inputs)), ticket.t_start - ticket.t_arrival,
                                now - ticket.t_arrival, error)  # fmt: skip
