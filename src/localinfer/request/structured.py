"""What an answer must look like: :class:`Format` (any JSON object, a JSON schema, or a GBNF grammar).

A plain value, checked here without llama_cpp so the CLI, the API, batch lines and serve can refuse a
bad schema (one line naming the keyword, the dangling ``$ref``...) before anything loads. The engine
compiles it (``engine/constrain.py``). A keyword that the engine cannot enforce is refused by name,
never ignored: a schema the caller believes is enforced but is not is the worst outcome.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from localinfer.errors import UsageError

# Bounds on what a caller may ask us to compile (docs/structured-output.md): the compiler's own
# limits (engine/constrain.py) bound the work a schema within these can cause.
MAX_SCHEMA_BYTES = 256 * 1024
MAX_GRAMMAR_BYTES = 256 * 1024
MAX_SCHEMA_DEPTH = 64
# What checking one request may cost (issue 40: checks ran on serve's event loop): `pattern`s are
# parsed, not compiled (CPython's compiler took minutes on a schema of wide character classes), and
# bounded in number and length; a grammar's rules are bounded, its conversion linear and done once.
MAX_DEPTH_THROUGH_REFS = 256  # nesting along chains of '$ref's: llguidance's compiler overflows its stack past ~1,000
MAX_PATTERNS = 1024
MAX_PATTERN_CHARS = 64 * 1024  # all of a schema's patterns together
MAX_GRAMMAR_RULES = 4096

KINDS = ("json", "json_schema", "grammar")

# Keywords the engine enforces, and annotations that constrain nothing (accepted, no effect).
ENFORCED = frozenset(
    "type properties required additionalProperties enum const anyOf oneOf allOf $ref $defs definitions "
    "items prefixItems minItems maxItems minLength maxLength pattern format "
    "minimum maximum exclusiveMinimum exclusiveMaximum".split()
)  # fmt: skip
ANNOTATIONS = frozenset(
    "$schema $id $comment title description default examples deprecated readOnly writeOnly "
    "contentEncoding contentMediaType".split()
)  # fmt: skip
TYPES = frozenset(("null", "boolean", "integer", "number", "string", "array", "object"))
FORMATS = frozenset(("date", "time", "date-time", "uuid", "email", "duration", "ipv4", "ipv6", "hostname"))
# Regex features a pattern may not use (no automaton can enforce them): lookaround, backreferences.
_UNSUPPORTED_REGEX = re.compile(r"\(\?[=!<]|\\[1-9]|\\k<|\(\?P[=>]")


class FormatError(UsageError):
    """A response format, schema or grammar we cannot enforce (serve answers it with a 400)."""


@dataclass(frozen=True)
class Format:
    """``kind`` json: any JSON object; json_schema: ``text`` is the schema (compact JSON, the key of
    the engine's compiled-grammar cache); grammar: ``text`` is GBNF. Build it with the functions below."""

    kind: str
    text: str = ""
    name: str | None = None  # the schema's name (OpenAI's json_schema.name)
    strict: bool = True
    lark: str = field(default="", compare=False, repr=False)  # a grammar's Lark conversion (from_grammar)

    @property
    def schema(self) -> dict[str, Any] | None:
        return json.loads(self.text) if self.kind == "json_schema" else None

    def to_response_format(self) -> dict[str, Any] | None:
        """OpenAI's ``response_format`` for this format (None for a grammar: OpenAI has none)."""
        if self.kind == "json":
            return {"type": "json_object"}
        if self.kind == "json_schema":
            spec = {"name": self.name or "schema", "schema": self.schema, "strict": self.strict}
            return {"type": "json_schema", "json_schema": spec}
        return None

    def request_fields(self) -> dict[str, Any]:
        """The fields of a request to an OpenAI-compatible server: ``response_format``, or for a
        grammar llama-server's ``grammar`` extension."""
        rf = self.to_response_format()
        return {"response_format": rf} if rf is not None else {"grammar": self.text}


JSON_OBJECT = Format("json")


def from_schema(schema: Mapping[str, Any] | str, *, name: str | None = None, strict: bool = True) -> Format:
    """A JSON-schema format from a schema (a mapping or its JSON text), checked here."""
    if isinstance(schema, str):
        if len(schema.encode("utf-8", "surrogatepass")) > MAX_SCHEMA_BYTES:
            raise FormatError(f"the JSON schema is larger than {MAX_SCHEMA_BYTES // 1024} KiB")
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise FormatError(f"the JSON schema is not valid JSON: {exc}") from None
    if schema is True:
        schema = {}
    if schema is False:
        raise FormatError("the JSON schema is false: nothing can satisfy it")
    if not isinstance(schema, Mapping):
        raise FormatError("a JSON schema must be a JSON object")
    text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SCHEMA_BYTES:
        raise FormatError(f"the JSON schema is larger than {MAX_SCHEMA_BYTES // 1024} KiB")
    if _offloaded(text):  # serve: in a helper process, off the GIL its event loop needs
        from localinfer.request.checker import check

        _, error = check("schema", text)
        if error is not None:
            raise FormatError(error)
    else:
        check_schema(schema)
    return Format("json_schema", text, name=name, strict=bool(strict))


def from_grammar(text: str) -> Format:
    """A GBNF grammar (llama.cpp's syntax, a ``root`` rule), its syntax and rule names checked; the
    Format keeps its Lark conversion, so the engine does not convert it again."""
    if not isinstance(text, str) or not text.strip():
        raise FormatError("the grammar is empty")
    if len(text.encode("utf-8", "surrogatepass")) > MAX_GRAMMAR_BYTES:
        raise FormatError(f"the grammar is larger than {MAX_GRAMMAR_BYTES // 1024} KiB")
    if not re.search(r"^\s*root\s*::=", text, re.MULTILINE):
        raise FormatError("the grammar has no 'root ::= ...' rule")
    rules = len(re.findall(r"::=", text))  # an upper bound (a literal may hold one): refused before parsing
    if rules > MAX_GRAMMAR_RULES:
        raise FormatError(f"the grammar has {rules} rules; at most {MAX_GRAMMAR_RULES} are taken")
    if _offloaded(text):  # as a schema's checks (from_schema)
        from localinfer.request.checker import check

        lark, error = check("grammar", text)
        if error is not None:
            raise FormatError(error)
        return Format("grammar", text, lark=lark)
    return Format("grammar", text, lark=gbnf_to_lark(text))


def _offloaded(text: str) -> bool:
    """Whether a format this long is checked in request/checker.py's helper process (serve turns it on)."""
    checker = sys.modules.get("localinfer.request.checker")  # imported only where it was enabled
    return checker is not None and checker.wanted(text)


def gbnf_to_lark(text: str) -> str:
    """The GBNF grammar in Lark syntax, or FormatError (llguidance's converter, linear: request/grammar.py)."""
    from localinfer.request.grammar import TooDeep, convert

    try:
        return convert(text)
    except TooDeep as exc:
        raise FormatError(str(exc)) from None
    except Exception as exc:  # its GbnfToLarkError, or a ValueError from deeper in the parser
        raise FormatError(f"the grammar is not valid GBNF: {' '.join(str(exc).split())[:300]}") from None


def from_response_format(obj: Any) -> Format | None:
    """OpenAI's ``response_format``: ``{"type": "text"}`` (None), ``{"type": "json_object"}``, or
    ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``."""
    if obj is None:
        return None
    if isinstance(obj, Format):
        return obj
    if not isinstance(obj, Mapping):
        raise FormatError("'response_format' must be an object")
    kind = obj.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT if "schema" not in obj else from_schema(obj["schema"])  # llama-server's variant
    if kind == "json_schema":
        spec = obj.get("json_schema")
        if not isinstance(spec, Mapping) or "schema" not in spec:
            raise FormatError("'response_format.json_schema' must be an object with a 'schema'")
        name = spec.get("name")
        if name is not None and not isinstance(name, str):
            raise FormatError("'response_format.json_schema.name' must be a string")
        return from_schema(spec["schema"], name=name, strict=spec.get("strict") is not False)
    raise FormatError(f"'response_format.type' must be text, json_object or json_schema, not {kind!r}")


def pick(response_format: Any = None, json_schema: Any = None, grammar: str | None = None) -> Format | None:
    """At most one of the three ways to ask (the API's and llama-server's keywords); None: free text."""
    given = [n for n, v in (("response_format", response_format), ("json_schema", json_schema),
                            ("grammar", grammar)) if v is not None]  # fmt: skip
    if len(given) > 1:
        raise FormatError(f"give one of {' and '.join(given)}, not both")
    if json_schema is not None:
        return json_schema if isinstance(json_schema, Format) else from_schema(json_schema)
    if grammar is not None:
        return from_grammar(grammar)
    if isinstance(response_format, str):  # the CLI's and Ollama's shorthand
        if response_format == "json":
            return JSON_OBJECT
        raise FormatError(f"format must be 'json' or a schema, not {response_format!r}")
    return from_response_format(response_format)


# -- checking a schema ------------------------------------------------------------------------------
def check_schema(schema: Mapping[str, Any]) -> None:
    """Refuse, by name and place, what the engine would not enforce or what cannot be satisfied."""
    checker = _Checker(schema)
    checker.check(schema, "#", 0)
    checker.height(schema, 0)


class _Checker:
    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root
        self.patterns = self.pattern_chars = 0
        self.heights: dict[str, int] = {}
        self.following: set[str] = set()

    def check(self, s: Any, at: str, depth: int) -> None:
        if isinstance(s, bool):
            return  # true: anything; false: nothing (only valid where a schema may be absent)
        if not isinstance(s, Mapping):
            raise FormatError(f"{at}: a schema must be an object or a boolean")
        if depth > MAX_SCHEMA_DEPTH:
            raise FormatError(f"{at}: the schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
        for key in s:
            if key not in ENFORCED and key not in ANNOTATIONS:
                raise FormatError(f"{at}: JSON Schema keyword {key!r} is not supported (it would not be enforced)")
        self._values(s, at)
        sub = depth + 1
        for key in ("properties", "$defs", "definitions"):
            for name, child in (s.get(key) or {}).items():
                self.check(child, f"{at}/{key}/{name}", sub)
        for key in ("additionalProperties", "items"):
            if key in s and not isinstance(s[key], bool):
                self.check(s[key], f"{at}/{key}", sub)
        for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
            for i, child in enumerate(s.get(key, ())):
                self.check(child, f"{at}/{key}/{i}", sub)
        if "$ref" in s:
            self.resolve(s["$ref"], at)

    def height(self, s: Any, level: int) -> int:
        """How deep ``s`` nests with its '$ref's followed (a '$ref' being followed, recursion, counts
        once); each '$ref' is measured once. Refused past MAX_DEPTH_THROUGH_REFS (after check: every
        '$ref' resolves)."""
        if level > MAX_DEPTH_THROUGH_REFS:
            raise FormatError(f"the schema nests more than {MAX_DEPTH_THROUGH_REFS} levels deep through its '$ref's")
        if not isinstance(s, Mapping):
            return 0
        below = [self.height(child, level + 1) for child in _children(s)]
        ref = s.get("$ref")
        if isinstance(ref, str) and ref not in self.following:
            if ref not in self.heights:
                self.following.add(ref)
                self.heights[ref] = self.height(self.target(ref), level + 1)
                self.following.discard(ref)
            below.append(self.heights[ref])
            if level + self.heights[ref] > MAX_DEPTH_THROUGH_REFS:
                raise FormatError(f"the schema nests more than {MAX_DEPTH_THROUGH_REFS} levels deep through its '$ref's")
        return 1 + max(below, default=0)

    def target(self, ref: str) -> Any:
        node: Any = self.root
        for part in ref[1:].split("/")[1:] if ref != "#" else ():
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return node

    def resolve(self, ref: Any, at: str) -> None:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise FormatError(f"{at}: only local '$ref's ('#/$defs/...') are supported, not {ref!r}")
        node: Any = self.root
        for part in ref[1:].split("/")[1:] if ref != "#" else ():
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, Mapping) or part not in node:
                raise FormatError(f"{at}: '$ref' {ref!r} points to nothing")
            node = node[part]

    def _values(self, s: Mapping[str, Any], at: str) -> None:
        t = s.get("type")
        if t is not None:
            names = t if isinstance(t, list) else [t]
            for n in names:
                if not isinstance(n, str) or n not in TYPES:  # a str first: {} or [] is unhashable
                    raise FormatError(f"{at}: unknown type {n!r}")
        for key in ("properties", "$defs", "definitions"):
            if key in s and not isinstance(s[key], Mapping):
                raise FormatError(f"{at}: '{key}' must be an object")
        req = s.get("required")
        if req is not None and not (isinstance(req, list) and all(isinstance(r, str) for r in req)):
            raise FormatError(f"{at}: 'required' must be a list of property names")
        for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
            if key in s and not (isinstance(s[key], list) and s[key]):
                raise FormatError(f"{at}: '{key}' must be a non-empty list of schemas")
        if "enum" in s and not (isinstance(s["enum"], list) and s["enum"]):
            raise FormatError(f"{at}: 'enum' must be a non-empty list")
        for lo, hi in (("minItems", "maxItems"), ("minLength", "maxLength")):
            for key in (lo, hi):
                v = s.get(key)
                if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                    raise FormatError(f"{at}: '{key}' must be a non-negative integer")
            if s.get(lo) is not None and s.get(hi) is not None and s[lo] > s[hi]:
                raise FormatError(f"{at}: '{lo}' is larger than '{hi}': nothing can satisfy it")
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            v = s.get(key)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)):
                raise FormatError(f"{at}: '{key}' must be a number")
        lo, hi = s.get("minimum"), s.get("maximum")
        if lo is not None and hi is not None and lo > hi:
            raise FormatError(f"{at}: 'minimum' is larger than 'maximum': nothing can satisfy it")
        if "pattern" in s:
            self._pattern(s["pattern"], at)
        fmt = s.get("format")
        if fmt is not None and (not isinstance(fmt, str) or fmt not in FORMATS):
            raise FormatError(f"{at}: format {fmt!r} is not supported (supported: {', '.join(sorted(FORMATS))})")

    def _pattern(self, p: Any, at: str) -> None:
        if not isinstance(p, str):
            raise FormatError(f"{at}: 'pattern' must be a string")
        self.patterns += 1
        self.pattern_chars += len(p)
        if self.patterns > MAX_PATTERNS:
            raise FormatError(f"{at}: the schema has more than {MAX_PATTERNS} 'pattern's")
        if self.pattern_chars > MAX_PATTERN_CHARS:
            raise FormatError(f"{at}: the schema's 'pattern's are longer than {MAX_PATTERN_CHARS // 1024} KiB in all")
        if _UNSUPPORTED_REGEX.search(p):
            raise FormatError(f"{at}: 'pattern' {_short(p)} uses lookaround or a backreference, which cannot be enforced")
        try:  # its syntax only: parsing is linear, compiling builds every character class's table
            _parse_regex(p)
        except (re.error, RecursionError, OverflowError) as exc:
            raise FormatError(f"{at}: 'pattern' {_short(p)} is not a valid regular expression: {exc}") from None


def _children(s: Mapping[str, Any]) -> list[Any]:
    """The subschemas of ``s`` (as ``_Checker.check`` walks them)."""
    out = [child for key in ("properties", "$defs", "definitions") for child in (s.get(key) or {}).values()]
    out += [s[key] for key in ("additionalProperties", "items") if isinstance(s.get(key), Mapping)]
    return out + [child for key in ("anyOf", "oneOf", "allOf", "prefixItems") for child in s.get(key, ())]


def _parse_regex(p: str) -> None:
    import importlib

    try:
        parser = importlib.import_module("re._parser")
    except ImportError:  # Python < 3.11
        parser = importlib.import_module("sre_parse")
    parser.parse(p)


def _short(p: str) -> str:
    return repr(p) if len(p) <= 80 else repr(p[:77] + "...")
