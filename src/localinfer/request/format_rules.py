"""The rules for the fields that ask for the answer's shape: OpenAI's ``response_format``,
llama-server's ``json_schema`` and ``grammar`` (each as a ``structured.Format``, a schema we cannot
enforce refused naming its keyword), where a format's schema sits in a request, and the rule for
``tools`` beside a format. The scalar fields, text and messages are ``localinfer.request.rules``'s.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from localinfer.request.rules import RuleError, shown, text

_NAMED = re.compile(r"'([A-Za-z_][\w.]*)' (.+)", re.DOTALL)


def response_format(field: str, value: Any) -> Any:
    """OpenAI's ``response_format`` (text, json_object, json_schema) as a ``structured.Format`` or
    None (text); a schema we cannot enforce is refused naming the keyword and where it is."""
    from localinfer.request import structured

    if value is not None and not isinstance(value, dict):
        raise RuleError(field, f"must be an object, not {shown(value)}", "invalid_type")
    extra = sorted(set(value or ()) - {"type", "json_schema", "schema"})  # schema: llama-server's variant
    spec = (value or {}).get("json_schema")
    if not extra and isinstance(spec, dict):
        extra = [f"json_schema.{k}" for k in sorted(set(spec) - {"name", "description", "schema", "strict"})]
    if extra:
        raise RuleError(field, f"has an unknown field '{extra[0]}'", "unknown_parameter")
    return _format(field, structured.from_response_format, value, where=format_param(field, value))


def format_param(field: str, value: Any) -> str:
    """Where a format's schema is in the request: the field a broken schema's message names
    (``response_format.json_schema.schema``; llama-server's ``json_schema`` and ``grammar`` are their own)."""
    if field != "response_format" or not isinstance(value, dict):
        return field
    spec = value.get("json_schema")
    if value.get("type") == "json_schema" and isinstance(spec, dict) and "schema" in spec:
        return f"{field}.json_schema.schema"
    if value.get("type") == "json_object" and "schema" in value:
        return f"{field}.schema"
    return field


def json_schema(field: str, value: Any) -> Any:
    """llama-server's ``json_schema``: a schema object, as a ``structured.Format``."""
    from localinfer.request import structured

    if not isinstance(value, (dict, bool)):
        raise RuleError(field, f"must be a JSON schema (an object), not {shown(value)}", "invalid_type")
    return _format(field, structured.from_schema, value)


def grammar(field: str, value: Any) -> Any:
    """llama-server's ``grammar``: GBNF text, as a ``structured.Format``."""
    from localinfer.request import structured

    return _format(field, structured.from_grammar, text(field, value))


def _format(field: str, parse: Callable[[Any], Any], value: Any, where: str | None = None) -> Any:
    """``parse(value)``; its FormatError as a RuleError naming ``where`` (the schema's own field)."""
    from localinfer.request.structured import FormatError

    try:
        return parse(value)
    except FormatError as exc:  # "'response_format.type' must be ..." keeps its name; a schema's place is said
        named = _NAMED.fullmatch(str(exc))
        if named and (named.group(1) == field or named.group(1).startswith(field + ".")):
            raise RuleError(named.group(1), named.group(2)) from None
        raise RuleError(where or field, f"cannot be enforced: {exc}", "invalid_schema") from None


def tools_with_format(format_field: str | None, has_tools: bool, choice_mode: str | None) -> None:
    """``tools`` and a format on one request: one answer cannot be held to both (a call's JSON is
    not the format's), and a constraint is never silently half-enforced; with ``tool_choice``
    ``none`` no call is made and the format is enforced."""
    if format_field and has_tools and choice_mode != "none":
        raise RuleError(format_field, "cannot be enforced together with 'tools': give one of them, or 'tool_choice': 'none'",
                        "unsupported_parameter")  # fmt: skip
