"""OpenAI's Responses API (``POST /v1/responses``), stateless, as a translator: its request mapped to
the one request serve runs, the finished answer and its steps (``localinfer.generate.finish``) mapped back to
a response object and its stream of events (each with a ``sequence_number``).

Stateless as Codex uses it (``store: false``, the whole ``input`` each turn): ``previous_response_id``
is refused with a 400 that says so. What Codex sends and no local model can honour
(``include``, ``prompt_cache_key``, ``client_metadata``, hosted tools such as ``web_search``) is accepted
and ignored; without ``max_output_tokens`` serve's ``-n`` caps the answer, or else what the context leaves.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import TYPE_CHECKING, Any

from localinfer.request import format_rules, rules
from localinfer.request.sampling import SamplingOptions
from localinfer.serve.wires.openai import ApiError, Envelope, envelope, field_errors
from localinfer.serve.wires.writer import WriterDefaults

if TYPE_CHECKING:
    from localinfer.generate.finish import Step
    from localinfer.request.request import Request
    from localinfer.serve.scheduler.worker import Ended

_IGNORED = {"store", "metadata", "include", "prompt_cache_key", "client_metadata", "user", "safety_identifier",
            "service_tier", "truncation", "stream_options", "background", "prompt_cache_retention"}  # fmt: skip
_FIELDS = {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice",
           "parallel_tool_calls", "text", "reasoning", "stream", "previous_response_id", *_IGNORED}  # fmt: skip
_HOSTED = {"web_search", "web_search_preview", "namespace", "local_shell", "custom"}  # Codex's, ignored: not ours to run


def error_body(exc: ApiError) -> dict[str, Any]:
    return exc.body()  # OpenAI's shape, as Chat Completions'


def _bad(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, f"{param}: {message}", code=code, param=param)


@field_errors(_bad)
def parse(body: dict[str, Any]) -> Envelope:
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise _bad(unknown[0], f"unknown field '{unknown[0]}'", "unknown_parameter")
    if body.get("previous_response_id") is not None:
        raise _bad("previous_response_id", "this server is stateless and keeps no responses: send the whole conversation "
                                           "in 'input' (store: false)", "unsupported_parameter")  # fmt: skip
    if body.get("background"):
        raise _bad("background", "background responses are not supported by this server", "unsupported_parameter")
    if body.get("truncation") not in (None, "disabled"):
        raise _bad("truncation", "only 'disabled' is supported (a prompt that does not fit is a 400)", "unsupported_parameter")
    if "input" not in body:
        raise _bad("input", "'input' is required", "missing_parameter")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream", "must be true or false", "invalid_type")
    sampling = {k: rules.check(k, body[k]) for k in ("temperature", "top_p") if body.get(k) is not None}
    limit = body.get("max_output_tokens")
    return envelope(
        model=None if body.get("model") is None else rules.model_name("model", body["model"]),
        messages=rules.messages("input", _messages(body.get("instructions"), body["input"])), stream=stream,
        max_tokens=None if limit is None else rules.check("max_tokens", limit, name="max_output_tokens"),
        sampling=SamplingOptions(**sampling), chat_template_kwargs=_reasoning(body.get("reasoning")),
        **_tools(body), **_format(body.get("text")),
    )  # fmt: skip


def _content(where: str, content: Any) -> Any:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(where, f"must be a string or a list of content parts, not {rules.shown(content)}", "invalid_type")
    parts: list[Any] = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_image":  # an OpenAI image part, which rules.message reads
            from localinfer.serve.wires.images import url_part

            parts.append(url_part(f"{where}[{i}].image_url", part.get("image_url")))
            continue
        if kind not in ("input_text", "output_text", "text", "summary_text"):
            raise _bad(f"{where}[{i}]", f"{rules.shown(kind or part)} parts are not supported by this server (text only)")
        parts.append(rules.text(f"{where}[{i}].text", part.get("text")))
    if any(isinstance(p, dict) for p in parts):
        return [p if isinstance(p, dict) else {"type": "text", "text": p} for p in parts]
    return "".join(parts)


def _messages(instructions: Any, items: Any) -> list[dict[str, Any]]:
    """``input`` as OpenAI-style messages: message items, function calls (joined to the assistant turn
    they follow) and their outputs as ``tool`` turns; past reasoning items are dropped."""
    out: list[dict[str, Any]] = []
    if instructions is not None:
        out.append({"role": "system", "content": rules.text("instructions", instructions)})
    if isinstance(items, str):
        return [*out, {"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise _bad("input", "must be a string or a non-empty list of items", "invalid_type")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(where, "must be an object", "invalid_type")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise _bad(f"{where}.role", "must be user, system, developer or assistant")
            out.append({"role": role, "content": _content(f"{where}.content", item.get("content"))})
        elif kind == "function_call":
            args = item.get("arguments", "{}")  # one that holds no JSON object is {} (rules.messages)
            call = {"id": item.get("call_id"), "type": "function", "function": {"name": item.get("name"), "arguments": args}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output", "")
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": _content(f"{where}.output", output)})
        elif kind == "reasoning":
            continue
        else:
            raise _bad(f"{where}.type", f"{rules.shown(kind)} items are not supported by this server (stateless, text only)")
    return out


def _tools(body: dict[str, Any]) -> dict[str, Any]:
    from localinfer.request.toolcalls import spec

    given = body.get("tools")
    if given is not None and not isinstance(given, list):
        raise _bad("tools", "must be a list of tools", "invalid_type")
    fns, positions = [], []
    for i, t in enumerate(given or ()):
        kind = t.get("type") if isinstance(t, dict) else None
        if isinstance(kind, str) and kind in _HOSTED:  # a str first: [] is unhashable
            continue
        if kind != "function":
            raise _bad(f"tools[{i}].type", f"{rules.shown(kind)} tools are not supported by this server (function tools only)")
        fns.append({k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None})
        positions.append(i)
    offered = spec.tools("tools", fns, spec.check_schema, positions=positions) if fns else ()
    out: dict[str, Any] = {"tools": offered}
    choice = body.get("tool_choice")
    if choice is not None and (offered or choice != "auto"):  # Codex sends "auto" with hosted tools only
        if isinstance(choice, dict):
            if choice.get("type") != "function":
                raise _bad("tool_choice.type", f"{rules.shown(choice.get('type'))} is not supported (a function, or a string)")
            choice = {"type": "function", "function": {"name": choice.get("name")}}
        out["tool_choice"] = spec.tool_choice("tool_choice", choice, offered)
    if body.get("parallel_tool_calls") is not None:
        if not isinstance(body["parallel_tool_calls"], bool):
            raise _bad("parallel_tool_calls", "must be true or false", "invalid_type")
        out["parallel_tool_calls"] = body["parallel_tool_calls"]
    return out


def _format(text: Any) -> dict[str, Any]:
    """``text.format`` on the same constraint as Chat Completions' ``response_format``."""
    if text is None:
        return {}
    if not isinstance(text, dict):
        raise _bad("text", "must be an object", "invalid_type")
    fmt = text.get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return {}
    if not isinstance(fmt, dict):
        raise _bad("text.format", "must be an object", "invalid_type")
    if fmt.get("type") == "json_schema":  # flat here; nested under json_schema in Chat Completions
        inner = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        fmt = {"type": "json_schema", "json_schema": inner}
    return {"response_format": format_rules.response_format("text.format", fmt), "format_field": "text.format"}


