"""What a request says about tools, checked: ``tools`` (functions with a JSON-schema ``parameters``)
and ``tool_choice``. Each problem is a ``RuleError`` naming the field (serve: a 400), or for the
API a ``UsageError``. The messages of a conversation that used tools are ``rules.message``'s."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from localinfer.errors import UsageError
from localinfer.request.rules import RuleError, shown, text

MAX_TOOLS = 128
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # OpenAI's rule for function names (and a dot, for Llama's builtins)


@dataclass(frozen=True)
class Tool:
    """One function the model may call. ``parameters``: a JSON schema for its arguments (an object)."""

    name: str
    description: str = ""
    parameters: Any = None  # a dict; None: takes any object
    # What the constraint holds a call to (``parameters`` less what it cannot enforce: toolcalls.enforce),
    # and where each left-out keyword was; None: ``parameters`` whole.
    enforced: Any = field(default=None, compare=False, repr=False)
    unenforced: tuple[str, ...] = field(default=(), compare=False)

    def to_openai(self) -> dict[str, Any]:
        """As the chat templates read it (transformers passes ``tools`` in this shape; the description
        always there, as llama.cpp gives it: templates such as Hermes 3's read it unguarded)."""
        fn: dict[str, Any] = {"name": self.name, "description": self.description}
        fn["parameters"] = self.parameters if self.parameters is not None else {"type": "object", "properties": {}}
        return {"type": "function", "function": fn}

    @property
    def schema(self) -> dict[str, Any]:
        """The arguments' schema, as a constraint enforces it: an object with declared properties and
        no word on others takes only those (OpenAI's strict calls; a small model otherwise invents
        keys until its token limit cuts the call short)."""
        given = self.enforced if self.enforced is not None else self.parameters
        params = given if given is not None else {"type": "object"}
        if "properties" in params and "additionalProperties" not in params:
            return {**params, "additionalProperties": False}
        return params


@dataclass(frozen=True)
class ToolChoice:
    """``auto`` (the model decides), ``none`` (no call), ``required`` (at least one call) or
    ``function`` (a call of ``name``)."""

    mode: str = "auto"
    name: str | None = None

    @property
    def forced(self) -> bool:
        return self.mode in ("required", "function")


@dataclass(frozen=True)
class ToolCall:
    """A call the model made: ``arguments`` is the JSON text it wrote (OpenAI's string)."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def new_call_id() -> str:
    import secrets  # hmac and base64 with it: not on the way of a run without tools

    return "call_" + secrets.token_hex(12)


def tools(field: str, value: Any, check_schema: Any = None, *, schema_key: str = "parameters",
          positions: Sequence[int] | None = None) -> tuple[Tool, ...]:  # fmt: skip
    """``value``: OpenAI's list of ``{"type": "function", "function": {name, description, parameters}}``
    (the bare function object is taken too). ``check_schema(field, schema)`` refuses a schema or
    returns what the constraint enforces of it and what it leaves out (:func:`check_schema`).
    Errors name the client's own fields: ``schema_key`` (Anthropic's ``input_schema``) and, where the
    wire left some of its tools out (the Responses API's hosted tools), each one's ``positions``."""
    if not isinstance(value, list):
        raise RuleError(field, f"must be a list of tools, not {shown(value)}", "invalid_type")
    if len(value) > MAX_TOOLS:
        raise RuleError(field, f"takes at most {MAX_TOOLS} tools")
    out: list[Tool] = []
    for i, item in enumerate(value):
        where = f"{field}[{i if positions is None else positions[i]}]"
        if not isinstance(item, dict):
            raise RuleError(where, f"must be an object, not {shown(item)}", "invalid_type")
        if "function" in item or "type" in item:
            if item.get("type") != "function":
                raise RuleError(f"{where}.type", f"must be 'function', not {shown(item.get('type'))}")
            fn, where = item.get("function"), f"{where}.function"
        else:
            fn = item
        out.append(_tool(where, fn, check_schema, schema_key))
    seen: set[str] = set()
    for i, t in enumerate(out):
        if t.name in seen:
            wrapped = isinstance(value[i], dict) and "function" in value[i]
            at = f"{field}[{i if positions is None else positions[i]}]{'.function' if wrapped else ''}"
            raise RuleError(f"{at}.name", f"repeats the name {t.name!r}: each tool needs its own")
        seen.add(t.name)
    return tuple(out)


def _tool(where: str, fn: Any, check_schema: Any, schema_key: str = "parameters") -> Tool:
    if not isinstance(fn, dict):
        raise RuleError(where, f"must be an object with 'name', not {shown(fn)}", "invalid_type")
    extra = sorted(set(fn) - {"name", "description", schema_key, "strict"})
    if extra:
        raise RuleError(where, f"has an unknown field '{extra[0]}'", "unknown_parameter")
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise RuleError(f"{where}.name", f"must be 1 to 64 letters, digits, '_', '-' or '.', not {shown(name)}")
    description = fn.get("description")
    if description is not None:
        text(f"{where}.description", description)
    params = fn.get(schema_key)
    enforced, unenforced = None, ()
    if params is not None:
        at = f"{where}.{schema_key}"
        if not isinstance(params, dict):
            raise RuleError(at, f"must be a JSON schema (an object), not {shown(params)}", "invalid_type")
        if params.get("type", "object") != "object":
            raise RuleError(at, f"must describe an object (its 'type' is {shown(params.get('type'))})")
        if check_schema is not None:
            enforced, unenforced = check_schema(at, params) or (None, ())
    return Tool(name, description or "", params, enforced, tuple(f"{where}.{schema_key} {u}" for u in unenforced))


def tool_choice(field: str, value: Any, offered: tuple[Tool, ...]) -> ToolChoice:
    """A choice among ``offered``: a function it names must be one of them."""
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise RuleError(field, f"must be 'auto', 'none', 'required' or a function, not {shown(value)}")
        choice = ToolChoice(value)
    elif isinstance(value, dict):
        fn = value.get("function")
        if value.get("type") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RuleError(field, 'must be {"type": "function", "function": {"name": ...}}', "invalid_type")
        choice = ToolChoice("function", fn["name"])
    else:
        raise RuleError(field, f"must be a string or an object, not {shown(value)}", "invalid_type")
    if choice.mode != "none" and not offered:
        raise RuleError(field, f"is {shown(value if isinstance(value, str) else 'function')} but no 'tools' are given")
    if choice.name is not None and choice.name not in {t.name for t in offered}:
        raise RuleError(f"{field}.function.name", f"names {choice.name!r}, which is not one of the tools")
    return choice


def check_schema(field: str, schema: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A tool's ``parameters``: what the constraint enforces of it and where each keyword it leaves
    out was (``toolcalls.enforce``); an invalid schema (an unknown type, a dangling bound) is refused
    by the field's name, as a response format's is."""
    from localinfer.request.structured import FormatError, check_schema as check
    from localinfer.request.toolcalls.enforce import enforceable

    enforced, unenforced = enforceable(schema)
    try:
        check(enforced)
    except FormatError as exc:
        raise RuleError(field, f"is not a valid schema: {exc}") from None
    return enforced, unenforced


def checked(offered: Sequence[Any] | None, choice: Any) -> tuple[tuple[Tool, ...], ToolChoice]:
    """The API's ``tools=`` and ``tool_choice=`` (OpenAI's JSON shapes, or ours), checked: UsageError."""
    try:
        if offered and all(isinstance(t, Tool) for t in offered):
            given = tuple(offered)
        else:
            given = tools("tools", list(offered or ()), check_schema)
        if isinstance(choice, ToolChoice):
            if choice.name is not None and choice.name not in {t.name for t in given}:
                raise RuleError("tool_choice", f"names {choice.name!r}, which is not one of the tools")
            return given, choice
        if not given and choice is None:
            return given, ToolChoice()
        return given, tool_choice("tool_choice", "auto" if choice is None else choice, given)
    except RuleError as exc:
        raise UsageError(str(exc)) from None


def checked_messages(messages: Sequence[Any]) -> tuple[dict[str, Any], ...]:
    """A conversation with tool turns (the API's), checked and shaped as serve's: UsageError."""
    from localinfer.request import rules

    try:
        return rules.messages("messages", list(messages))
    except RuleError as exc:
        raise UsageError(str(exc)) from None
