"""A served request made ready to queue, off the engine thread: prepared as every entry prepares one
(``generate.prepare``: its prompt rendered and tokenized, its stop strings, thinking splitter and
tool plan), its constraint compiled, and its max_tokens held within one sequence's context and
serve's -n - each problem a 400 in the protocol's error shape before it waits.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from localinfer.request import rules
from localinfer.errors import ContextOverflowError, UsageError
from localinfer.generate.prepare import Prepared
from localinfer.serve.wires.openai import ApiError, Envelope

if TYPE_CHECKING:
    from localinfer.generate.loading import LoadedModel

__all__ = ["Prepared", "prepare"]  # Prepared: the one made by every entry (generate.prepare), its ``asked`` the Envelope


def prepare(loaded: LoadedModel, n_ctx_seq: int, template_kwargs: dict[str, Any], envelope: Envelope,
            *, clamp: bool = False, n_predict: int = -1) -> Prepared:  # fmt: skip
    """Render and tokenize the prompt and compile the format (any thread: the template, the
    tokenizer and the compiler are thread-safe); a prompt that does not fit one sequence's context
    with ``max_tokens`` (``clamp``: the prompt alone, max_tokens lowered to what is left), or a
    format that does not compile, is a 400. ``template_kwargs``: the server's --chat-template-kwargs;
    ``n_predict``: its -n, the cap of an answer whose request names none (``_capped``)."""
    prepared = _checked(loaded, n_ctx_seq, _prepare(loaded, n_ctx_seq, template_kwargs, envelope), clamp)
    prepared = _capped(prepared, n_predict, n_ctx_seq)  # both limits of max_tokens, in this one step
    _compiled(loaded, prepared)
    return prepared


def _prepare(loaded: LoadedModel, n_ctx_seq: int, template_kwargs: dict[str, Any], envelope: Envelope) -> Prepared:
    from localinfer.engine.templates import TemplateRefusedError
    from localinfer.generate.prepare import prepare as prepare_request
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
        prepared = prepare_request(loaded, req, n_ctx=n_ctx_seq)
    except ContextOverflowError as exc:
        cause = _overflow(loaded, n_ctx_seq, exc.prompt_tokens or 0, request.max_tokens)
        raise ApiError(400, f"{exc}; it must fit one sequence's context (--ctx-size)", code="context_length_exceeded",
                       cause=cause) from None  # fmt: skip
    except ImageError as exc:  # an image to a model without a projector: not the template's doing
        cause = UsageError(str(exc), hint=exc.hint)  # a type the resident client knows (localinfer.errors)
        raise ApiError(400, str(exc), code="invalid_image", cause=cause) from None
    except (UsageError, TemplateRefusedError, rules.RuleError) as exc:
        raise ApiError(400, f"the chat template refused these messages: {exc}", code="template_error") from None
    return dataclasses.replace(prepared, asked=envelope)  # the request as asked: max_tokens is checked next


def _compiled(loaded: LoadedModel, prepared: Prepared) -> None:
    """Compile the answer's constraint (the request's format, or its tools' calls) here, off the
    engine thread (the engine finds it in the model's cache): one that does not compile, or a
    tools' schema past the size bound, is a 400 before the request is queued."""
    from localinfer.engine.constrain import compile_for
    from localinfer.request.structured import FormatError

    field = prepared.asked.format_field if prepared.tools is None or not prepared.tools.offered else "tools"
    try:
        fmt, _ = prepared.constraint
        if fmt is not None:
            compile_for(loaded.model, fmt)
    except FormatError as exc:
        raise ApiError(400, f"'{field}' cannot be enforced: {exc}", param=field, code="invalid_schema") from None


def _checked(loaded: LoadedModel, n_ctx_seq: int, p: Prepared, clamp: bool = False) -> Prepared:
    """Refused, not capped: a client asking for more tokens than fit learns it now (as OpenAI's API);
    with ``clamp``, max_tokens is lowered to what the prompt leaves (Claude Code asks for 32k)."""
    n, wanted = len(p.tokens), p.request.max_tokens
    if clamp and wanted is not None and n < n_ctx_seq < n + wanted:
        return p.capped(n_ctx_seq - n)
    if n + (wanted or 1) > n_ctx_seq:
        what = f"the prompt ({n} tokens)" + (f" and max_tokens ({wanted})" if wanted else "")
        raise ApiError(400, f"{what} exceed the context of a sequence ({n_ctx_seq} tokens)", code="context_length_exceeded",
                       cause=_overflow(loaded, n_ctx_seq, n, wanted))  # fmt: skip
    return p


def _capped(p: Prepared, n_predict: int, n_ctx_seq: int) -> Prepared:
    """--n-predict (llama-server's -n): the answer's cap when the request names none (Codex never
    does, and a small model may never stop), within what the prompt leaves: never a reason to refuse."""
    if n_predict <= 0 or p.request.max_tokens is not None:
        return p
    return p.capped(max(1, min(n_predict, n_ctx_seq - len(p.tokens))))


def _overflow(loaded: LoadedModel, n_ctx_seq: int, n_prompt: int, max_tokens: int | None) -> ContextOverflowError:
    """The error `run` would have given here (the resident server's client shows it as its own)."""
    from localinfer.generate.prepare import overflow_error

    room = not max_tokens or max_tokens < n_ctx_seq  # else: no room for any prompt, as build_prompt says
    return overflow_error(n_prompt if room else 0, max_tokens, n_ctx_seq, loaded.model.n_ctx_train)
