"""Ollama's ``/api/chat`` and ``/api/generate`` on the wire: its request mapped to the one request
the OpenAI routes run (the core ``Request`` in serve's ``Envelope``), and the finished answer (and its steps, streaming)
mapped back to Ollama's NDJSON objects. Nothing here samples, parses tool calls or splits thinking:
the engine and ``localinfer.generate.finish`` did that; this module only renames.

``images`` (base64) become OpenAI image parts (localinfer.request.images). Fields Ollama knows and we cannot
honour (``suffix``, ``template``, ``context``) are a 400 naming them; ``options`` we do not use are ignored, as Ollama ignores the ones it does not know, and
so are top-level fields we do not know (Ollama's Go decoder drops them).
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localinfer.request import format_rules, rules
from localinfer.request.sampling import SamplingOptions
from localinfer.serve.wires.openai import ApiError, Envelope, envelope, field_errors
from localinfer.serve.wires.chat_completions import dumps
from localinfer.serve.wires.writer import WriterDefaults

if TYPE_CHECKING:
    from localinfer.serve.scheduler.worker import Ended

NDJSON_HEADERS = [(b"content-type", b"application/x-ndjson"), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
_PIECE = "\x00piece\x00"  # stands for the text in a chunk template
# options -> the core's sampling fields (rules.SAMPLING_FIELDS); num_predict and stop apart. The rest are
# ignored: the load-time ones (num_ctx, num_gpu, num_thread, use_mmap...) are the server's flags here
SAMPLING = {name: name for name in rules.SAMPLING_FIELDS}
THINK_LEVELS = ("low", "medium", "high")


def bad(field: str, message: str, code: str | None = None) -> ApiError:
    return ApiError(400, message, code=code, param=field)  # the code: not on Ollama's wire


@dataclass(frozen=True)
class OllamaRequest:
    """One chat or generate request: ``request`` is None when there is nothing to generate (Ollama's
    way of asking a model to load, or to unload with ``keep_alive: 0``), answered ``done_reason: load``."""

    request: Envelope | None
    think: bool | str | None = None


@field_errors(bad)
def parse_chat(body: dict[str, Any], model: str) -> OllamaRequest:
    messages = body.get("messages")
    if messages is None or messages == []:
        return OllamaRequest(None)
    common = _common(body)
    req = envelope(model=model, messages=chat_messages(messages), **common, **_tools(body))
    return OllamaRequest(req, _think(body))


@field_errors(bad)
def parse_generate(body: dict[str, Any], model: str, *, templated: bool) -> OllamaRequest:
    """``templated``: the model has a chat template (else the prompt is sent as it is, as ``raw``)."""
    for name, what in (("suffix", "fill in the middle"), ("template", "a template of the request's own"),
                       ("context", "a previous answer's context: send the conversation to /api/chat")):  # fmt: skip
        if body.get(name):
            raise bad(name, f"'{name}' ({what}) is not supported by this server")
    pictures = body.get("images")
    prompt = body.get("prompt")
    if prompt is None or prompt == "":
        return OllamaRequest(None)
    prompt = rules.text("prompt", prompt)
    system = rules.text("system", body["system"]) if body.get("system") is not None else None
    raw = _bool(body, "raw", False)
    common = _common(body)
    if pictures and (raw or not templated):
        raise rules.RuleError("images", "go through the chat template: not with raw, nor to a model without one")
    if pictures:
        from localinfer.serve.wires.images import base64_parts, with_images

        prompt = with_images(prompt, base64_parts("images", pictures))
    if raw or not templated:
        req = envelope(model=model, prompt=f"{system}\n\n{prompt}" if system and not raw else prompt, **common)
    else:
        turns = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        req = envelope(model=model, messages=rules.messages("prompt", turns), **common)
    return OllamaRequest(req, _think(body))


def _bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise rules.RuleError(name, f"must be true or false, not {rules.shown(value)}", "invalid_type")
    return value


def _common(body: dict[str, Any]) -> dict[str, Any]:
    """What chat and generate share: stream, options, format, think, logprobs."""
    options = body.get("options") or {}
    if not isinstance(options, dict):
        raise rules.RuleError("options", f"must be an object, not {rules.shown(options)}", "invalid_type")
    sampling = {}
    for name, field in SAMPLING.items():
        value = options.get(name)
        if value is None or (name == "seed" and value == -1):  # Ollama's -1: a random seed
            continue
        sampling[field] = rules.check(field, value, name=f"options.{name}")
    stop = rules.stop("options.stop", options["stop"]) if options.get("stop") is not None else ()
    think = _think(body)
    kwargs: dict[str, Any] | None = None
    if think is not None:  # the template's switch; a level is gpt-oss's reasoning effort
        kwargs = {"enable_thinking": bool(think)} | ({"reasoning_effort": think} if isinstance(think, str) else {})
    return {
        "stream": _bool(body, "stream", True),
        "max_tokens": _num_predict(options.get("num_predict")),
        "sampling": SamplingOptions(**sampling),
        "stop": stop,
        "response_format": _format(body.get("format")),
        "format_field": "format",
        "chat_template_kwargs": kwargs,
        "logprobs": rules.logprobs_fields(_bool(body, "logprobs", False), body.get("top_logprobs"), legacy=False),
    }


def _num_predict(value: Any) -> int | None:
    """Ollama's token limit: -1 (no limit) and -2 (fill the context) both run until the context is full."""
    if value is None or value in (-1, -2) and isinstance(value, int) and not isinstance(value, bool):
        return None
    return rules.check("max_tokens", value, name="options.num_predict")


