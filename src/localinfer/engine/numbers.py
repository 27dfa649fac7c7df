"""The bound on a number (and an object's keys) that a JSON schema leaves unbounded, for the constraint only.

JSON bounds no number's digits, and a small model can write a ``population`` digit after digit until
``max_tokens`` (issue 40). llama.cpp's schema grammar writes at most 16 integral digits; we give the
constraint (never the schema the caller sees or is validated against) the same: an ``integer`` or
``number`` without a ``minimum``/``maximum`` gets ±(10^16 - 1) on the open side, and a ``number``
at most 10 fraction digits (``multipleOf`` 1e-10, the finest llguidance takes) and no exponent (llguidance writes none in a
bounded range). A schema's own bounds always win: the open side then allows as many integral digits
as the given side has. Chosen by measurement over the 64-bit range (docs/structured-output.md).

llguidance compiles ``minimum``/``maximum`` into an exact digit-by-digit pattern (and JSON has no
leading zeros), and ``multipleOf`` 10^-k into at most k fraction digits, so this rewrite bounds the
digits themselves, which a value range alone would not do for fractions.
"""

from __future__ import annotations

import decimal
from typing import Any

INT_DIGITS = 16  # llama.cpp's json-schema-to-grammar: [1-9][0-9]{0,15}
FRACTION_DIGITS = 10  # llama.cpp's decimal part is [0-9]{1,16}; llguidance's multipleOf takes 1e-10 at most
_MAX_FRACTION = 10
_I64_MAX = 2**63 - 1  # llguidance's integer bounds are i64

_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_COMBINED = {"allOf", "anyOf", "oneOf", "$ref"}  # an object merged with others: its keys are not all here
_SCHEMA_ONE = ("items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else")


def bounded(schema: Any, merged: bool = False, close: bool | None = None) -> Any:
    """A copy of ``schema`` whose unbounded integers and numbers are bounded as above (values under
    ``enum``/``const``/``default`` are data and stay as they are), and whose objects that list
    ``properties`` but say nothing of others take no others, as llama.cpp's grammar does: a key the
    schema does not name is a string without end for a small model (``merged``: an ``allOf`` branch,
    whose object is only part of the whole: left open; ``close``: whether objects may be closed at
    all - not in a schema that composes objects by ``allOf`` or a ``$ref`` beside other keywords,
    where a closed part would refuse the other part's keys)."""
    if not isinstance(schema, dict):
        return schema
    if close is None:
        close = not _composes(schema)
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: bounded(sub, close=close) for name, sub in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [bounded(sub, merged=key == "allOf", close=close) for sub in out[key]]
    for key in _SCHEMA_ONE:
        if key in out:
            out[key] = bounded(out[key], close=close)
    if close and "properties" in out and "additionalProperties" not in out and not merged and not _COMBINED & out.keys():
        out["additionalProperties"] = False
    return _numeric(out)


def _composes(schema: Any) -> bool:
    """Whether some object of ``schema`` is made of parts: an ``allOf``, or a ``$ref`` with siblings."""
    if isinstance(schema, list):
        return any(_composes(s) for s in schema)
    if not isinstance(schema, dict):
        return False
    if "allOf" in schema or ("$ref" in schema and len(schema.keys() - {"$ref", "description", "title"}) > 0):
        return True
    return any(_composes(v) for k, v in schema.items() if k not in ("enum", "const", "default", "examples"))


def _numeric(s: dict[str, Any]) -> dict[str, Any]:
    types = s.get("type")
    types = types if isinstance(types, list) else [types]
    if not {"integer", "number"} & set(types) or "enum" in s or "const" in s:
        return s
    low = [s[k] for k in ("minimum", "exclusiveMinimum") if _is_num(s.get(k))]
    high = [s[k] for k in ("maximum", "exclusiveMaximum") if _is_num(s.get(k))]
    if not low:
        edge = _edge(high)
        if edge is not None:
            s["minimum"] = -edge
    if not high:
        edge = _edge(low)
        if edge is not None:
            s["maximum"] = edge
    if "number" in types and "multipleOf" not in s:
        # one digit past the bounds' own, so that a range between them is never empty
        digits = max([FRACTION_DIGITS - 1, *(_fraction_digits(v) for v in (*low, *high))]) + 1
        if digits <= _MAX_FRACTION:
            s["multipleOf"] = float(f"1e-{digits}")
    return s


def _edge(given: list[Any]) -> int | None:
    """The open side's bound: INT_DIGITS nines, or as many as the given side's integral part has
    (so that the range is never empty); None past what llguidance's 64-bit bounds hold."""
    digits = max([INT_DIGITS, *(len(str(int(abs(v)))) for v in given if abs(v) < 1e300)])
    edge = 10**digits - 1
    return edge if edge <= _I64_MAX else None


def _fraction_digits(v: Any) -> int:
    exponent = decimal.Decimal(repr(v)).normalize().as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
