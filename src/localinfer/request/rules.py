"""The rule table for every request field: its type, its bounds and the message that refuses it.

`run`'s options, chat's `/set`, batch lines and serve's protocol all check values here, so one
value gets one verdict and one message wherever it is given (docs/requests.md). Plain
Python only: the CLI imports it for `--help`. The structured-output fields (response_format,
json_schema, grammar) are ``localinfer.request.format_rules``'s.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

INT32_MAX = 2**31 - 1  # llama.cpp takes top_k and the penalty window as int32_t
SEED_MAX = 2**32 - 2  # uint32_t; 2**32 - 1 is LLAMA_DEFAULT_SEED, which llama.cpp reads as "random"
MAX_STOPS = 16
MAX_MESSAGES = 4096
MAX_MODEL_NAME = 512  # no name the store takes is longer (store.names.MAX_SPEC): refused before any lookup


class RuleError(ValueError):
    """A value a field does not take. ``str()`` is the whole message (``'top_p' must be ...``);
    ``problem`` is the part after the name, for front ends that name the field their own way."""

    def __init__(self, field: str, problem: str, code: str = "invalid_value") -> None:
        super().__init__(f"'{field}' {problem}")
        self.field, self.problem, self.code = field, problem, code


@dataclass(frozen=True)
class Rule:
    """A number (``kind`` float) or an integer (``kind`` int) in ``[lo, hi]``; ``unset``: the words
    that, typed as text, mean "no value" (the default: a random seed, no token limit)."""

    kind: type
    lo: float
    hi: float | None = None
    unset: tuple[str, ...] = ()

    def what(self) -> str:
        noun = "an integer" if self.kind is int else "a number"
        lo, hi = self._bounds()
        bounds = f">= {lo}" if self.hi is None else f"between {lo} and {hi}"
        return f"{noun} {bounds}"

    def metavar(self) -> str:
        """How `--help` shows the option's value: ``FLOAT 0..2``, ``INTEGER >=1``."""
        lo, hi = self._bounds()
        return ("INTEGER " if self.kind is int else "FLOAT ") + (f">={lo}" if self.hi is None else f"{lo}..{hi}")

    def _bounds(self) -> tuple[str, str]:
        lo, hi = (f"{b:g}" if isinstance(b, float) else str(b) for b in (self.lo, self.hi))
        return lo, hi

    def check(self, field: str, value: Any) -> Any:
        """``value`` (a JSON value) as the field's type; RuleError otherwise."""
        numeric = isinstance(value, int) if self.kind is int else isinstance(value, (int, float))
        if isinstance(value, bool) or not numeric:
            raise RuleError(field, f"must be {self.what()}, not {shown(value)}", "invalid_type")
        if value != value or value < self.lo or (self.hi is not None and value > self.hi):  # NaN fails
            raise RuleError(field, f"must be {self.what()}, not {shown(value)}")
        try:
            return self.kind(value)
        except OverflowError:  # an integer past float's range, for a field without an upper bound
            raise RuleError(field, f"must be {self.what()}, not {shown(value)}") from None

    def parse(self, field: str, text: str) -> Any:
        """Typed text (an option, `/set`): the same value JSON would give, then ``check``."""
        if text.strip().lower() in self.unset:
            return None
        return self.check(field, from_text(text))


RULES: dict[str, Rule] = {
    "temperature": Rule(float, 0.0, 2.0),
    "top_p": Rule(float, 0.0, 1.0),
    "top_k": Rule(int, 0, INT32_MAX),
    "min_p": Rule(float, 0.0, 1.0),
    "repeat_penalty": Rule(float, 0.0),
    "repeat_last_n": Rule(int, -1, INT32_MAX),
    "presence_penalty": Rule(float, -2.0, 2.0),
    "frequency_penalty": Rule(float, -2.0, 2.0),
    "seed": Rule(int, 0, SEED_MAX, unset=("random", "none")),
    "max_tokens": Rule(int, 1, unset=("none", "unlimited")),
    "top_logprobs": Rule(int, 0, 20),  # OpenAI's bound; llama.cpp's too (the server's top_logprobs)
}
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "repeat_last_n",
                   "presence_penalty", "frequency_penalty", "seed")  # fmt: skip


def check(field: str, value: Any, *, name: str | None = None) -> Any:
    """``value`` checked by ``field``'s rule; ``name``: how the message names it (``max_completion_tokens``)."""
    return RULES[field].check(name or field, value)