def _format(value: Any) -> Any:
    """``"json"`` (any JSON object) or a JSON schema, on the same constraint as ``response_format``."""
    if value is None or value == "":
        return None
    if value == "json":
        return format_rules.response_format("format", {"type": "json_object"})
    if isinstance(value, dict):
        return format_rules.json_schema("format", value)
    raise rules.RuleError("format", f"must be \"json\" or a JSON schema (an object), not {rules.shown(value)}")


def _think(body: dict[str, Any]) -> bool | str | None:
    value = body.get("think")
    if value is None or isinstance(value, bool) or value in THINK_LEVELS:
        return value
    raise rules.RuleError("think", f"must be true, false or one of {', '.join(THINK_LEVELS)}, not {rules.shown(value)}")


def _tools(body: dict[str, Any]) -> dict[str, Any]:
    """``tools``, and ``tool_choice`` as OpenAI's (ours: Ollama has none, and ignores it)."""
    from localinfer.request.toolcalls import spec

    offered = spec.tools("tools", body["tools"], spec.check_schema) if body.get("tools") else ()
    if body.get("tool_choice") is None:
        return {"tools": offered} if offered else {}
    return {"tools": offered, "tool_choice": spec.tool_choice("tool_choice", body["tool_choice"], offered)}


def chat_messages(value: Any) -> tuple[dict[str, Any], ...]:
    """Ollama's messages as the core's (OpenAI's): a past answer's ``thinking`` as its
    ``reasoning_content``, ``tool_calls`` with object arguments and an id each, and a ``tool``
    message tied to the call it answers by ``tool_name`` (or, without one, the oldest unanswered)."""
    if not isinstance(value, list):
        raise rules.RuleError("messages", "must be a list of messages", "invalid_type")
    out, unanswered = [], []  # (id, name) of calls not answered yet
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise rules.RuleError(where, "must be an object with 'role' and 'content'", "invalid_type")
        role = m.get("role")
        turn: dict[str, Any] = {"role": role, "content": "" if m.get("content") is None else m["content"]}
        if m.get("images"):  # OpenAI image parts, which rules.message reads
            from localinfer.serve.wires.images import base64_parts, with_images

            turn["content"] = with_images(turn["content"], base64_parts(f"{where}.images", m["images"]))
        if role == "assistant" and m.get("thinking"):
            turn["reasoning_content"] = m["thinking"]
        if role == "assistant" and m.get("tool_calls"):
            turn["tool_calls"] = _calls(where, m["tool_calls"])
            unanswered += [(c["id"], c["function"].get("name")) for c in turn["tool_calls"]]
        if role == "tool":
            name = m.get("tool_name") or m.get("name")
            match = next((c for c in unanswered if c[1] == name), unanswered[0] if unanswered else None)
            cid = m.get("tool_call_id") or (match[0] if match else None)
            if cid is None:
                raise rules.RuleError(where, "is a tool result, but no earlier assistant message made a call it answers")
            unanswered = [c for c in unanswered if c[0] != cid]
            turn.update(tool_call_id=cid, **({"name": name} if name else {}))
        out.append(turn)
    return rules.messages("messages", out)


def _calls(where: str, calls: Any) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise rules.RuleError(f"{where}.tool_calls", "must be a list of tool calls", "invalid_type")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            raise rules.RuleError(f"{where}.tool_calls[{j}]", 'must be {"function": {"name", "arguments"}}', "invalid_type")
        cid = call.get("id") or f"call_{where[9:-1]}_{j}"  # Ollama's calls may come without one
        out.append({"id": cid, "type": "function", "function": {"name": fn.get("name"), "arguments": fn.get("arguments") or {}}})
    return out


# -- the answer --------------------------------------------------------------------------------------------
def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat().replace("+00:00", "Z")


def ns(seconds: float | None) -> int:
    """Ollama's durations: whole nanoseconds."""
    return 0 if seconds is None else int(round(seconds * 1e9))


def line(obj: Any) -> bytes:
    """One NDJSON line."""
    return (dumps(obj) + "\n").encode()


def done_reason(outcome: Ended) -> str | None:
    """Ollama's ``done_reason``: ``stop`` for an answer that ended with calls (Ollama has no ``tool_calls``)."""
    return "stop" if outcome.finish_reason == "tool_calls" else outcome.finish_reason


