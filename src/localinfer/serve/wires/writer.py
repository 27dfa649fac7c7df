"""What ``sending.AnswerResponse`` asks of a protocol's writer (``WireWriter``), and ``WriterDefaults``:
what a wire that has nothing of its own there sends (SSE headers, an SSE comment as keep-alive, no
prompt progress). Each wire's writer (Chat Completions, Anthropic's Messages, the Responses API,
Ollama's NDJSON) subclasses the defaults, so every attribute the sender reads is there."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from localinfer.generate.finish import Step
    from localinfer.serve.scheduler.worker import Ended
    from localinfer.serve.wires.openai import ApiError

KEEPALIVE = b": keep-alive\n\n"  # an SSE comment: every SSE client skips it (a protocol may have its own event)
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
Headers = list[tuple[bytes, bytes]]


class WireWriter(Protocol):
    """One answer in one protocol's bytes: a stream's events, or a whole JSON object."""

    stream_headers: ClassVar[Headers]  # the stream's response headers
    keepalive: ClassVar[bytes | None]  # sent every KEEPALIVE_S of silence once headed (None: nothing)

    def admitted(self, cached: int) -> None:
        """The request has its sequence: ``cached`` of its prompt's tokens are reused (before ``head``)."""

    def head(self, mode: str) -> bytes:
        """The stream's first events (``mode``: sending.submit's)."""

    def progress(self, total: int, cached: int, evaluated: int, seconds: float) -> bytes:
        """The prompt's progress while it is read (b"": not sent)."""

    def text_piece(self, encoded: bytes) -> bytes:
        """A piece of text already a JSON string (the fast path)."""

    def steps(self, steps: list[Step]) -> bytes:
        """``localinfer.generate.finish``'s steps."""

    def logprobs_piece(self, text: str, entries: list[dict[str, Any]], offset: int) -> bytes:
        """A piece with its tokens' logprobs (``offset``: the characters sent before it)."""

    def tail(self, outcome: Ended) -> bytes:
        """The stream's last events."""

    def stream_error(self, exc: ApiError) -> bytes:
        """An error after the stream's headers went out."""

    def whole(self, outcome: Ended) -> dict[str, Any]:
        """The whole answer, as one JSON object."""


class WriterDefaults:
    """What a writer need not say: SSE, an SSE comment as keep-alive, no news of the prompt."""

    stream_headers: ClassVar[Headers] = SSE_HEADERS
    keepalive: ClassVar[bytes | None] = KEEPALIVE

    def admitted(self, cached: int) -> None:
        return None

    def progress(self, total: int, cached: int, evaluated: int, seconds: float) -> bytes:
        return b""

    def logprobs_piece(self, text: str, entries: list[dict[str, Any]], offset: int) -> bytes:
        raise NotImplementedError(f"{type(self).__name__} streams no logprobs")  # sending.submit asks only where they go