def top_logprobs(value: Any, *, name: str = "top_logprobs") -> int | None:
    """How many alternatives to report with each token's log probability (None: no logprobs),
    wherever it is asked (``--logprobs``, a batch line, serve, ``build(logprobs=)``)."""
    return None if value is None else RULES["top_logprobs"].check(name, value)


def logprobs_fields(logprobs: Any, top: Any, *, legacy: bool) -> int | None:
    """OpenAI's pair of fields as one value: chat's ``logprobs: true`` with ``top_logprobs: N``
    (0 when absent), or, with ``legacy`` (completions, batch lines), ``logprobs: N`` alone too."""
    if not logprobs and (isinstance(logprobs, bool) or logprobs is None):
        if top is not None and top_logprobs(top):  # top_logprobs: 0 alone asks for nothing
            raise RuleError("top_logprobs", "needs 'logprobs': true")
        return None
    if logprobs is True:
        return top_logprobs(0 if top is None else top)
    if not legacy:
        raise RuleError("logprobs", f"must be true or false, not {shown(logprobs)}", "invalid_type")
    if top is not None:
        raise RuleError("top_logprobs", "goes with 'logprobs': true, not with a number of 'logprobs'")
    return top_logprobs(logprobs, name="logprobs")


def parse_text(field: str, text: str) -> Any:
    return RULES[field].parse(field, text)


def option(field: str, error: Callable[[str], Exception]) -> dict[str, Any]:
    """What a Typer option declaration takes from the table: ``typer.Option(..., **rules.option(
    "top_p", typer.BadParameter))`` - its parser and its metavar."""
    return {"parser": option_parser(field, error), "metavar": RULES[field].metavar()}


def option_parser(field: str, error: Callable[[str], Exception]) -> Callable[[str], Any]:
    """A command-line option's parser (Typer's ``parser=``): ``error`` makes the CLI's exception
    (``typer.BadParameter``) from the problem, which the CLI prefixes with the option's name."""

    def parse(text: Any) -> Any:
        if not isinstance(text, str):  # a default, already a value
            return text
        try:
            return parse_text(field, text)
        except RuleError as exc:
            raise error(exc.problem) from None

    parse.__name__ = field
    return parse


_INT_TEXT = re.compile(r"[+-]?[0-9]+")


def from_text(text: str) -> Any:
    """What a typed value means as a JSON value would: ``3`` an integer, ``1.5``/``nan``/``inf`` a
    number, ``true`` a boolean, anything else the string itself."""
    t = text.strip()
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    if _INT_TEXT.fullmatch(t):
        try:
            return int(t)
        except ValueError:  # more digits than Python converts: refused by size, never converted
            return HugeInt(len(t.lstrip("+-")))
    if "_" not in t:  # Python's float() takes 1_0; JSON and llama.cpp do not
        try:
            return float(t)
        except ValueError:
            pass
    return text


@dataclass(frozen=True)
class HugeInt:
    """An integer too long to convert (``sys.get_int_max_str_digits()``): refused, shown by its size."""

    digits: int


def shown(value: Any) -> str:
    """A value as a message quotes it: the same for the JSON ``3`` and the typed ``3``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, HugeInt):
        return f"a {value.digits}-digit integer"
    if isinstance(value, int):
        digits = len(str(abs(value))) if abs(value) < 10**100 else _digits(value)
        return str(value) if digits <= 20 else f"a {digits}-digit integer"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "infinity" if value > 0 else "-infinity"
        return repr(value)
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:40] + "…")
    return {list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _digits(value: int) -> int:
    n = int(abs(value).bit_length() * 0.30103)  # log10(2): within one of the true count
    return n + (abs(value) >= 10**n)


# -- text, stop strings and messages -------------------------------------------------------------------
_SURROGATE = re.compile("[\ud800-\udfff]")


def text(field: str, value: Any) -> str:
    """A string that is text: a lone surrogate (``"\\ud800"`` in JSON) encodes to nothing."""
    if not isinstance(value, str):
        raise RuleError(field, f"must be a string, not {_kind(value)}", "invalid_type")
    bad = _SURROGATE.search(value)
    if bad:
        raise RuleError(field, f"holds a lone surrogate (\\u{ord(bad.group()):04x}), which is not text")
    return value


def model_name(field: str, value: Any) -> str:
    """A request's model name, bounded before it is looked up (a close-name search is quadratic in
    its length) or echoed in an error (the message never quotes it)."""
    name = text(field, value)
    if len(name) > MAX_MODEL_NAME:
        raise RuleError(field, f"is {len(name)} characters long: a model's name has at most {MAX_MODEL_NAME}")
    return name


def stop(field: str, value: Any) -> tuple[str, ...]:
    """A string or a list of at most MAX_STOPS strings; empty ones stop nothing and are dropped."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise RuleError(field, "must be a string or a list of strings", "invalid_type")
    if len(items) > MAX_STOPS:
        raise RuleError(field, f"takes at most {MAX_STOPS} strings")
    return tuple(text(field, s) for s in items if s)


ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
_MESSAGE_KEYS = ("role", "content", "name")
_TOOL_KEYS = {"assistant": ("tool_calls",), "tool": ("tool_call_id",)}  # what a conversation with tools adds


