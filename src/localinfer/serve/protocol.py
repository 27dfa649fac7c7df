"""The OpenAI request bodies we accept, checked field by field: a ``CompletionRequest`` or an
``ApiError`` that says which field is wrong and why (HTTP 400), never a 500.

Fields llama.cpp cannot honour (tools, logprobs, n > 1...) are refused by name rather than ignored,
and so are unknown fields: a client never gets an answer to a different question than it asked.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localinfer.engine.types import SamplingOptions

MAX_STOPS = 16
MAX_MESSAGES = 4096
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class ApiError(Exception):
    """An answer that is an error: ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(
        self, status: int, message: str, *, type: str = "invalid_request_error", code: str | None = None,
        param: str | None = None, headers: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _bad(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, code=code, param=param)


@dataclass(frozen=True)
class CompletionRequest:
    """One validated request: a chat (``messages``) or a plain completion (``prompt``)."""

    kind: str  # chat | text
    model: str | None
    messages: tuple[dict[str, str], ...] = ()
    prompt: str | tuple[int, ...] | None = None  # text, or token ids
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    sampling: SamplingOptions = SamplingOptions()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False


# -- field checks: each takes (name, value) and returns the value to use ---------------------------------
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(lo: int, hi: int | None = None) -> Callable[[str, Any], int]:
    def check(name: str, v: Any) -> int:
        if not _is_int(v):
            raise _bad(name, f"'{name}' must be an integer, not {_kind(v)}", "invalid_type")
        if v < lo or (hi is not None and v > hi):
            raise _bad(name, f"'{name}' must be {_range(lo, hi)}, not {v}")
        return int(v)

    return check


def _number(lo: float, hi: float | None = None) -> Callable[[str, Any], float]:
    def check(name: str, v: Any) -> float:
        if not (_is_int(v) or isinstance(v, float)) or not math.isfinite(v):
            raise _bad(name, f"'{name}' must be a number, not {_kind(v)}", "invalid_type")
        if v < lo or (hi is not None and v > hi):
            raise _bad(name, f"'{name}' must be {_range(lo, hi)}, not {v}")
        return float(v)

    return check


def _bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise _bad(name, f"'{name}' must be true or false, not {_kind(v)}", "invalid_type")
    return v


def _string(name: str, v: Any) -> str:
    if not isinstance(v, str):
        raise _bad(name, f"'{name}' must be a string, not {_kind(v)}", "invalid_type")
    return v


def _stop(name: str, v: Any) -> tuple[str, ...]:
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise _bad(name, f"'{name}' must be a string or a list of strings", "invalid_type")
    if len(items) > MAX_STOPS:
        raise _bad(name, f"'{name}' takes at most {MAX_STOPS} strings")
    return tuple(s for s in items if s)


def _stream_options(name: str, v: Any) -> bool:
    if not isinstance(v, dict):
        raise _bad(name, f"'{name}' must be an object", "invalid_type")
    extra = set(v) - {"include_usage"}
    if extra:
        raise _bad(name, f"unknown field '{name}.{min(extra)}'", "unknown_parameter")
    return _bool(f"{name}.include_usage", v.get("include_usage", False))


def _only(allowed: Callable[[Any], bool], what: str) -> Callable[[str, Any], None]:
    """A field accepted only with the value that asks for nothing we lack (``n: 1``, ``echo: false``)."""

    def check(name: str, v: Any) -> None:
        if not allowed(v):
            raise _bad(name, f"'{name}' {what} is not supported by this server", "unsupported_parameter")

    return check


_UNSUPPORTED = {
    "n": _only(lambda v: v is None or (_is_int(v) and v == 1), "other than 1"),
    "logprobs": _only(lambda v: v in (None, False, 0), "(log probabilities)"),
    "top_logprobs": _only(lambda v: v in (None, 0), "(log probabilities)"),
    "logit_bias": _only(lambda v: not v, "(biasing tokens)"),
    "tools": _only(lambda v: not v, "(tool calls)"),
    "tool_choice": _only(lambda v: v in (None, "none"), "(tool calls)"),
    "response_format": _only(lambda v: v is None or v == {"type": "text"}, "other than text"),
    "echo": _only(lambda v: v in (None, False), "(echoing the prompt)"),
    "suffix": _only(lambda v: v in (None, ""), "(fill in the middle)"),
    "best_of": _only(lambda v: v is None or (_is_int(v) and v == 1), "other than 1"),
}
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty", "seed")
_COMMON: dict[str, Callable[[str, Any], Any]] = {
    "model": _string,
    "stream": _bool,
    "stream_options": _stream_options,
    "max_tokens": _int(1),
    "max_completion_tokens": _int(1),
    "temperature": _number(0.0, 2.0),
    "top_p": _number(0.0, 1.0),
    "top_k": _int(0),
    "min_p": _number(0.0, 1.0),
    "repeat_penalty": _number(0.0),
    "presence_penalty": _number(-2.0, 2.0),
    "frequency_penalty": _number(-2.0, 2.0),
    "stop": _stop,
    "seed": _int(0, 2**32 - 2),
    "user": _string,
    "ignore_eos": _bool,  # llama-server's: generate exactly max_tokens (benchmarks)
}
_CHAT_ONLY = {"n", "logprobs", "top_logprobs", "logit_bias", "tools", "tool_choice", "response_format"}
_TEXT_ONLY = {"n", "logprobs", "logit_bias", "echo", "suffix", "best_of"}


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object (bad JSON and other values are a 400)."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, not {_kind(body)}", code="invalid_json")
    return body


