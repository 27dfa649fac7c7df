"""A served request made ready to queue, off the engine thread: its prompt rendered and tokenized,
its stop strings, thinking splitter and tool plan, its constraint compiled, and its size checked
against one sequence's context - each problem a 400 in the protocol's error shape before it waits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localinfer.request import rules
from localinfer.errors import ContextOverflowError, UsageError
from localinfer.serve.wires.openai import ApiError, Envelope

if TYPE_CHECKING:
    from localinfer.generate.loading import LoadedModel
    from localinfer.request.request import Request
    from localinfer.request.reasoning import Splitter
    from localinfer.request.toolcalls.plan import ToolPlan


@dataclass(frozen=True)
class Prepared:
    """A request turned into what the decoder runs: prompt tokens and every stop string."""

    envelope: Envelope  # the request as asked (max_tokens lowered where the route clamps it, or set by -n)
    tokens: list[int]
    stop: tuple[str, ...]
    splitter: Splitter | None = None  # a reasoning model's thinking, apart from the answer
    tools: ToolPlan | None = None  # how the answer's tool calls are parsed (and constrained)

    @property
    def request(self) -> Request:
        return self.envelope.request


def prepare(loaded: LoadedModel, n_ctx_seq: int, template_kwargs: dict[str, Any], envelope: Envelope,
            *, clamp: bool = False) -> Prepared:  # fmt: skip
    """Render and tokenize the prompt and compile the format (any thread: the template, the
    tokenizer and the compiler are thread-safe); a prompt that does not fit one sequence's context
    with ``max_tokens`` (``clamp``: the prompt alone, max_tokens lowered to what is left), or a
    format that does not compile, is a 400. ``template_kwargs``: the server's --chat-template-kwargs."""
    prepared = _checked(loaded, n_ctx_seq, _prepare(loaded, n_ctx_seq, template_kwargs, envelope), clamp)
    _compiled(loaded, prepared)
    return prepared


def _prepare(loaded: LoadedModel, n_ctx_seq: int, template_kwargs: dict[str, Any], envelope: Envelope) -> Prepared:
    from localinfer.engine.templates import TemplateRefusedError
    from localinfer.generate.run import build_prompt, reasoning_splitter, tool_plan
    from localinfer.request.images import ImageError

    model, request, ids = loaded.model, envelope.request, envelope.prompt_ids
    if ids is not None:
        bad = next((t for t in ids if t >= model.n_vocab), None)
        if bad is not None:
            raise ApiError(400, f"token id {bad} is out of the vocabulary ({model.n_vocab} tokens)", param="prompt")
        return Prepared(envelope, list(ids), ())
    if request.mode == "chat" and loaded.template is None:
        raise ApiError(400, f"{loaded.name} has no chat template: use /v1/completions", code="no_chat_template")
    try:  # the server's template variables and the request's (which win), bounded as one
        variables = rules.chat_template_kwargs("chat_template_kwargs", {**template_kwargs, **(request.chat_template_kwargs or {})})
        req = dataclasses.replace(request, chat_template_kwargs=variables, max_tokens=None)  # max_tokens: checked below
        tokens, stops, _ = build_prompt(loaded, req, n_ctx=n_ctx_seq)
    except ContextOverflowError as exc:
        cause = _overflow(loaded, n_ctx_seq, exc.prompt_tokens or 0, request.max_tokens)
        raise ApiError(400, f"{exc}; it must fit one sequence's context (--ctx-size)", code="context_length_exceeded",
                       cause=cause) from None  # fmt: skip
    except ImageError as exc:  # an image to a model without a projector: not the template's doing
        cause = UsageError(str(exc), hint=exc.hint)  # a type the resident client knows (localinfer.errors)
        raise ApiError(400, str(exc), code="invalid_image", cause=cause) from None
    except (UsageError, TemplateRefusedError, rules.RuleError) as exc:
        raise ApiError(400, f"the chat template refused these messages: {exc}", code="template_error") from None
    return Prepared(envelope, tokens, stops, reasoning_splitter(loaded, req, tokens), tool_plan(loaded, req))


def _compiled(loaded: LoadedModel, prepared: Prepared) -> None:
    """Compile the answer's constraint (the request's format, or its tools' calls) here, off the
    engine thread (the engine finds it in the model's cache): one that does not compile, or a
    tools' schema past the size bound, is a 400 before the request is queued."""
    from localinfer.engine.constrain import compile_for
    from localinfer.generate.run import constraint_for
    from localinfer.request.structured import FormatError

    field = prepared.envelope.format_field if prepared.tools is None or not prepared.tools.offered else "tools"
    try:
        fmt, _ = constraint_for(prepared.tools, prepared.request.response_format, prepared.splitter)
        if fmt is not None:
            compile_for(loaded.model, fmt)
    except FormatError as exc:
        raise ApiError(400, f"'{field}' cannot be enforced: {exc}", param=field, code="invalid_schema") from None


def _checked(loaded: LoadedModel, n_ctx_seq: int, p: Prepared, clamp: bool = False) -> Prepared:
    """Refused, not capped: a client asking for more tokens than fit learns it now (as OpenAI's API);
    with ``clamp``, max_tokens is lowered to what the prompt leaves (Claude Code asks for 32k)."""
    n, wanted = len(p.tokens), p.request.max_tokens
    if clamp and wanted is not None and n < n_ctx_seq < n + wanted:
        lowered = dataclasses.replace(p.request, max_tokens=n_ctx_seq - n)
        return dataclasses.replace(p, envelope=dataclasses.replace(p.envelope, request=lowered))
    if n + (wanted or 1) > n_ctx_seq:
        what = f"the prompt ({n} tokens)" + (f" and max_tokens ({wanted})" if wanted else "")
        raise ApiError(400, f"{what} exceed the context of a sequence ({n_ctx_seq} tokens)", code="context_length_exceeded",
                       cause=_overflow(loaded, n_ctx_seq, n, wanted))  # fmt: skip
    return p


def default_cap(p: Prepared, n_predict: int, n_ctx_seq: int) -> Prepared:
    """--n-predict (llama-server's -n): the answer's cap when the request names none (Codex never
    does, and a small model may never stop), within what the prompt leaves: never a reason to refuse."""
    if n_predict <= 0 or p.request.max_tokens is not None:
        return p
    capped = dataclasses.replace(p.request, max_tokens=max(1, min(n_predict, n_ctx_seq - len(p.tokens))))
    return dataclasses.replace(p, envelope=dataclasses.replace(p.envelope, request=capped))


def _overflow(loaded: LoadedModel, n_ctx_seq: int, n_prompt: int, max_tokens: int | None) -> ContextOverflowError:
    """The error `run` would have given here (the resident server's client shows it as its own)."""
    from localinfer.generate.run import overflow_error

    room = not max_tokens or max_tokens < n_ctx_seq  # else: no room for any prompt, as build_prompt says
    return overflow_error(n_prompt if room else 0, max_tokens, n_ctx_seq, loaded.model.n_ctx_train)
