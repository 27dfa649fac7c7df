"""How each model family writes a tool call, detected from its chat template, and how a request's
tools reach the prompt.

- ``hermes`` (Hermes 2/3, Qwen 2.5/3): ``<tool_call>{"name", "arguments"}</tool_call>``, any number.
- ``llama3`` (Llama 3.1-3.3): the answer is ``{"name", "parameters"}``, maybe after ``<|python_tag|>``.
- ``mistral`` (Nemo, Small): ``[TOOL_CALLS][{"name", "arguments"}, ...]``.
- ``generic`` (a template that knows no tools, as llama-server's generic format): the tools are
  described in the system message and the answer is JSON, ``{"tool_calls": [...]}`` or
  ``{"response": "..."}``, always constrained (as llama-server does).

The templates that know tools get ``tools=`` and render tool turns themselves; for the generic
format, tool turns are rewritten into text turns a plain chat template renders (as minja's
polyfills do for llama.cpp).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from localinfer.request.toolcalls.spec import Tool, ToolChoice


@dataclass(frozen=True)
class Family:
    name: str
    starts: tuple[str, ...] = ()  # markers that open the calls, anywhere in the answer
    leading: tuple[str, ...] = ()  # an answer that starts (after spaces) with one of these is calls
    args_key: str = "arguments"  # the key of a call's arguments in its JSON
    opening: str = ""  # what a forced answer starts with, written into the prompt (the constraint follows)
    native: bool = True  # the template renders tools and tool turns itself


HERMES = Family("hermes", starts=("<tool_call>",), opening="<tool_call>\n")
LLAMA3 = Family("llama3", starts=("<|python_tag|>",), leading=("{",), args_key="parameters")
MISTRAL = Family("mistral", starts=("[TOOL_CALLS]",), leading=("[{",), opening="[TOOL_CALLS]")
GENERIC = Family("generic", leading=("{",), native=False)
FAMILIES = {f.name: f for f in (HERMES, LLAMA3, MISTRAL, GENERIC)}


def detect(template: str | None) -> Family:
    """The family a chat template's source writes calls in (llama.cpp's chat.cpp detects the same
    way: by the markers the template itself writes)."""
    src = template or ""
    if "tools" not in src:
        return GENERIC
    if "[TOOL_CALLS]" in src:
        return MISTRAL
    if "<tool_call>" in src and "<function=" not in src:  # Qwen3-Coder's XML calls are not Hermes JSON
        return HERMES
    if "<|python_tag|>" in src or ("<|start_header_id|>" in src and '"parameters"' in src):
        return LLAMA3
    return GENERIC


# -- what a forced call must be: a JSON schema for the constraint ---------------------------------------
def _call_schema(tool: Tool, args_key: str, defs: dict[str, Any]) -> dict[str, Any]:
    # "name" first: the parser streams a call once its name is known (a grammar keeps this order)
    return {"type": "object", "properties": {"name": {"const": tool.name}, args_key: _placed(tool, defs)},
            "required": ["name", args_key], "additionalProperties": False}  # fmt: skip


def _calls_schema(tools: tuple[Tool, ...], choice: ToolChoice, args_key: str, defs: dict[str, Any]) -> dict[str, Any]:
    chosen = [t for t in tools if choice.name is None or t.name == choice.name]
    schemas = [_call_schema(t, args_key, defs) for t in chosen]
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def _placed(tool: Tool, defs: dict[str, Any]) -> Any:
    """A tool's schema where the answer's schema holds it: one with local ``$ref``s (relative to the
    tool's own root) moves to the root's ``$defs`` under the tool's name, its refs rewritten to point
    there, and is referred to."""
    own = tool.schema
    if '"$ref"' not in json.dumps(own):
        return own
    key = f"tool:{tool.name}"  # a name has no '/' or '~' (spec._NAME): a safe JSON-pointer part
    defs[key] = _rebased(own, f"#/$defs/{key}")
    return {"$ref": f"#/$defs/{key}"}


def _rebased(node: Any, base: str) -> Any:
    if isinstance(node, dict):
        return {k: (base + v[1:] if k == "$ref" and isinstance(v, str) and v.startswith("#") else _rebased(v, base))
                for k, v in node.items()}  # fmt: skip
    if isinstance(node, list):
        return [_rebased(v, base) for v in node]
    return node


def schema(family: Family, tools: tuple[Tool, ...], choice: ToolChoice, parallel: bool) -> dict[str, Any]:
    """What the answer (after ``family.opening``, or after a ``start`` marker when lazy) must be."""
    defs: dict[str, Any] = {}
    answer = _answer_schema(family, _calls_schema(tools, choice, family.args_key, defs), choice, parallel)
    return {**answer, "$defs": defs} if defs else answer


def _answer_schema(family: Family, call: dict[str, Any], choice: ToolChoice, parallel: bool) -> dict[str, Any]:
    if family.name == "generic":
        array = {"type": "array", "items": call, "minItems": 1, **({} if parallel else {"maxItems": 1})}
        calls = {"type": "object", "properties": {"tool_calls": array}, "required": ["tool_calls"], "additionalProperties": False}
        if choice.forced:
            return calls
        reply = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"], "additionalProperties": False}
        return {"anyOf": [calls, reply]}
    if family.name == "mistral":
        return {"type": "array", "items": call, "minItems": 1, **({} if parallel else {"maxItems": 1})}
    return call


# -- the prompt --------------------------------------------------------------------------------------
def template_messages(family: Family, messages: list[dict[str, Any]], tools: tuple[Tool, ...], choice: ToolChoice) -> list[dict[str, Any]]:
    """The messages as this family's template renders them."""
    if family.native:
        return messages
    out = [_plain_turn(m) for m in messages]
    if choice.mode == "none" or not tools:
        return out
    offer = _generic_offer(tools, choice)
    if out and out[0]["role"] == "system":
        return [{**out[0], "content": f"{out[0]['content']}\n\n{offer}"}, *out[1:]]
    return [{"role": "system", "content": offer}, *out]


_UNSAID = frozenset(("$schema", "$id", "$comment"))
_NAMED_SCHEMAS = frozenset(("properties", "patternProperties", "$defs", "definitions", "dependentSchemas"))
_SCHEMA = frozenset(("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
                     "additionalItems", "unevaluatedItems", "unevaluatedProperties"))  # fmt: skip


def _described(fn: dict[str, Any]) -> dict[str, Any]:
    return {**fn, "parameters": _said(fn["parameters"])}


def _said(s: Any) -> Any:
    """A schema less ``_UNSAID`` wherever a schema is (a property named ``$id`` is kept)."""
    if not isinstance(s, dict):
        return s
    out: dict[str, Any] = {}
    for k, v in s.items():
        if k in _UNSAID:
            continue
        if k in _NAMED_SCHEMAS and isinstance(v, dict):
            v = {name: _said(child) for name, child in v.items()}
        elif k in _SCHEMA:
            v = _said(v)
        elif k in ("anyOf", "oneOf", "allOf", "prefixItems") and isinstance(v, list):
            v = [_said(child) for child in v]
        out[k] = v
    return out


def _plain_turn(m: dict[str, Any]) -> dict[str, Any]:
    """A tool turn as text for a template that knows no tools (the JSON the generic format answers)."""
    if m.get("tool_calls"):
        calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in m["tool_calls"]]
        body: dict[str, Any] = {"tool_calls": calls}
        return {"role": "assistant", "content": json.dumps(body, ensure_ascii=False)}
    if m.get("role") == "tool":
        result = {"tool_call_id": m.get("tool_call_id"), "name": m.get("name"), "content": m.get("content")}
        return {"role": "user", "content": json.dumps({"tool_response": result}, ensure_ascii=False)}
    return m


def _generic_offer(tools: tuple[Tool, ...], choice: ToolChoice) -> str:
    # compact JSON (an agent's 24 tools: indenting cost a third more tokens), less what tells the
    # model nothing: the dialect and ids of a schema
    listed = json.dumps([_described(t.to_openai()["function"]) for t in tools], ensure_ascii=False, separators=(",", ":"))
    call = '{"tool_calls": [{"name": "<tool name>", "arguments": {<its arguments>}}]}'
    if choice.forced:
        how = f"Respond in JSON format, with `tool_calls` (a request to call tools): {call}"
    else:
        how = ("Respond in JSON format, either with `tool_calls` (a request to call tools): "
               f'{call}, or with `response` (your reply to the user\'s request): {{"response": "<your reply>"}}')  # fmt: skip
    return f"You can call any of the following tools to satisfy the user's requests:\n{listed}\n\n{how}"