def parse_request(body: dict[str, Any], kind: str) -> CompletionRequest:
    """``kind``: chat (/v1/chat/completions) or text (/v1/completions)."""
    main = "messages" if kind == "chat" else "prompt"
    unsupported = _CHAT_ONLY if kind == "chat" else _TEXT_ONLY
    for name in body:
        if name != main and name not in _COMMON and name not in unsupported:
            raise _bad(name, f"unknown field '{name}'", "unknown_parameter")
    for name in unsupported & set(body):
        _UNSUPPORTED[name](name, body[name])
    if main not in body:
        raise _bad(main, f"'{main}' is required", "missing_parameter")
    v = {name: _COMMON[name](name, value) for name, value in body.items() if name in _COMMON and value is not None}
    if "max_tokens" in v and "max_completion_tokens" in v and v["max_tokens"] != v["max_completion_tokens"]:
        raise _bad("max_tokens", "'max_tokens' and 'max_completion_tokens' disagree")
    sampling = SamplingOptions(**{k: v[k] for k in _SAMPLING if k in v})
    if "stream_options" in v and not v.get("stream"):
        raise _bad("stream_options", "'stream_options' is only allowed with 'stream': true")
    return CompletionRequest(
        kind=kind,
        model=v.get("model"),
        messages=_messages(body[main]) if kind == "chat" else (),
        prompt=_prompt(body[main]) if kind == "text" else None,
        stream=v.get("stream", False),
        include_usage=v.get("stream_options", False),
        max_tokens=v.get("max_completion_tokens", v.get("max_tokens")),
        sampling=sampling,
        stop=v.get("stop", ()),
        ignore_eos=v.get("ignore_eos", False),
    )


def _messages(value: Any) -> tuple[dict[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise _bad("messages", "'messages' must be a non-empty list of messages", "invalid_type")
    if len(value) > MAX_MESSAGES:
        raise _bad("messages", f"'messages' takes at most {MAX_MESSAGES} messages")
    return tuple(_message(i, m) for i, m in enumerate(value))


def _message(i: int, m: Any) -> dict[str, str]:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise _bad(where, f"'{where}' must be an object", "invalid_type")
    extra = set(m) - {"role", "content", "name"}
    if extra:
        raise _bad(where, f"'{where}.{min(extra)}' is not supported (text messages only)", "unsupported_parameter")
    role = m.get("role")
    if role not in ROLES:
        raise _bad(f"{where}.role", f"'{where}.role' must be one of {', '.join(ROLES)}, not {role!r}")
    content = m.get("content")
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _bad(f"{where}.content[{j}]", f"'{where}.content[{j}]' must be a text part (this server reads text only)")
            parts.append(part["text"])
        content = "".join(parts)
    if not isinstance(content, str):
        raise _bad(f"{where}.content", f"'{where}.content' must be a string or a list of text parts", "invalid_type")
    out = {"role": ROLES[role], "content": content}
    if "name" in m:
        out["name"] = _string(f"{where}.name", m["name"])
    return out


def _prompt(value: Any) -> str | tuple[int, ...]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    if isinstance(value, str):
        if not value:
            raise _bad("prompt", "'prompt' must not be empty")
        return value
    if isinstance(value, list) and value and all(_is_int(t) and t >= 0 for t in value):
        return tuple(value)
    raise _bad("prompt", "'prompt' must be a string, or a list of token ids (one prompt per request)", "invalid_type")


def _kind(v: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "an object"}
    return "null" if v is None else names.get(type(v), type(v).__name__)


def _range(lo: float, hi: float | None) -> str:
    return f"at least {lo}" if hi is None else f"between {lo} and {hi}"
