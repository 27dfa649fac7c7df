"""An OpenAI-compatible server as a :class:`~localinfer.backends.Backend` (``--endpoint``): each
request is one streamed HTTP request (``remote.client``); a batch runs ``parallel`` of them at a
time, each retried with backoff when the server is busy or the connection breaks (``remote.batch``).

The server keeps its own cache and context: a conversation is sent whole each turn, and a prompt
that outgrows the server's context is the server's error (exit 6 when it says so).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from localinfer.backends import Backend, Items, OnText, ToRequest
from localinfer.errors import Interrupted, UsageError, line_error

if TYPE_CHECKING:
    from localinfer.answer.answer import Answer
    from localinfer.request.request import BatchRequest
    from localinfer.answer.answer import BatchResult
    from localinfer.embed.embedding import Embedding
    from localinfer.remote.client import Client, Received
    from localinfer.request.request import Messages, Request


class RemoteBackend(Backend):
    """A model on the server behind ``client`` (which it owns: ``close`` closes the connections)."""

    def __init__(self, client: Client, name: str = "", *, retries: int = 4) -> None:
        self.client, self.name, self.retries = client, name, retries
        self._owner = True  # closes the connections (handed on by ``switch``)

    @property
    def endpoint(self) -> str | None:
        return self.client.ep.display

    def choose(self, name: str | None) -> RemoteBackend:
        """Answer with ``name`` (``-m``), or the server's first model (``/v1/models``)."""
        self.name = self.client.pick_model(name)
        return self

    def switch(self, name: str) -> RemoteBackend:
        """The same server, another of its models (chat's /model); the connections are shared."""
        other = RemoteBackend(self.client, retries=self.retries).choose(name)
        self._owner = False
        return other

    def request(self, prompt: str | Messages, *, raw: bool = False, **fields: Any) -> Request:
        fields.pop("default_max_tokens", None)  # the server applies its own limit
        return super().request(prompt, raw=raw, **fields)

    def body(self, request: Request) -> dict[str, Any]:
        from localinfer.remote.client import request_body

        if request.tools or request.tool_choice is not None:  # refused, never dropped: the answer would not be what was asked
            raise UsageError("tool calls are not sent to a server (--endpoint) yet", hint="use a local model, or the server's API directly")
        from localinfer.request.images import wire_messages

        text: dict[str, Any] = {"prompt": request.raw_text} if request.raw_text is not None else {"messages": wire_messages(request.messages)}
        body = request_body(self.name, sampling=request.sampling, max_tokens=request.max_tokens, stop=request.stop,
                            ignore_eos=request.ignore_eos, logprobs=request.logprobs,
                            chat_template_kwargs=request.chat_template_kwargs, reasoning_format=request.reasoning_format,
                            **text)  # fmt: skip
        if request.response_format is not None:
            body.update(request.response_format.request_fields())
        return body

    def _answer(self, outcome: Received, request: Request, seed: bool = True) -> Answer:
        from localinfer.answer.answer import Answer

        return Answer.of_received(outcome, self.name, self.endpoint, request.mode, request.sampling.seed if seed else None)

    def answer(self, request: Request, on_text: OnText | None = None, *, on_reasoning: OnText | None = None) -> Answer:
        try:
            outcome = self.client.stream(self.body(request), on_text=on_text, on_reasoning=on_reasoning)
        except Interrupted as exc:  # the client's Received so far, made this backend's Answer
            from localinfer.answer.answer import Received

            partial = exc.partial if isinstance(exc.partial, Received) else None
            raise Interrupted(None if partial is None else self._answer(partial, request)) from exc
        return self._answer(outcome, request)

    def run_batch(self, items: Items, to_request: ToRequest, parallel: int, *, stats: Any = None) -> Iterator[BatchResult]:
        """Up to ``parallel`` requests in flight, on threads; results come back to the calling thread
        (which alone writes output, so ``batch.io``'s resumable-output guarantees hold)."""
        import threading

        from localinfer.answer.answer import BatchResult
        from localinfer.remote.batch import RetryPolicy, Workers, with_retries

        policy, stop = RetryPolicy(retries=self.retries), threading.Event()

        def send(item: BatchRequest) -> Answer:
            request = to_request(item)
            body = self.body(request)
            # a batch line's record carries no seed: the server's sampling is its own
            return self._answer(with_retries(lambda: self.client.stream(body), policy, stop), request, seed=False)

        workers = Workers(items, send, parallel)
        try:
            for _ in range(len(items)):
                index, item, answer, error = workers.next()
                if answer is not None:
                    yield BatchResult(index, item.id, item.line, answer)
                else:
                    reason = getattr(item, "reason", None) if error is None else line_error(error)
                    yield BatchResult(index, item.id, item.line, error=reason, exc=error)
        finally:
            stop.set()
            workers.stop.set()

    EMBED_CHUNK = 64  # inputs per /embeddings request

    def embeddings(
        self, inputs: Sequence[str | Sequence[int]], *, normalize: bool = True, pooling: str | None = None,
        truncate: bool = False, n_ctx: int | None = None, on_done: Callable[[int], None] | None = None,
    ) -> list[Embedding]:  # fmt: skip
        """The server's /embeddings, ``EMBED_CHUNK`` inputs a request; a chunk the server refuses
        (400: an input too long, empty...) is sent again one input at a time, so that only the bad
        inputs get an error. The server pools and normalizes as it does (OpenAI's: L2): ``pooling``
        and ``n_ctx`` are its own, ``normalize=False`` and ``truncate`` cannot be asked of it."""
        from localinfer.errors import ContextOverflowError, UsageError

        if not normalize or truncate:
            flag = "--no-normalize" if not normalize else "--truncate"
            raise UsageError(f"{flag} cannot be asked of a server's /embeddings (OpenAI's API normalizes, and refuses long inputs)")
        if pooling is not None:
            raise UsageError("--pooling cannot be asked of a server's /embeddings: it pools as it was started")
        out: list[Embedding] = []
        for start in range(0, len(inputs), self.EMBED_CHUNK):
            chunk = list(inputs[start : start + self.EMBED_CHUNK])
            try:
                out.extend(self._embed_chunk(chunk))
            except (UsageError, ContextOverflowError):  # one of them is bad: find which
                for item in chunk:
                    out.extend(self._embed_one(item))
            if on_done is not None:
                on_done(len(chunk))
        return out

    def _embed_one(self, item: str | Sequence[int]) -> list[Embedding]:
        from localinfer.embed.embedding import Embedding
        from localinfer.errors import ContextOverflowError, UsageError

        try:
            return self._embed_chunk([item])
        except (UsageError, ContextOverflowError) as exc:
            return [Embedding(None, error=str(exc), exc=exc)]

    def _embed_chunk(self, chunk: list[str | Sequence[int]]) -> list[Embedding]:
        from localinfer.embed.embedding import Embedding
        from localinfer.remote.connection import ProtocolError

        body = {"model": self.name, "input": [x if isinstance(x, str) else list(x) for x in chunk], "encoding_format": "float"}
        data = self.client.post("embeddings", body)
        try:
            rows = sorted(data["data"], key=lambda d: d["index"])
            vectors = [[float(x) for x in row["embedding"]] for row in rows]
            usage = data.get("usage") or {}
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ProtocolError(f"{self.endpoint}/embeddings did not answer with an OpenAI embedding list") from None
        if len(vectors) != len(chunk):
            raise ProtocolError(f"{self.endpoint}/embeddings answered {len(vectors)} vectors for {len(chunk)} inputs")
        total = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        tokens = total if len(chunk) == 1 and isinstance(total, int) else None  # per input: only when alone
        return [Embedding(v, tokens) for v in vectors]

    def close(self) -> None:
        if self._owner:
            self.client.close()
