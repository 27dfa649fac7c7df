"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``), as a translator:
its request mapped to the one request serve runs, the finished answer and its steps
(``localinfer.generate.finish``) mapped back to its message, its stream events and its error shape.

What Claude Code sends and no local model can honour (``cache_control``, ``context_management``,
``output_config.effort``, ``metadata``, adaptive thinking) is accepted and ignored; ``max_tokens`` is
clamped to what the context leaves (the route asks the engine to), never refused.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from typing import TYPE_CHECKING, Any

from localinfer.request import format_rules, rules
from localinfer.request.sampling import SamplingOptions
from localinfer.serve.wires.openai import ApiError, Envelope, envelope, field_errors
from localinfer.serve.wires.writer import WriterDefaults

if TYPE_CHECKING:
    from localinfer.generate.finish import Step
    from localinfer.serve.scheduler.worker import Ended

# Accepted and ignored: caching hints, agents' context editing, effort, routing and tracing fields
_IGNORED = {"metadata", "service_tier", "context_management", "cache_control", "container", "mcp_servers", "anthropic_version",
            "diagnostics", "inference_geo", "speed", "user_profile_id", "workspace_id"}  # the SDK's newer routing fields
_FIELDS = {"model", "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p", "top_k", "stream",
           "tools", "tool_choice", "thinking", "output_config", "output_format", *_IGNORED}  # fmt: skip
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}  # fmt: skip
_TEXT_DELTA = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":'
_STOP = {"length": "max_tokens", "tool_calls": "tool_use"}  # the answer's finish reason -> stop_reason
# Claude Code's first system block: its version and a per-request hash (cch=), no instruction to the
# model; in the prompt it would change the prompt's start on every request (no prefix ever reused)
_BILLING = re.compile(r"\s*x-anthropic-billing-header:[^\n]*\s*")
KEEP_BILLING_ENV = "LOCALINFER_KEEP_BILLING_HEADER"  # 1: keep that block in the prompt (docs/serve-anthropic.md)


def error_body(exc: ApiError) -> dict[str, Any]:
    """Anthropic's error shape; the field at fault is named in the message."""
    where = f" ({exc.param})" if exc.param and exc.param not in exc.message else ""
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(exc.status, "api_error"), "message": exc.message + where}}


def _bad(param: str, message: str, code: str | None = None) -> ApiError:
    return ApiError(400, f"{param}: {message}", code=code, param=param)  # the code: not on Anthropic's wire


@field_errors(_bad)
def parse(body: dict[str, Any], *, counting: bool = False) -> Envelope:
    """A Messages request as serve's request (``counting``: count_tokens's, without ``max_tokens``)."""
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise _bad(unknown[0], f"unknown field '{unknown[0]}'")
    if "messages" not in body:
        raise _bad("messages", "'messages' is required")
    if not counting and body.get("max_tokens") is None:
        raise _bad("max_tokens", "'max_tokens' is required")
    max_tokens = None if body.get("max_tokens") is None else rules.check("max_tokens", body["max_tokens"])
    sampling = {k: rules.check(k, body[k]) for k in ("temperature", "top_p", "top_k") if body.get(k) is not None}
    tools, choice, parallel = _tools(body)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream", "must be true or false")
    return envelope(
        model=None if body.get("model") is None else rules.model_name("model", body["model"]),
        messages=rules.messages("messages", _messages(body.get("system"), body["messages"])),
        stream=stream, max_tokens=max_tokens, sampling=SamplingOptions(**sampling),
        stop=rules.stop("stop_sequences", body["stop_sequences"]) if body.get("stop_sequences") is not None else (),
        chat_template_kwargs=_thinking(body.get("thinking")), tools=tools, tool_choice=choice, parallel_tool_calls=parallel,
        **_format(body.get("output_config"), body.get("output_format")),
    )  # fmt: skip


