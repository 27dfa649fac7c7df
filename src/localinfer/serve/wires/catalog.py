"""The protocols the one exchange (``exchange.answer``) runs, each as a ``Wire``: OpenAI's Chat
Completions and Completions (``openai``'s parser, ``chat_completions``' writer), Anthropic's Messages
(``anthropic``) and OpenAI's Responses API (``responses``). Ollama's is ``ollama.routes``'."""

from __future__ import annotations

import functools

from localinfer.serve.http.exchange import Wire
from localinfer.serve.wires.openai import ApiError, parse_request
from localinfer.serve.wires.chat_completions import CompletionWriter


def _chat_wire(kind: str, whole: bool = False) -> Wire:
    return Wire(functools.partial(parse_request, kind=kind), functools.partial(ApiError.body, whole=whole),
                lambda picked, req, prepared: CompletionWriter.new(kind, picked.name, req.include_usage, whole, req.return_progress),
                clamp=not whole)  # fmt: skip


CHAT, COMPLETIONS = _chat_wire("chat"), _chat_wire("text")
# The resident server's (its create_app): answers and errors also carry what our CLI reads,
# and max_tokens past the context is refused there as `run` refuses it
WHOLE = {"chat": _chat_wire("chat", True), "text": _chat_wire("text", True)}


def messages(*, counting: bool = False) -> Wire:
    """Anthropic's Messages (``counting``: count_tokens' request, never answered by a writer)."""
    from localinfer.serve.wires import anthropic
    if counting:
        return Wire(functools.partial(anthropic.parse, counting=True), anthropic.error_body, lambda *_: None)
    return Wire(anthropic.parse, anthropic.error_body,
                lambda picked, req, p: anthropic.AnthropicWriter(picked.name, len(p.tokens), req.request.stop))  # fmt: skip


def responses() -> Wire:
    """OpenAI's Responses API."""
    from localinfer.serve.wires import responses as ra
    return Wire(ra.parse, ra.error_body, lambda picked, req, p: ra.ResponsesWriter(picked.name, req.request))