def counters(outcome: Ended, load_s: float = 0.0) -> dict[str, Any]:
    """Ollama's counters, from the figures /metrics and usage report (``localinfer.engine.types``):
    the whole request with the time it waited for its model (``load_s``: the load it started or
    waited for, near 0 for a loaded model, as Ollama's), the prompt (all its tokens, cached ones included:
    Ollama's runner counts them before it loads its cache; its duration: evaluating the ones not cached),
    and the answer's tokens over the time from the first to the last."""
    s = outcome.stats
    return {"total_duration": ns(outcome.total_s + load_s), "load_duration": ns(load_s), "prompt_eval_count": s.prompt_tokens,
            "prompt_eval_duration": ns(s.prefill_s), "eval_count": s.completion_tokens, "eval_duration": ns(s.decode_s)}  # fmt: skip


def tool_calls(calls: Any) -> list[dict[str, Any]]:
    """Ollama's calls: ``arguments`` an object (a call whose JSON was cut short is left out)."""
    out = []
    for i, c in enumerate(calls):
        try:
            args = json.loads(c.arguments) if c.arguments.strip() else {}
        except ValueError:
            continue
        if isinstance(args, dict):
            out.append({"id": c.id, "function": {"index": i, "name": c.name, "arguments": args}})
    return out


class OllamaAnswer(WriterDefaults):
    """One answer's objects: ``chat`` puts text in ``message.content``, ``generate`` in ``response``."""

    stream_headers = NDJSON_HEADERS
    keepalive = None  # NDJSON has no comment: every line is an object (Ollama's clients parse each)

    def __init__(self, kind: str, model: str, load_s: float = 0.0) -> None:
        self.kind, self.model, self.load_s = kind, model, load_s
        self.first = {"model": model, "created_at": now()}  # every object's first keys
        self._spliced: tuple[bytes, bytes] | None = None

    def _obj(self, text: str, done: bool, thinking: str | None = None, calls: list | None = None) -> dict[str, Any]:
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            return {**self.first, "message": message, "done": done}
        return {**self.first, "response": text, **({"thinking": thinking} if thinking else {}), "done": done}

    def chunk(self, text: str, *, thinking: str | None = None, logprobs: list | None = None) -> bytes:
        obj = self._obj(text, False, thinking)
        return line({**obj, "logprobs": logprobs} if logprobs is not None else obj)

    def text_piece(self, encoded: bytes) -> bytes:
        """A text object for a piece already a JSON string (the fast path: the object is made once)."""
        if self._spliced is None:
            raw = self.chunk(_PIECE).decode()
            before, after = raw.split(json.dumps(_PIECE, ensure_ascii=False), 1)
            self._spliced = before.encode(), after.encode()
        return self._spliced[0] + encoded + self._spliced[1]

    def logprobs_piece(self, text: str, entries: list[dict[str, Any]], offset: int) -> bytes:
        """A piece with its tokens' log probabilities (Ollama's entries are OpenAI's content entries)."""
        return self.chunk(text, logprobs=entries) if text or entries else b""

    def head(self, mode: str) -> bytes:
        """What a stream opens with: nothing (Ollama's first object carries text)."""
        return b""

    def steps(self, steps: list) -> bytes:
        """``localinfer.generate.finish``'s steps: text and thinking as they come; tool calls are sent whole,
        with the last chunks (Ollama's calls carry their arguments as an object)."""
        from localinfer.generate.finish import Text, Thought

        out = []
        for step in steps:
            if isinstance(step, Text) and step.text:
                out.append(self.chunk(step.text))
            elif isinstance(step, Thought) and step.text:
                out.append(self.chunk("", thinking=step.text))
        return b"".join(out)

    def tail(self, outcome: Ended) -> bytes:
        """The calls (whole), then the last object: ``done``, why, and the counters."""
        calls = tool_calls(outcome.tool_calls)
        out = line(self._obj("", False, calls=calls)) if calls and self.kind == "chat" else b""
        return out + line({**self._obj("", True), "done_reason": done_reason(outcome), **counters(outcome, self.load_s)})

    def whole(self, outcome: Ended) -> dict[str, Any]:
        obj = self._obj(outcome.text, True, outcome.reasoning, tool_calls(outcome.tool_calls))
        if outcome.logprobs is not None:
            obj["logprobs"] = outcome.logprobs
        return {**obj, "done_reason": done_reason(outcome), **counters(outcome, self.load_s)}

    def loaded(self, reason: str = "load") -> dict[str, Any]:
        """The answer to a request with nothing to generate (the model is loaded: it always is here)."""
        return {**self._obj("", True), "done_reason": reason}

    @staticmethod
    def stream_error(exc: ApiError) -> bytes:
        """An error after the answer began: Ollama's clients raise it from the stream."""
        return line(error_body(exc))


def error_body(exc: ApiError) -> dict[str, Any]:
    """Ollama's error shape: one message, the HTTP status saying what kind."""
    return {"error": exc.message}