def _text_of(where: str, content: Any) -> str:
    """A string, or text blocks joined (other keys of a block, ``cache_control``, ignored)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(where, f"must be a string or a list of blocks, not {rules.shown(content)}")
    parts = []
    for i, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text":
            raise _bad(f"{where}[{i}]", f"must be a text block here, not {rules.shown(kind or block)}")
        parts.append(rules.text(f"{where}[{i}].text", block.get("text")))
    return "".join(parts)


def _system(system: Any) -> list[str]:
    """The system prompt's text (none, or one), without Claude Code's billing-header block."""
    if system is None:
        return []
    if isinstance(system, list) and os.environ.get(KEEP_BILLING_ENV) != "1":
        system = [b for b in system if not (isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
                                            and _BILLING.fullmatch(b["text"]))]  # fmt: skip
        if not system:
            return []
    return [_text_of("system", system)]


def _messages(system: Any, messages: Any) -> list[dict[str, Any]]:
    """Anthropic's turns as OpenAI-style messages (which ``rules.messages`` checks): the system prompt
    first, with the system-role turns sent before any other; a system-role turn among the others stays
    where it was sent (Claude Code sends one after the first question, agents add more as a session
    goes on: moved to the top, every turn after the top would change, and no prefix be reused; the
    template's render places it where the template cannot take it: engine.templates); tool_use
    blocks as ``tool_calls``, tool_result blocks as ``tool`` turns; past thinking is dropped
    (templates drop it too)."""
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "must be a non-empty list of messages")
    systems = _system(system)
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise _bad(f"{where}.role", "must be 'user' or 'assistant'")
        if m["role"] == "system":
            text = _text_of(f"{where}.content", m.get("content"))
            if out:
                out.append({"role": "system", "content": text})
            else:
                systems.append(text)
            continue
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise _bad(f"{where}.content", f"must be a string or a list of blocks, not {rules.shown(content)}")
        out += _blocks(where, m["role"], content)
    if systems:
        out.insert(0, {"role": "system", "content": "\n\n".join(systems)})
    return out


def _blocks(where: str, role: str, blocks: list[Any]) -> list[dict[str, Any]]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        w = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(rules.text(f"{w}.text", block.get("text")))
        elif kind == "image" and role == "user":  # an OpenAI image part, which rules.message reads
            from localinfer.serve.wires.images import anthropic_part

            texts.append(anthropic_part(w, block))
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue
        elif kind == "tool_use" and role == "assistant":
            args = block.get("input", {})
            if not isinstance(args, dict):
                raise _bad(f"{w}.input", "must be an object")
            args = {} if set(args) == {"_partial"} else args  # a call our cap cut short (_input), as on every wire
            calls.append({"id": block.get("id"), "type": "function", "function": {"name": block.get("name"), "arguments": args}})
        elif kind == "tool_result" and role == "user":
            content = block.get("content", "")
            text = _text_of(f"{w}.content", content) if content is not None else ""
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text})
        elif kind in ("image", "document"):
            raise ApiError(400, f"{w}: {kind} blocks are not supported by this server here (images in user turns only)", param=w)
        else:
            raise _bad(w, f"a {role} turn cannot hold a block of type {rules.shown(kind)}")
    out: list[dict[str, Any]] = list(results)  # a user turn's results answer the calls just made
    if texts or calls or not results:
        pictured = any(isinstance(t, dict) for t in texts)
        content = [t if isinstance(t, dict) else {"type": "text", "text": t} for t in texts] if pictured else "".join(texts)
        message: dict[str, Any] = {"role": role, "content": content}
        if calls:
            message["tool_calls"] = calls
        out.append(message)
    return out


def _tools(body: dict[str, Any]) -> tuple[tuple, Any, bool]:
    from localinfer.request.toolcalls import spec

    given = body.get("tools")
    if given is not None and not isinstance(given, list):
        raise _bad("tools", "must be a list of tools")
    fns = []
    for i, t in enumerate(given or ()):
        if not isinstance(t, dict) or t.get("type") not in (None, "custom"):
            raise _bad(f"tools[{i}].type", f"{rules.shown(t.get('type') if isinstance(t, dict) else t)} is not supported "
                                           "(server tools are Anthropic's own): give name, description, input_schema")  # fmt: skip
        fns.append({k: v for k, v in (("name", t.get("name")), ("description", t.get("description")),
                                      ("input_schema", t.get("input_schema"))) if v is not None})  # fmt: skip
    offered = spec.tools("tools", fns, spec.check_schema, schema_key="input_schema") if fns else ()
    choice = body.get("tool_choice")
    if choice is None:
        return offered, None, True
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise _bad("tool_choice", 'must be {"type": "auto" | "any" | "tool" | "none"}')
    kind = choice["type"]
    openai = {"auto": "auto", "any": "required", "none": "none"}.get(kind) or {"type": "function", "function": {"name": choice.get("name")}}
    return offered, spec.tool_choice("tool_choice", openai, offered), not choice.get("disable_parallel_tool_use", False)


def _thinking(value: Any) -> dict[str, Any] | None:
    """``thinking``: enabled / disabled set the template's switch; adaptive leaves the template's default."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") not in ("enabled", "disabled", "adaptive"):
        raise _bad("thinking", 'must be {"type": "enabled" | "disabled" | "adaptive"}')
    return None if value["type"] == "adaptive" else {"enable_thinking": value["type"] == "enabled"}


def _format(config: Any, legacy: Any) -> dict[str, Any]:
    """``output_config.format`` (or the older ``output_format``), a JSON schema, on the same constraint
    as response_format; ``output_config.effort`` ignored."""
    fmt, where = (config.get("format"), "output_config.format") if isinstance(config, dict) else (None, "")
    if fmt is None:
        fmt, where = legacy, "output_format"
    if fmt is None:
        return {}
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise _bad(where, 'must be {"type": "json_schema", "schema": {...}}')
    return {"response_format": format_rules.json_schema(f"{where}.schema", fmt.get("schema")), "format_field": where}


