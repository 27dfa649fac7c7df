"""The library API: ``localinfer.load(name)`` gives a model that streams, completes and chats.

The CLI's commands run on these same calls (resolve, pre-flight and load; one request streamed),
so a Python user gets exactly what ``localinfer run`` does, without the terminal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localinfer.answer.answer import Answer
from localinfer.backends.local import LocalBackend
from localinfer.engine.types import LoadOptions
from localinfer.request.sampling import SamplingOptions
from localinfer.errors import UsageError

if TYPE_CHECKING:
    from localinfer.request.request import Request
    from localinfer.store import ResolvedModel
    from localinfer.request.toolcalls.spec import ToolCall

@dataclass(frozen=True)
class Chunk:
    """A piece of a streamed answer. The last chunk of a stream has empty ``text`` and carries the
    ``stats`` and the full ``result`` (``None`` on every other chunk). A reasoning model's thinking
    comes first, in chunks whose ``reasoning`` holds it (their ``text`` is empty)."""

    text: str
    stats: Answer | None = None
    result: Answer | None = None
    reasoning: str = ""


@dataclass(frozen=True)
class Response:
    """A whole answer."""

    text: str
    finish_reason: str | None
    stats: Answer
    result: Answer
    logprobs: list[dict[str, Any]] | None = None  # asked with logprobs=N: one entry per answer token

    @property
    def reasoning(self) -> str | None:
        """A reasoning model's thinking, apart from ``text`` (None: none)."""
        return self.result.reasoning

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The calls the model made (a request with ``tools``); ``text`` is the rest of its answer."""
        return self.result.tool_calls or []


Messages = Sequence[dict[str, Any]]
DEFAULT_COMPLETION_TOKENS = 256  # plain completion's answer limit when none is given


class Stream:
    """An answer being generated: iterate for its Chunks. ``result`` is complete once the iteration
    ends or ``close()`` is called (a consumer interrupted by Ctrl-C closes it, then reads it)."""

    def __init__(self, gen: Any) -> None:
        self._gen = gen
        self._chunks = self._run()

    @property
    def result(self) -> Answer:
        return self._gen.result

    def _run(self) -> Iterator[Chunk]:
        pieces = self._gen.parts()
        try:
            for kind, text in pieces:
                yield Chunk(text) if kind == "text" else Chunk("", reasoning=text)
        finally:
            pieces.close()
        yield Chunk("", self.result, self.result)

    def __iter__(self) -> Iterator[Chunk]:
        return self._chunks

    def __next__(self) -> Chunk:
        return next(self._chunks)

    def close(self) -> None:
        self._chunks.close()


class Model(LocalBackend):
    """A model loaded for answering (``localinfer.load``): the engine's backend, with the library's
    conveniences; ``embed(texts) -> list[list[float]]`` embeds (the backend's, in an embedding context
    made on first use). Close it, or use it as a context manager, to free its memory at once."""

    @property
    def has_chat_template(self) -> bool:
        return self.can_chat

    def request(  # the backend's, with the sampler's settings one by one
        self,
        prompt: str | Messages,
        *,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        min_p: float | None = None,
        repeat_penalty: float | None = None,
        seed: int | None = None,
        sampling: SamplingOptions | None = None,
        **fields: Any,
    ) -> Request:
        """The request ``stream`` runs: a string is a user message through the chat template (plain
        completion with ``raw`` or where the model has none); a list is the conversation itself.
        ``sampling``: all the sampler's settings at once, instead of one by one. ``fields``: the rest
        of :func:`localinfer.request.request.build`'s: ``system``, ``raw``, ``max_tokens``, ``stop``,
        ``on_overflow``, ``ignore_eos``... The answer is JSON with ``response_format`` ("json",
        OpenAI's object, or a structured.Format) or ``json_schema`` (a schema or its text), or
        follows ``grammar`` (GBNF); a bad one raises FormatError. ``tools`` and ``tool_choice``:
        OpenAI's shapes; the calls come back in ``Response.tool_calls``. ``logprobs=N``: each answer
        token's log probability and the N likeliest alternatives (0-20), in ``Response.logprobs``
        (OpenAI's content shape). ``chat_template_kwargs``: the template's variables
        (``{"enable_thinking": False}``); ``reasoning_format="none"``: a reasoning model's thinking
        stays in the text."""
        if sampling is None:
            given = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p,
                     "repeat_penalty": repeat_penalty, "seed": seed}  # fmt: skip
            sampling = SamplingOptions(**{k: v for k, v in given.items() if v is not None})
        # A base model never chooses to stop a plain completion: without a limit it writes until
        # the context is full (4,000 tokens of repeats). llama-completion's -n -1 does that too.
        return super().request(prompt, sampling=sampling, default_max_tokens=DEFAULT_COMPLETION_TOKENS, **fields)

    def stream(self, prompt: str | Messages, **options: Any) -> Iterator[Chunk]:
        """The answer as it is generated; the last chunk carries the stats (``request`` for the options)."""
        return self.stream_request(self.request(prompt, **options))

    def stream_request(self, request: Request) -> Stream:
        from localinfer.generate.run import Generation

        gen = Generation(self.loaded, request, load_s=self.load_s)
        self.load_s = 0.0  # the load is counted once, in the first answer
        return Stream(gen)

    def generate(self, prompt: str | Messages, **options: Any) -> Response:
        """The whole answer at once."""
        last = Chunk("")
        for last in self.stream(prompt, **options):
            pass
        assert last.result is not None and last.stats is not None
        return Response(last.result.text, last.result.finish_reason, last.result, last.result, last.result.logprobs)

    def chat(self, messages: Messages, **options: Any) -> Response:
        """The assistant's reply to a conversation (a list of ``{"role", "content"}``)."""
        if isinstance(messages, str):
            raise UsageError("chat() takes a list of messages", hint="use generate() for a string")
        return self.generate(messages, **options)

    def __enter__(self) -> Model:
        return self


def load(
    name: str | None = None,
    *,
    options: LoadOptions | None = None,
    offline: bool = False,
    force: bool = False,
    on_note: Callable[[str], None] | None = None,
    **load_options: Any,
) -> Model:
    """Resolve ``name`` as the CLI does (a registry name, an installed model or a .gguf path; None
    for the default), pulling it if needed, then pre-flight and load it. ``load_options``: fields
    of LoadOptions (``n_ctx=2048``, ``n_threads=4``, ``n_gpu_layers=-1``...; ``draft="ngram"``:
    speculative decoding by n-gram lookup, ``draft_max=N`` tokens per guess; ``draft_model="NAME"``:
    an installed small model of the same vocabulary guesses instead). ``on_note``: receives
    the pre-flight's notes (a context made smaller to fit...)."""
    from localinfer.store import resolve_model

    return load_resolved(resolve_model(name, offline=offline), options or LoadOptions(**load_options), force=force, on_note=on_note)


def load_resolved(
    resolved: ResolvedModel, options: LoadOptions, *, force: bool = False, on_note: Callable[[str], None] | None = None
) -> Model:
    from localinfer.generate.loading import load as load_model

    return Model(load_model(resolved, options, force=force, on_note=on_note))