def message(where: str, m: Any) -> dict[str, Any]:
    """One OpenAI-style message as ``{"role", "content"[, "name"]}``: a role of ROLES (developer
    is OpenAI's new name for system), content a string or a list of text parts (null for an
    assistant, who may say nothing). An assistant's ``tool_calls`` and a tool message's
    ``tool_call_id`` are kept (``toolcalls.spec``). Other keys with a value are refused: we cannot
    honour them."""
    if not isinstance(m, dict):
        raise RuleError(where, "must be an object with 'role' and 'content'", "invalid_type")
    thought = m.get("reasoning_content") if m.get("role") == "assistant" else None  # a past answer's thinking
    allowed = _MESSAGE_KEYS + _TOOL_KEYS.get(m.get("role"), ()) if isinstance(m.get("role"), str) else _MESSAGE_KEYS
    extra = sorted(k for k, v in m.items() if k not in allowed and v is not None and not (k == "reasoning_content" and thought is not None))
    if extra:
        raise RuleError(where, f"has '{extra[0]}', which is not supported (text messages only)", "unsupported_parameter")
    role = m.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise RuleError(f"{where}.role", f"must be one of {', '.join(ROLES)}, not {shown(role)}")
    content = m.get("content")
    if "content" not in m and role != "assistant":
        raise RuleError(where, "must be an object with 'role' and 'content'", "invalid_type")
    pictures: tuple[Any, ...] = ()
    if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") in ("image_url", "image") for p in content):
        from localinfer.request.images import content_parts  # images in

        content, pictures = content_parts(f"{where}.content", content, text, RuleError)
    elif isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or set(part) - {"type", "text"}:
                raise RuleError(f"{where}.content[{j}]", "must be a text part, {\"type\": \"text\", \"text\": ...} (text only)")
            parts.append(text(f"{where}.content[{j}].text", part.get("text")))
        content = "".join(parts)
    elif content is None and role == "assistant":
        content = ""
    elif not isinstance(content, str):
        raise RuleError(f"{where}.content", f"must be a string or a list of text parts, not {_kind(content)}", "invalid_type")
    out: dict[str, Any] = {"role": ROLES[role], "content": text(f"{where}.content", content)}
    if m.get("name") is not None:
        out["name"] = text(f"{where}.name", m["name"])
    if role == "tool":
        out["tool_call_id"] = text(f"{where}.tool_call_id", m.get("tool_call_id"))
    if m.get("tool_calls") is not None:
        out["tool_calls"] = _assistant_calls(f"{where}.tool_calls", m["tool_calls"])
    if thought is not None:  # the template renders it, or not (most drop past thinking)
        out["reasoning_content"] = text(f"{where}.reasoning_content", thought)
    if pictures:
        out["images"] = pictures
    return out


def messages(field: str, value: Any, *, allow_empty: bool = False, limit: int | None = MAX_MESSAGES) -> tuple[dict[str, Any], ...]:
    """A conversation; a ``tool`` message must answer a call an earlier assistant message made."""
    if not isinstance(value, list) or (not value and not allow_empty):
        raise RuleError(field, "must be a non-empty list of messages", "invalid_type")
    if limit is not None and len(value) > limit:
        raise RuleError(field, f"takes at most {limit} messages")
    out = tuple(message(f"{field}[{i}]", m) for i, m in enumerate(value))
    if any("images" in m for m in out):
        from localinfer.request.images import counted

        counted(field, out, RuleError)
    if any(m["role"] == "tool" for m in out):
        _check_tool_turns(field, out)
    return out


