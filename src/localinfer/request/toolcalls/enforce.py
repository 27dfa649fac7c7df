"""A tool's ``parameters`` as the constraint can hold them. A tool's schema is first a description for
the model (agents send keywords such as ``propertyNames`` or ``format: "uri"`` in a few of their two
dozen tools), so every valid JSON Schema is taken: what the constraint engine cannot enforce is left
out of the constraint and named (:func:`enforceable`), the rest is enforced once a call starts, and a
finished call is checked against the whole schema (:func:`violation`). A ``response_format`` keeps
structured output's rule: what cannot be enforced is refused (``request.structured``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

_MAPS = ("properties", "$defs", "definitions")
_ONE = ("additionalProperties", "items")
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def enforceable(schema: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``schema`` without the keywords the constraint cannot enforce (unknown keywords, formats it has
    no rule for, patterns with lookaround or another regex dialect, ``$ref``s it cannot follow), and
    where each left-out keyword was (``#/properties/path: propertyNames``). What is left is checked
    by ``structured.check_schema`` as a response format's schema is: an invalid schema is refused."""
    from localinfer.request import structured as st

    dropped: list[str] = []
    kept = _pruned(schema, "#", 0, dropped, lambda k, v: (k in st.ENFORCED or k in st.ANNOTATIONS) and _holds(k, v))
    while True:  # a $ref into a part left out would dangle: leave it out too (a few rounds at most)
        dangling: list[str] = []
        root = kept
        kept = _pruned(root, "#", 0, dangling, lambda k, v: k != "$ref" or _resolves(root, v))
        if not dangling:
            break
        dropped += dangling
    return kept, tuple(dropped)


def _pruned(s: Any, at: str, depth: int, dropped: list[str], keeps: Callable[[str, Any], bool]) -> Any:
    """``s`` and its subschemas without the keywords ``keeps`` refuses, each named in ``dropped``."""
    from localinfer.request import structured as st

    if not isinstance(s, Mapping) or depth > st.MAX_SCHEMA_DEPTH:
        return s  # a boolean schema, or what check_schema refuses by name afterwards
    out: dict[str, Any] = {}
    for key, value in s.items():
        if not keeps(key, value):
            dropped.append(f"{at}: {key}")
            continue
        if key in _MAPS and isinstance(value, Mapping):
            value = {k: _pruned(v, f"{at}/{key}/{k}", depth + 1, dropped, keeps) for k, v in value.items()}
        elif key in _ONE:
            value = _pruned(value, f"{at}/{key}", depth + 1, dropped, keeps)
        elif key in _LISTS and isinstance(value, list):
            value = [_pruned(v, f"{at}/{key}/{i}", depth + 1, dropped, keeps) for i, v in enumerate(value)]
        out[key] = value
    return out


def _holds(key: str, value: Any) -> bool:
    """Whether the constraint can hold this keyword's value (a bad value of a keyword it knows, such
    as a negative ``minLength``, is kept: check_schema refuses the schema as invalid)."""
    from localinfer.request import structured as st

    if key == "format":
        return not isinstance(value, str) or value in st.FORMATS  # not a string: invalid, refused there
    if key == "pattern" and isinstance(value, str):
        if st._UNSUPPORTED_REGEX.search(value):
            return False
        try:
            st._parse_regex(value)  # ECMA syntax Python's parser does not know (\p{L}): described, not enforced
        except Exception:
            return False
    if key == "$ref":
        return isinstance(value, str) and value.startswith("#")  # a remote schema is never fetched
    return True


def _resolves(root: Any, ref: Any) -> bool:
    if not isinstance(ref, str) or not ref.startswith("#"):
        return False
    node = root
    for part in ref[1:].split("/")[1:] if ref != "#" else ():
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def violation(schema: Any, arguments: str) -> str | None:
    """Why a finished call's ``arguments`` (JSON text) break its tool's whole schema, or None. Only
    for tools with keywords left out of the constraint: the rest held the call to its schema as it
    was written. jsonschema, the reference implementation, imported here only."""
    import json

    try:
        value = json.loads(arguments)
    except ValueError:
        return "the arguments are not JSON"
    try:
        import jsonschema
    except ImportError:  # an install without it: the keywords were still named as not enforced
        return None
    try:
        error = jsonschema.exceptions.best_match(jsonschema.validators.validator_for(schema)(schema).iter_errors(value))
    except Exception:  # a schema its validator cannot use (a remote $ref): nothing to say of the call
        return None
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{'at ' + where + ': ' if where else ''}{error.message[:200]}"