# -- the answer -------------------------------------------------------------------------------------
def _event(name: str, obj: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


def _stop(outcome: Ended, stops: tuple[str, ...]) -> tuple[str, str | None]:
    """stop_reason and stop_sequence: one of the request's ``stop_sequences`` (not a template's own
    end marker, which is also a stop string to the engine) is ``stop_sequence``."""
    matched = outcome.stats.stop_string
    if outcome.finish_reason == "stop" and matched is not None and matched in stops:
        return "stop_sequence", matched
    return _STOP.get(outcome.finish_reason or "", "end_turn"), None


def _usage(prompt: int, cached: int, output: int) -> dict[str, Any]:
    """Anthropic's convention (and llama-server's): ``input_tokens`` is the part of the prompt not read
    from the cache, their sum the prompt (Claude Code adds them up to know how full its window is)."""
    return {"input_tokens": prompt - cached, "cache_read_input_tokens": cached, "output_tokens": output}


def _outcome_usage(outcome: Ended) -> dict[str, Any]:
    s = outcome.stats
    return _usage(s.prompt_tokens, s.cached_tokens, s.completion_tokens)


def _input(arguments: str) -> Any:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:  # cut short by max_tokens: what was written, as a string
        return {"_partial": arguments}
    return value if isinstance(value, dict) else {"value": value}


class AnthropicWriter(WriterDefaults):
    """One answer in Anthropic's shapes: a whole message, or its stream of events (content blocks
    opened and closed as the steps change kind: thinking, text, each tool call)."""

    keepalive = b'event: ping\ndata: {"type":"ping"}\n\n'  # sent while the prompt is read (app's AnswerResponse)

    def __init__(self, model: str, input_tokens: int, stops: tuple[str, ...] = ()) -> None:
        self.model, self.input_tokens, self.stops = model, input_tokens, stops  # stops: the request's stop_sequences
        self.id = "msg_" + secrets.token_hex(12)
        self._block = -1  # the open block's index
        self._open: str | None = None  # its kind: thinking | text | tool (None: none open)
        self.cached = 0  # the prompt's tokens read from the cache, once the request has its sequence

    def admitted(self, cached: int) -> None:
        """The request has its sequence: ``cached`` of its prompt's tokens are reused (before ``head``)."""
        self.cached = cached

    def head(self, mode: str) -> bytes:
        message = {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                   "stop_reason": None, "stop_sequence": None, "usage": _usage(self.input_tokens, self.cached, 0)}  # fmt: skip
        out = _event("message_start", {"type": "message_start", "message": message}) + self.keepalive
        return out + (self._start("text", {"type": "text", "text": ""}) if mode == "text" else b"")

    def text_piece(self, encoded: bytes) -> bytes:
        """A text delta of block 0 for a piece already a JSON string (the fast path)."""
        return _TEXT_DELTA + encoded + b"}}\n\n"

    def steps(self, steps: list[Step]) -> bytes:
        from localinfer.generate.finish import CallStart, Text, Thought

        out = []
        for s in steps:
            if isinstance(s, Thought):
                if self._open != "thinking":
                    out.append(self._start("thinking", {"type": "thinking", "thinking": "", "signature": ""}))
                out.append(self._delta({"type": "thinking_delta", "thinking": s.text}))
            elif isinstance(s, Text):
                if self._open != "text":
                    out.append(self._start("text", {"type": "text", "text": ""}))
                out.append(self._delta({"type": "text_delta", "text": s.text}))
            elif isinstance(s, CallStart):
                out.append(self._start("tool", {"type": "tool_use", "id": s.id, "name": s.name, "input": {}}))
            else:
                out.append(self._delta({"type": "input_json_delta", "partial_json": s.text}))
        return b"".join(out)

    def _start(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._stop_block()
        self._block, self._open = self._block + 1, kind
        return out + _event("content_block_start", {"type": "content_block_start", "index": self._block, "content_block": block})

    def _stop_block(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return _event("content_block_stop", {"type": "content_block_stop", "index": self._block})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event("content_block_delta", {"type": "content_block_delta", "index": self._block, "delta": delta})

    def tail(self, outcome: Ended) -> bytes:
        reason, sequence = _stop(outcome, self.stops)
        # the whole usage, as Anthropic's own message_delta (the SDKs take its input and cache counts)
        delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                 "usage": _outcome_usage(outcome)}  # fmt: skip
        return self._stop_block() + _event("message_delta", delta) + _event("message_stop", {"type": "message_stop"})

    def stream_error(self, exc: ApiError) -> bytes:
        return _event("error", error_body(exc))

    def whole(self, outcome: Ended) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if outcome.reasoning:
            content.append({"type": "thinking", "thinking": outcome.reasoning, "signature": ""})
        if outcome.text or not outcome.tool_calls:
            content.append({"type": "text", "text": outcome.text})
        content += [{"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c.arguments)} for c in outcome.tool_calls]
        reason, sequence = _stop(outcome, self.stops)
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": reason, "stop_sequence": sequence, "usage": _outcome_usage(outcome)}  # fmt: skip
