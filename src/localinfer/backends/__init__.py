"""A model that answers requests, wherever it runs: :class:`Backend`, with two implementations — the
engine here (``backends.local``: one sequence, or many at once for batch) and an OpenAI-compatible
server (``backends.remote``, ``--endpoint``). `run`, `chat` and `batch` are written once against this
interface; ``--endpoint`` only chooses which backend is made.

A backend is made by :func:`load` or :func:`connect`; it builds its requests (:meth:`Backend.request`: one builder for every command), answers them
one at a time (:meth:`Backend.answer`) or many at once (:meth:`Backend.run_batch`), and gives one
answer record (``localinfer.answer.answer.Answer``) whichever it is. It also embeds texts
(:meth:`Backend.embeddings`: the engine's embedding context, or the server's /v1/embeddings).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from localinfer.errors import LocalInferError, UsageError

if TYPE_CHECKING:
    from localinfer.answer.answer import Answer
    from localinfer.request.request import BatchRequest, InputError
    from localinfer.answer.answer import BatchResult
    from localinfer.embed.embedding import Embedding
    from localinfer.backends.local import LocalBackend
    from localinfer.backends.remote import RemoteBackend
    from localinfer.engine.types import LoadOptions
    from localinfer.remote.connection import Endpoint
    from localinfer.request.request import Messages, Request
    from localinfer.store import ResolvedModel

OnText = Callable[[str], None]
Note = Callable[[str], None]
Items = Sequence["BatchRequest | InputError"]
ToRequest = Callable[["BatchRequest"], "Request"]


class Backend:
    """A model that answers requests (see the module docstring). Ctrl-C during :meth:`answer`
    raises ``errors.Interrupted`` carrying what was answered so far (an Answer, or None)."""

    name: str  # the model's name (here: the registry's or the file's; on a server: its id)
    sha256: str | None = None  # the weights' digest, where known (the usage history keeps it)

    @property
    def endpoint(self) -> str | None:
        """The server that answers (no credentials); None: this machine."""
        return None

    @property
    def can_chat(self) -> bool:
        """Whether a prompt goes through a chat template (a server formats chats itself)."""
        return True

    def request(self, prompt: str | Messages, *, raw: bool = False, **fields: Any) -> Request:
        """The request for a prompt (a string: a user message through the chat template, plain
        completion with ``raw`` or where the model has none) or a conversation (a list of messages);
        ``fields``: the rest of ``request.build``'s (system, sampling, max_tokens, stop...)."""
        from localinfer.request import request as rq

        plain = raw or not self.can_chat
        if not isinstance(prompt, str) and plain:
            raise UsageError(f"{self.name} has no chat template to format messages with", hint="pass a string")
        if isinstance(prompt, str):
            return rq.build(prompt, raw=plain, **fields)
        return rq.build(messages=prompt, **fields)

    def answer(self, request: Request, on_text: OnText | None = None, *, on_reasoning: OnText | None = None) -> Answer:
        """Answer one request, handing each piece of text to ``on_text`` as it comes, and a reasoning
        model's thinking (``Answer.reasoning``) to ``on_reasoning``."""
        raise NotImplementedError

    def prompt_text(self, request: Request) -> tuple[str, int] | None:
        """The exact prompt the model gets for ``request`` and its token count (`--show-prompt`);
        None where a server builds it."""
        return None

    def batch_stats(self) -> Any:
        """An object the next :meth:`run_batch` fills with aggregate figures (``decode_tps``), or None."""
        return None

    def run_batch(self, items: Items, to_request: ToRequest, parallel: int, *, stats: Any = None) -> Iterator[BatchResult]:
        """Answer ``items`` up to ``parallel`` at a time: one result per item in completion order,
        errors included (a line that is not a request, a prompt that does not fit)."""
        raise NotImplementedError

    def embeddings(
        self, inputs: Sequence[str | Sequence[int]], *, normalize: bool = True, pooling: str | None = None,
        truncate: bool = False, n_ctx: int | None = None, on_done: Callable[[int], None] | None = None,
    ) -> list[Embedding]:  # fmt: skip
        """One :class:`~localinfer.embed.embedding.Embedding` per input (a text or token ids), in order; an
        input that cannot be embedded (empty, longer than the context without ``truncate``) has its
        ``error``, the others are embedded all the same. ``pooling``: mean | cls | last (default: the
        model's); ``n_ctx``: the embedding context here (the longest input); ``on_done(n)``: n more done."""
        raise NotImplementedError

    def embed(self, texts: Sequence[str], *, normalize: bool = True, pooling: str | None = None,
              truncate: bool = False) -> list[list[float]]:  # fmt: skip
        """The vectors of ``texts``, in order; the first input that cannot be embedded raises its error."""
        if isinstance(texts, str):
            raise UsageError("embed() takes a list of texts", hint="wrap one text in a list: embed([text])")
        out = self.embeddings(texts, normalize=normalize, pooling=pooling, truncate=truncate)
        for i, e in enumerate(out):
            if e.vector is None:
                if isinstance(e.exc, LocalInferError):
                    raise e.exc
                raise UsageError(f"input {i}: {e.error}")
        return [e.vector for e in out if e.vector is not None]  # every one: the loop raised for any missing

    def reset(self) -> None:
        """Forget what earlier requests left behind (chat's /clear): the KV cache here."""

    def close(self) -> None:
        pass

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(
    resolved: ResolvedModel,
    options: LoadOptions,
    *,
    force: bool = False,
    on_note: Note | None = None,
    chat_only: bool = False,
    chat: bool = True,
) -> LocalBackend:
    """The engine here: pre-flight and load ``resolved`` (``generate.loading.load``, the one loader).
    ``chat_only``: refuse a model that cannot chat, before loading it when the GGUF says so.
    ``chat``: False where only plain completions will be asked (the template is not prepared)."""
    from localinfer.backends.local import LocalBackend
    from localinfer.generate.loading import load as load_model

    if chat_only and not (resolved.info.chat_template or resolved.chat_format):
        raise no_template_error(resolved.name)  # before spending time loading it
    loaded = load_model(resolved, options, force=force, on_note=on_note, chat=chat)
    if chat_only and loaded.template is None:
        loaded.close()
        raise no_template_error(resolved.name)
    return LocalBackend(loaded)


def connect(ep: Endpoint, *, pool: int = 1, retries: int = 4) -> RemoteBackend:
    """A server (``--endpoint``, checked by its option group: a bad URL failed before anything was
    sent); :meth:`RemoteBackend.choose` then names its model."""
    from localinfer.backends.remote import RemoteBackend
    from localinfer.remote.client import Client

    return RemoteBackend(Client(ep, pool=pool), retries=retries)


def no_template_error(name: str) -> UsageError:
    """The one-line refusal for a model that cannot chat (no template, no chat_format)."""
    return UsageError(
        f"{name} has no chat template and models.toml names no chat_format for it, so it cannot chat in "
        f"a format it was trained on; for plain completion use: localinfer run --raw -m {name}"
    )