def _reasoning(value: Any) -> dict[str, Any] | None:
    """``reasoning.effort`` as the template's ``reasoning_effort`` (gpt-oss's); ``summary`` ignored."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad("reasoning", "must be an object", "invalid_type")
    effort = value.get("effort")
    return None if effort is None else {"reasoning_effort": rules.text("reasoning.effort", effort)}


# -- the answer -------------------------------------------------------------------------------------
def _id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def _usage(outcome: Ended) -> dict[str, Any]:
    s = outcome.stats
    return {"input_tokens": s.prompt_tokens, "input_tokens_details": {"cached_tokens": s.cached_tokens},
            "output_tokens": s.completion_tokens, "output_tokens_details": {"reasoning_tokens": outcome.reasoning_tokens or 0},
            "total_tokens": s.prompt_tokens + s.completion_tokens}  # fmt: skip


def _message(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": [part] if status == "completed" else []}


def _reasoning_item(item_id: str, text: str | None) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [] if text is None else [{"type": "summary_text", "text": text}]}


def _call(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments, "status": status}


class ResponsesWriter(WriterDefaults):
    """One response: a whole object, or its stream of events, output items opened and closed as the
    steps change kind (reasoning, message, each function call), every event numbered."""

    def __init__(self, model: str, request: Request) -> None:
        self.model, self.request = model, request
        self.id, self.created = _id("resp_"), int(time.time())
        self._seq = 0
        self._items: list[dict[str, Any]] = []  # the output items opened so far (their final shape at ``done``)
        self._open: str | None = None  # the open item's kind: reasoning | message | call
        self._text = ""  # the open item's text (reasoning summary, message text, call arguments)
        self._template: tuple[bytes, bytes] | None = None

    def _response(self, status: str, output: list[dict[str, Any]], outcome: Ended | None = None) -> dict[str, Any]:
        r = self.request
        body: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created, "status": status, "model": self.model,
            "output": output, "error": None, "incomplete_details": None, "instructions": None,
            "max_output_tokens": r.max_tokens, "parallel_tool_calls": r.parallel_tool_calls,
            "temperature": r.sampling.temperature, "top_p": r.sampling.top_p, "previous_response_id": None,
            "tool_choice": "auto", "tools": [], "text": {"format": {"type": "text"}}, "truncation": "disabled",
            "store": False, "metadata": {}, "usage": None,
        }  # fmt: skip
        if outcome is not None:
            body["usage"] = _usage(outcome)
            if status == "incomplete":
                body["incomplete_details"] = {"reason": "max_output_tokens"}
            if outcome.tool_calls or outcome.text:
                body["output_text"] = outcome.text
        return body

    def _event(self, kind: str, **fields: Any) -> bytes:
        obj = {"type": kind, **fields, "sequence_number": self._seq}
        self._seq += 1
        return f"event: {kind}\ndata: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()

    # -- the stream -----------------------------------------------------------------------------------
    def head(self, mode: str) -> bytes:
        start = self._response("in_progress", [])
        out = self._event("response.created", response=start) + self._event("response.in_progress", response=start)
        return out + (self._begin("message") if mode == "text" else b"")

    def text_piece(self, encoded: bytes) -> bytes:
        """A text delta of the open message, its text already a JSON string (the fast path)."""
        if self._template is None:
            item = self._items[-1]["id"]
            head = ('event: response.output_text.delta\ndata: {"type":"response.output_text.delta","item_id":"%s",'
                    '"output_index":%d,"content_index":0,"delta":' % (item, len(self._items) - 1)).encode()  # fmt: skip
            self._template = head, b',"logprobs":[],"sequence_number":'
        head, mid = self._template
        seq = self._seq
        self._seq += 1
        return head + encoded + mid + str(seq).encode() + b"}\n\n"

    def steps(self, steps: list[Step]) -> bytes:
        from localinfer.generate.finish import CallStart, Text, Thought

        out = []
        for s in steps:
            if isinstance(s, CallStart):
                out.append(self._begin("call", s.id, s.name))
                continue
            kind = "reasoning" if isinstance(s, Thought) else "message" if isinstance(s, Text) else "call"
            if self._open != kind:
                out.append(self._begin(kind))
            self._text += s.text
            out.append(self._delta(s.text))
        return b"".join(out)

    def _begin(self, kind: str, call_id: str = "", name: str = "") -> bytes:
        out = self._end()
        index = len(self._items)
        if kind == "reasoning":
            item = _reasoning_item(_id("rs_"), None)
        elif kind == "message":
            item = _message(_id("msg_"), "", "in_progress")
        else:
            item = _call(_id("fc_"), call_id, name, "", "in_progress")
        self._items.append(item)
        self._open, self._text = kind, ""
        out += self._event("response.output_item.added", output_index=index, item=item)
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": []}
            out += self._event("response.content_part.added", item_id=item["id"], output_index=index, content_index=0, part=part)
        elif kind == "reasoning":
            out += self._event("response.reasoning_summary_part.added", item_id=item["id"], output_index=index,
                               summary_index=0, part={"type": "summary_text", "text": ""})  # fmt: skip
        return out

    def _delta(self, text: str) -> bytes:
        item, index = self._items[-1]["id"], len(self._items) - 1
        if self._open == "message":
            return self._event("response.output_text.delta", item_id=item, output_index=index, content_index=0, delta=text, logprobs=[])
        if self._open == "reasoning":
            return self._event("response.reasoning_summary_text.delta", item_id=item, output_index=index, summary_index=0, delta=text)
        return self._event("response.function_call_arguments.delta", item_id=item, output_index=index, delta=text)

    def _end(self, text: str | None = None) -> bytes:
        """Close the open item (``text``: its whole text, when the stream did not gather it)."""
        if self._open is None:
            return b""
        kind, self._open = self._open, None
        text = self._text if text is None else text
        index, old = len(self._items) - 1, self._items[-1]
        i = old["id"]
        if kind == "message":
            part = {"type": "output_text", "text": text, "annotations": []}
            out = self._event("response.output_text.done", item_id=i, output_index=index, content_index=0, text=text, logprobs=[])
            out += self._event("response.content_part.done", item_id=i, output_index=index, content_index=0, part=part)
            item = _message(i, text)
        elif kind == "reasoning":
            part = {"type": "summary_text", "text": text}
            out = self._event("response.reasoning_summary_text.done", item_id=i, output_index=index, summary_index=0, text=text)
            out += self._event("response.reasoning_summary_part.done", item_id=i, output_index=index, summary_index=0, part=part)
            item = _reasoning_item(i, text)
        else:
            out = self._event("response.function_call_arguments.done", item_id=i, output_index=index, name=old["name"], arguments=text)
            item = _call(i, old["call_id"], old["name"], text)
        self._items[-1] = item
        return out + self._event("response.output_item.done", output_index=index, item=item)

    def tail(self, outcome: Ended) -> bytes:
        out = self._end(outcome.text if self._template is not None else None)
        status = self._status(outcome)
        return out + self._event(f"response.{status}", response=self._response(status, self._items, outcome))

    def _status(self, outcome: Ended) -> str:
        """``incomplete`` only when the request's own ``max_output_tokens`` ended it (OpenAI's
        meaning). An answer a request without one got cut by the server (serve's -n, the context) is
        ``completed``, as llama-server sends: Codex reads ``incomplete`` as an error and fails its
        turn ("Incomplete response returned, reason: max_output_tokens", exit 1)."""
        return "incomplete" if outcome.finish_reason == "length" and self.request.max_tokens is not None else "completed"

    def stream_error(self, exc: ApiError) -> bytes:
        failed = self._response("failed", self._items)
        failed["error"] = {"code": exc.code or "server_error", "message": exc.message}
        return self._event("response.failed", response=failed)

    # -- whole ----------------------------------------------------------------------------------------
    def whole(self, outcome: Ended) -> dict[str, Any]:
        output: list[dict[str, Any]] = []
        if outcome.reasoning:
            output.append(_reasoning_item(_id("rs_"), outcome.reasoning))
        if outcome.text or not outcome.tool_calls:
            output.append(_message(_id("msg_"), outcome.text))
        output += [_call(_id("fc_"), c.id, c.name, c.arguments) for c in outcome.tool_calls]
        return self._response(self._status(outcome), output, outcome)