def _assistant_calls(where: str, value: Any) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls``, as templates read them: ``arguments`` an object (the API
    sends a JSON string; templates expect the object). A string holding no JSON object is ``{}``: a call
    a cap cut short, sent back by agents with its tool's error (refused, their turn failed; OpenAI takes it)."""
    if not isinstance(value, list) or not value:
        raise RuleError(where, "must be a non-empty list of tool calls", "invalid_type")
    out = []
    for i, call in enumerate(value):
        w = f"{where}[{i}]"
        if not isinstance(call, dict) or call.get("type", "function") != "function" or not isinstance(call.get("function"), dict):
            raise RuleError(w, 'must be {"id": ..., "type": "function", "function": {"name", "arguments"}}', "invalid_type")
        fn = call["function"]
        name = text(f"{w}.function.name", fn.get("name"))
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                args = {}
            args = args if isinstance(args, dict) else {}
        if not isinstance(args, dict):
            raise RuleError(f"{w}.function.arguments", f"must be a JSON object, not {shown(args)}", "invalid_type")
        cid = call.get("id")
        if not isinstance(cid, str) or not cid:
            raise RuleError(f"{w}.id", f"must be the call's id (a string), not {shown(cid)}", "invalid_type")
        out.append({"id": cid, "type": "function", "function": {"name": name, "arguments": args}})
    return out


def _check_tool_turns(field: str, messages: tuple[dict[str, Any], ...]) -> None:
    """Every ``tool`` message answers a call an earlier assistant message made (by ``tool_call_id``)."""
    calls: dict[str, str] = {}
    for i, m in enumerate(messages):
        for call in m.get("tool_calls") or ():
            calls[call["id"]] = call["function"]["name"]
        if m.get("role") == "tool":
            cid = m.get("tool_call_id")
            if cid not in calls:
                raise RuleError(f"{field}[{i}].tool_call_id", f"is {shown(cid)}, which no earlier assistant message's tool_calls has")
            m.setdefault("name", calls[cid])  # templates (Llama's, the generic) name the function answered


# -- the chat template's variables and the reasoning format ---------------------------------------------
TEMPLATE_OWN = ("messages", "add_generation_prompt", "raise_exception", "strftime_now")  # set by the render
MAX_TEMPLATE_KWARGS_CHARS = 1024 * 1024


def chat_template_kwargs(field: str, value: Any) -> dict[str, Any] | None:
    """Variables for the chat template (vLLM's and llama-server's ``chat_template_kwargs``): an
    object of JSON values, none of them a name the render sets itself; empty means none."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RuleError(field, f"must be an object (template variable: value), not {_kind(value)}", "invalid_type")
    own = sorted(k for k in value if k in TEMPLATE_OWN)
    if own:
        raise RuleError(field, f"may not set '{own[0]}': the render sets it itself")
    for key in value:
        text(f"{field} key", key)
    if len(json.dumps(value, ensure_ascii=False, default=str)) > MAX_TEMPLATE_KWARGS_CHARS:
        raise RuleError(field, f"is longer than {MAX_TEMPLATE_KWARGS_CHARS:,} characters")
    return dict(value) or None


def chat_template_kwargs_text(field: str, raw: str) -> dict[str, Any] | None:
    """``--chat-template-kwargs JSON``: a JSON object, as ``chat_template_kwargs`` checks it."""
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise RuleError(field, f"is not valid JSON: {exc}", "invalid_json") from None
    return chat_template_kwargs(field, value)


def reasoning_format(field: str, value: Any) -> str:
    """llama-server's: ``none`` keeps a reasoning model's thinking in the text; ``auto`` and
    ``deepseek`` put it apart (``reasoning_content``), as when it is not given."""
    from localinfer.request.reasoning import FORMATS

    if not isinstance(value, str) or value not in FORMATS:
        raise RuleError(field, f"must be one of {', '.join(FORMATS)}, not {shown(value)}")
    return value


def _kind(v: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "an object"}
    return "null" if v is None else names.get(type(v), type(v).__name__)


def int_digits_limit() -> int:
    """The most digits Python converts (4300 unless changed): JSON with longer integers is refused."""
    get = getattr(sys, "get_int_max_str_digits", None)
    return get() if get else 4300
