"""The OpenAI request bodies we accept, checked field by field: the core ``Request`` in an ``Envelope``
(what is only about the wire: the model's name, streaming...) or an ``ApiError`` that says which field
is wrong and why (HTTP 400), never a 500. Every other wire's parser ends in ``envelope`` too.

Fields this server does not honour yet (n > 1...) are refused by name rather than ignored,
and so are unknown fields: a client never gets an answer to a different question than it asked.
Structured output (``response_format``, llama-server's ``json_schema`` and ``grammar``) is checked
here, so a schema we cannot enforce is a 400 naming its keyword before anything runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from localinfer.request import format_rules, rules
from localinfer.request.sampling import SamplingOptions
from localinfer.request.limits import NotText, loads, non_finite, require_text
from localinfer.request.request import Request

MAX_STOPS = rules.MAX_STOPS
MAX_MESSAGES = rules.MAX_MESSAGES
ROLES = rules.ROLES


class ApiError(Exception):
    """An answer that is an error: ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(
        self, status: int, message: str, *, type: str = "invalid_request_error", code: str | None = None,
        param: str | None = None, headers: dict[str, str] | None = None, cause: Exception | None = None,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param
        self.headers = headers or {}
        self.cause = cause  # our own error behind it (a context overflow), for the resident server's client

    def body(self, whole: bool = False) -> dict[str, Any]:
        """The error; ``whole`` (the resident server's wires, catalog.WHOLE) adds the error behind it as our CLI reads
        it (``localinfer``: its type, message and hint), so it crosses the process unchanged."""
        out: dict[str, Any] = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        if whole and self.cause is not None:
            out["localinfer"] = {"type": type(self.cause).__name__, "message": str(self.cause),
                                 "hint": getattr(self.cause, "hint", None)}  # fmt: skip
        return out


def field_error(param: str, message: str, code: str = "invalid_value") -> ApiError:
    """A 400 naming the request's field at fault."""
    return ApiError(400, message, code=code, param=param)


P = ParamSpec("P")
T = TypeVar("T")


def field_errors(bad: Callable[[str, str, str], ApiError] = field_error) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """A wire's parser whose ``rules.RuleError`` (a field that breaks its rule) is raised as ``bad``'s
    400 naming the field: every wire's parse."""

    def wrap(parse: Callable[P, T]) -> Callable[P, T]:
        @functools.wraps(parse)
        def checked(*args: P.args, **kwargs: P.kwargs) -> T:
            try:
                return parse(*args, **kwargs)
            except rules.RuleError as exc:
                raise bad(exc.field, str(exc), exc.code) from None

        return checked

    return wrap


@dataclass(frozen=True)
class Envelope:
    """One served request, as every wire's parser gives it: the core ``Request`` (what is asked, as
    `run`, a batch line and the API ask it) and what is only about the wire it came by."""

    request: Request
    model: str | None = None
    stream: bool = False
    include_usage: bool = False
    format_field: str | None = None  # where the format is asked (response_format.json_schema.schema | json_schema | grammar...)
    cache_prompt: bool = True  # reuse a cached prefix of the prompt (llama-server's field)
    prompt_ids: tuple[int, ...] | None = None  # a completion's prompt given as token ids (``request.raw_text`` is "")
    # llama-server's speculative.n_max / n_min under serve --draft: (None, 0) as the server drafts; n_max 0: not at all
    draft_max: int | None = None
    draft_min: int = 0
    return_progress: bool = False  # llama-server's: a stream carries prompt_progress chunks while the prompt is read

    def __post_init__(self) -> None:
        # every wire's parser builds this: the tools-and-format rule holds on all of them alike
        r, asked = self.request, None  # the field that asks for the format, not where its schema sits inside it
        if r.response_format is not None:
            asked = (self.format_field or "response_format").removesuffix(".schema").removesuffix(".json_schema")
        try:
            format_rules.tools_with_format(asked, bool(r.tools), r.tool_choice.mode if r.tool_choice else None)
        except rules.RuleError as exc:
            raise field_error(exc.field, str(exc), exc.code) from None

    @property
    def kind(self) -> str:
        """chat (a conversation) | text (a plain completion)."""
        return "chat" if self.request.mode == "chat" else "text"


def envelope(*, model: str | None = None, stream: bool = False, include_usage: bool = False, format_field: str | None = None,
             cache_prompt: bool = True, messages: tuple[dict[str, Any], ...] | None = None,
             prompt: str | tuple[int, ...] | None = None, draft_max: int | None = None, draft_min: int = 0,
             return_progress: bool = False, **fields: Any) -> Envelope:  # fmt: skip
    """A chat (``messages``) or a plain completion (``prompt``: text, or token ids) as the core Request,
    ``fields`` its other fields, with the wire's own around it: every parser's last step."""
    ids = prompt if isinstance(prompt, tuple) else None
    if messages is not None:
        request = Request(messages=messages, **fields)
    else:
        request = Request(raw_text="" if ids is not None else prompt, **fields)
    return Envelope(request, model, stream, include_usage, format_field, cache_prompt, ids, draft_max, draft_min, return_progress)


# -- field checks: each takes (name, value) and returns the value to use (localinfer.request.rules) ------------
def _rule(field: str) -> Callable[[str, Any], Any]:
    return lambda name, v: rules.check(field, v, name=name)


def _text(name: str, v: Any) -> str:
    return rules.text(name, v)


def _bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise rules.RuleError(name, f"must be true or false, not {rules.shown(v)}", "invalid_type")
    return v


def _object(name: str, v: Any) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise rules.RuleError(name, f"must be an object, not {rules.shown(v)}", "invalid_type")
    return v


def _metadata(name: str, v: Any) -> None:
    """OpenAI's: up to 16 string values, kept by OpenAI for its dashboard; we keep nothing."""
    for key, value in _object(name, v).items():
        _text(f"{name}.{key}", value)


def _stream_options(name: str, v: Any) -> bool:
    opts = _object(name, v)
    extra = set(opts) - {"include_usage", "include_obfuscation"}
    if extra:
        raise rules.RuleError(name, f"has an unknown field '{min(extra)}'", "unknown_parameter")
    if "include_obfuscation" in opts:  # OpenAI's padding against length side channels: we send none
        _bool(f"{name}.include_obfuscation", opts["include_obfuscation"])
    return _bool(f"{name}.include_usage", opts.get("include_usage", False))


def _n_predict(name: str, v: Any) -> int | None:
    """llama-server's max_tokens, where -1 means no limit."""
    return None if v == -1 and _is_int(v) else rules.check("max_tokens", v, name=name)


def _draft_size(name: str, v: Any) -> int:
    """speculative.n_max / n_min: tokens drafted per step, 0 to engine.draft's MAX_DRAFT_LIMIT."""
    from localinfer.engine.draft import MAX_DRAFT_LIMIT

    if not _is_int(v) or not 0 <= v <= MAX_DRAFT_LIMIT:
        raise rules.RuleError(name, f"must be an integer from 0 to {MAX_DRAFT_LIMIT}, not {rules.shown(v)}", "invalid_value")
    return v


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _only(allowed: Callable[[Any], bool], what: str) -> Callable[[str, Any], None]:
    """A field accepted only with the value that asks for nothing we lack (``n: 1``, ``echo: false``)."""

    def check(name: str, v: Any) -> None:
        if not allowed(v):
            raise field_error(name, f"'{name}' {what} is not supported by this server", "unsupported_parameter")

    return check


_UNSUPPORTED = {
    "n": _only(lambda v: v is None or (_is_int(v) and v == 1), "other than 1"),
    "logit_bias": _only(lambda v: not v, "(biasing tokens)"),
    "modalities": _only(lambda v: v in (None, ["text"]), "other than [\"text\"]"),
    "echo": _only(lambda v: v in (None, False), "(echoing the prompt)"),
    "suffix": _only(lambda v: v in (None, ""), "(fill in the middle)"),
    "best_of": _only(lambda v: v is None or (_is_int(v) and v == 1), "other than 1"),
}
_SAMPLING = rules.SAMPLING_FIELDS
# Accepted and ignored: they ask for nothing that changes the answer (docs/serve-fields.md).
_IGNORED: dict[str, Callable[[str, Any], Any]] = {
    "user": _text,
    "store": _bool,  # OpenAI keeps the answer for its dashboard; we keep nothing
    "metadata": _metadata,
    "service_tier": _text,  # a price and latency class
    "prompt_cache_key": _text,  # OpenAI's cache routing hint
    "safety_identifier": _text,
}
_COMMON: dict[str, Callable[[str, Any], Any]] = {
    "model": rules.model_name,
    "stream": _bool,
    "stream_options": _stream_options,
    "max_tokens": _rule("max_tokens"),
    "max_completion_tokens": _rule("max_tokens"),
    "n_predict": _n_predict,  # llama-server's
    **{name: _rule(name) for name in _SAMPLING},
    "stop": rules.stop,
    "ignore_eos": _bool,  # llama-server's: generate exactly max_tokens (benchmarks)
    "cache_prompt": _bool,  # llama-server's: false = evaluate the whole prompt (no prefix reuse)
    "return_progress": _bool,  # llama-server's: prompt_progress chunks in a stream (ignored without one)
    "speculative.n_max": _draft_size,  # llama-server's (flat, dotted names): serve --draft's sizes per request
    "speculative.n_min": _draft_size,
    "chat_template_kwargs": rules.chat_template_kwargs,
    "reasoning_format": rules.reasoning_format,
    **_IGNORED,
}
# One way to ask for a structured answer, on chat and completions alike: OpenAI's, or llama-server's
_FORMATS: dict[str, Callable[[str, Any], Any]] = {
    "response_format": format_rules.response_format,
    "json_schema": format_rules.json_schema,
    "grammar": format_rules.grammar,
}
_LOGPROBS = {"logprobs", "top_logprobs"}  # chat's pair; completions take logprobs: N (rules.logprobs_fields)
_CHAT_ONLY = {"n", "logit_bias", "modalities"}
_TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls")  # chat only (localinfer.request.toolcalls)
_TEXT_ONLY = {"n", "logit_bias", "echo", "suffix", "best_of"}


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object (bad JSON and other values are a 400, never a 500)."""
    try:
        body = loads(raw, "the request body")
        require_text(body, raw)
    except NotText as exc:
        raise ApiError(400, f"the request body is not text: {exc}", code="invalid_value", param=exc.path) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, not {rules.shown(body)}", code="invalid_json")
    for field, value in non_finite(body):  # a keep_alive of NaN never expired; /api/ps could not be written
        try:
            if field in rules.RULES:  # its own rule's verdict and message, as batch lines and /set give it
                rules.check(field, value)  # repeat_penalty takes infinity
                continue
            raise rules.RuleError(field, f"must be a finite number, not {rules.shown(value)}")
        except rules.RuleError as exc:
            raise field_error(exc.field, str(exc), exc.code) from None
    return body


_TOKEN_LIMITS = ("max_tokens", "max_completion_tokens", "n_predict")


@field_errors()
def parse_request(body: dict[str, Any], kind: str) -> Envelope:
    """``kind``: chat (/v1/chat/completions) or text (/v1/completions)."""
    main = "messages" if kind == "chat" else "prompt"
    unsupported = _CHAT_ONLY if kind == "chat" else _TEXT_ONLY
    for name in body:
        if (name != main and name not in _COMMON and name not in unsupported and name not in _LOGPROBS | _FORMATS.keys()
                and not (kind == "chat" and name in _TOOL_FIELDS)):  # fmt: skip
            raise field_error(name, f"unknown field '{name}'", "unknown_parameter")
    for name in unsupported & set(body):
        _UNSUPPORTED[name](name, body[name])
    if main not in body:
        raise field_error(main, f"'{main}' is required", "missing_parameter")
    v = {name: _COMMON[name](name, value) for name, value in body.items() if name in _COMMON and value is not None}
    limits = {name: v[name] for name in _TOKEN_LIMITS if name in body and body[name] is not None}
    if len(set(limits.values())) > 1:
        first, second = list(limits)[:2]
        raise field_error(first, f"'{first}' and '{second}' disagree")
    sampling = SamplingOptions(**{k: v[k] for k in _SAMPLING if k in v})
    formats = [(name, body[name]) for name in _FORMATS if body.get(name) is not None]
    if len(formats) > 1:
        raise field_error(formats[1][0], f"'{formats[0][0]}' and '{formats[1][0]}' both ask for the answer's format: give one")
    fmt = _FORMATS[formats[0][0]](*formats[0]) if formats else None
    tools = _tools(body) if kind == "chat" else {}
    return envelope(
        model=v.get("model"),
        messages=rules.messages("messages", body[main]) if kind == "chat" else None,
        prompt=_prompt(body[main]) if kind == "text" else None,
        stream=v.get("stream", False),
        # stream_options without a stream asks for nothing: accepted and ignored, as llama-server does
        include_usage=v.get("stream", False) and v.get("stream_options", False),
        max_tokens=next(iter(limits.values()), None),
        sampling=sampling,
        stop=v.get("stop", ()),
        ignore_eos=v.get("ignore_eos", False),
        cache_prompt=v.get("cache_prompt", True),
        return_progress=v.get("stream", False) and v.get("return_progress", False),
        draft_max=v.get("speculative.n_max"),
        draft_min=v.get("speculative.n_min", 0),
        response_format=fmt,
        format_field=format_rules.format_param(*formats[0]) if formats else None,
        chat_template_kwargs=v.get("chat_template_kwargs"),
        reasoning_format=v.get("reasoning_format"),
        **tools,
        logprobs=rules.logprobs_fields(body.get("logprobs"), body.get("top_logprobs"), legacy=kind == "text"),
    )


def _tools(body: dict[str, Any]) -> dict[str, Any]:
    """``tools`` (each parameters schema checked), ``tool_choice`` among them, ``parallel_tool_calls``."""
    from localinfer.request.toolcalls import spec

    offered = spec.tools("tools", body["tools"], spec.check_schema) if body.get("tools") is not None else ()
    choice = body.get("tool_choice")
    out: dict[str, Any] = {"tools": offered}
    if choice is not None:
        out["tool_choice"] = spec.tool_choice("tool_choice", choice, offered)
    if body.get("parallel_tool_calls") is not None:
        out["parallel_tool_calls"] = _bool("parallel_tool_calls", body["parallel_tool_calls"])
    return out


def _prompt(value: Any) -> str | tuple[int, ...]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    if isinstance(value, str):
        if not value:
            raise field_error("prompt", "'prompt' must not be empty")
        return rules.text("prompt", value)
    if isinstance(value, list) and value and all(_is_int(t) and t >= 0 for t in value):
        return tuple(value)
    raise field_error("prompt", "'prompt' must be a string, or a list of token ids (one prompt per request)", "invalid_type")
