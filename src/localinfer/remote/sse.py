"""Server-sent events as OpenAI streams use them: lines in, one JSON chunk (or the end) out.

The decoding follows the WHATWG rules (``data:`` lines joined by newlines, an empty line dispatches,
``:`` comments and unknown fields ignored). What is not an OpenAI chunk is refused with a
ProtocolError naming what was wrong, so a broken server never becomes a silently empty answer.
"""

from __future__ import annotations

import json
from typing import Any

from localinfer.remote.connection import ProtocolError, RemoteError

DONE = "[DONE]"
_PREVIEW = 80


class SSEDecoder:
    """Feed it lines (without their line ending); it returns an event's data when one is complete."""

    def __init__(self) -> None:
        self._data: list[str] = []
        self._event = ""

    def feed(self, line: str) -> tuple[str, str] | None:
        """(event type, data) when ``line`` ends an event, else None."""
        if not line:
            if not self._data:
                self._event = ""
                return None
            out = (self._event or "message", "\n".join(self._data))
            self._data, self._event = [], ""
            return out
        if line.startswith(":"):
            return None  # a comment, e.g. a keep-alive ping
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None  # id, retry and unknown fields mean nothing to a completion stream

    def pending(self) -> bool:
        """Whether data was received that no empty line has dispatched yet (a cut-off event)."""
        return bool(self._data)


def _preview(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _PREVIEW else text[:_PREVIEW] + "…"


def parse_event(event: str, data: str, where: str) -> dict[str, Any] | None:
    """The chunk in one event; None for the ``[DONE]`` that ends the stream.

    An ``error`` event or an ``{"error": ...}`` chunk (llama-server, vLLM and ours report a failure
    during the answer that way) raises RemoteError with the server's message.
    """
    if data.strip() == DONE:
        return None
    try:
        obj = json.loads(data)
    except ValueError:
        raise ProtocolError(
            f"{where} sent a malformed event: its data is not JSON ({_preview(data)!r})",
            hint="the server is not speaking OpenAI's streaming protocol; check --endpoint",
        ) from None
    if event == "error" or (isinstance(obj, dict) and obj.get("error") is not None):
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        msg = err.get("message") if isinstance(err, dict) else err
        raise RemoteError(f"{where} failed during the answer: {msg}", hint="see the server's log")
    if not isinstance(obj, dict):
        raise ProtocolError(f"{where} sent a malformed event: a chunk must be a JSON object ({_preview(data)!r})")
    choices = obj.get("choices")
    if choices is None and obj.get("usage") is None:
        raise ProtocolError(f"{where} sent a malformed event: a chunk without 'choices' ({_preview(data)!r})")
    if choices is not None and (not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices)):
        raise ProtocolError(f"{where} sent a malformed event: 'choices' must be a list of objects ({_preview(data)!r})")
    return obj


def choice_text(choice: dict[str, Any], where: str) -> str:
    """The text a choice adds: ``delta.content`` (chat) or ``text`` (completions)."""
    delta = choice.get("delta")
    if delta is not None:
        if not isinstance(delta, dict):
            raise ProtocolError(f"{where} sent a malformed event: 'delta' must be an object")
        text = delta.get("content")
    else:
        text = choice.get("text")
    if text is None:
        return ""
    if not isinstance(text, str):
        raise ProtocolError(f"{where} sent a malformed event: the content must be a string, not {type(text).__name__}")
    return text


def choice_logprobs(choice: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A choice's log probabilities as content entries (``{"token", "logprob", "bytes",
    "top_logprobs"}``): chat's ``logprobs.content`` (llama-server's completions send it too), or the
    completions API's legacy ``tokens``/``token_logprobs``/``top_logprobs`` lists; None when absent."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return None
    content = lp.get("content")
    if isinstance(content, list):
        return [_entry(e) for e in content if isinstance(e, dict)]
    tokens, values = lp.get("tokens"), lp.get("token_logprobs")
    if not isinstance(tokens, list) or not isinstance(values, list):
        return None
    tops = lp.get("top_logprobs") if isinstance(lp.get("top_logprobs"), list) else []
    out = []
    for i, (tok, value) in enumerate(zip(tokens, values)):
        top = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
        out.append(_entry({"token": tok, "logprob": value,
                           "top_logprobs": [{"token": t, "logprob": v} for t, v in top.items()]}))  # fmt: skip
    return out


def _entry(e: dict[str, Any], top: bool = True) -> dict[str, Any]:
    """One entry with every key (``bytes`` from the text where a server sent none)."""
    token = e.get("token") if isinstance(e.get("token"), str) else ""
    raw = e.get("bytes")
    out: dict[str, Any] = {
        "token": token,
        "logprob": e.get("logprob") if isinstance(e.get("logprob"), (int, float)) else None,
        "bytes": raw if isinstance(raw, list) else list(token.encode("utf-8", errors="surrogatepass")),
    }
    if top:
        alts = e.get("top_logprobs")
        out["top_logprobs"] = [_entry(t, top=False) for t in alts if isinstance(t, dict)] if isinstance(alts, list) else []
    return out
