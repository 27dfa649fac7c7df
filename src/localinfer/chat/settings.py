"""Chat settings (`/set KEY VALUE`, parsed and validated) and the session's running totals (`/stats`).

Plain values, no heavy imports: the CLI and tests use them without loading anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from localinfer.request.sampling import SamplingOptions
from localinfer.errors import UsageError
from localinfer.request.rules import RULES, RuleError

if TYPE_CHECKING:
    from localinfer.answer.answer import Answer
    from localinfer.request.structured import Format

# -- settings --------------------------------------------------------------------------------------


# key -> where the value lives ("sampling" or "chat"); the rules are localinfer.request.rules
_KEYS: dict[str, str] = {
    "temperature": "sampling",
    "top_p": "sampling",
    "top_k": "sampling",
    "min_p": "sampling",
    "repeat_penalty": "sampling",
    "repeat_last_n": "sampling",
    "seed": "sampling",
    "max_tokens": "chat",
}
_ALIASES = {"temp": "temperature", "n": "max_tokens", "num_predict": "max_tokens", "repeat_n": "repeat_last_n"}
SETTING_KEYS: tuple[str, ...] = (*_KEYS, "stop", "format")
FORMAT_USAGE = "/set format json | schema FILE | grammar FILE | off"


def canonical_key(key: str) -> str:
    """``"top-p"`` -> ``"top_p"``, ``"temp"`` -> ``"temperature"`` (unknown keys come back normalized)."""
    name = key.strip().lower().replace("-", "_")
    return _ALIASES.get(name, name)


@dataclass(frozen=True)
class ChatSettings:
    """What a turn is generated with; ``with_value`` is how `/set KEY VALUE` changes it."""

    sampling: SamplingOptions = SamplingOptions()
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    response_format: Format | None = None  # each answer is this JSON or grammar (/set format)
    template_vars: dict | None = None  # the chat template's variables (--chat-template-kwargs, /think)

    def with_thinking(self, on: bool) -> ChatSettings:
        """`/think on|off`: ``enable_thinking`` for the template (reasoning models that read it)."""
        return replace(self, template_vars={**(self.template_vars or {}), "enable_thinking": on})

    def with_value(self, key: str, value: str) -> ChatSettings:
        """A copy with ``key`` set from the text ``value``; UsageError naming the valid values."""
        name = canonical_key(key)
        value = value.strip()
        if name == "stop":
            if value.lower() in ("", "none"):
                return replace(self, stop=())
            return replace(self, stop=(*self.stop, unquote(value)))
        if name == "format":
            return replace(self, response_format=parse_format(value))
        if name not in _KEYS:
            from localinfer.fuzzy import did_you_mean

            raise UsageError(
                f"unknown setting {key!r}", hint=did_you_mean(name, SETTING_KEYS) or f"settings: {', '.join(SETTING_KEYS)}"
            )
        where, rule = _KEYS[name], RULES[name]
        if not value:
            words = f", or {rule.unset[0]}" if rule.unset else ""
            raise UsageError(f"/set {name} needs a value ({rule.what()}{words})")
        try:
            parsed = rule.parse(name, value)
        except RuleError as exc:
            raise UsageError(str(exc)) from None
        if where == "sampling":
            return replace(self, sampling=replace(self.sampling, **{name: parsed}))
        return replace(self, **{name: parsed})

    def items(self) -> list[tuple[str, str]]:
        s = self.sampling
        return [
            ("temperature", f"{s.temperature:g}" + (" (greedy)" if s.greedy else "")),
            ("top_p", f"{s.top_p:g}"),
            ("top_k", str(s.top_k)),
            ("min_p", f"{s.min_p:g}"),
            ("repeat_penalty", f"{s.repeat_penalty:g}"),
            ("repeat_last_n", str(s.repeat_last_n)),
            ("seed", "random" if s.seed is None else str(s.seed)),
            ("max_tokens", "none (until the model stops or the context is full)" if self.max_tokens is None else str(self.max_tokens)),
            ("stop", ", ".join(repr(x) for x in self.stop) or "none"),
            ("format", format_label(self.response_format)),
            *([("template", json.dumps(self.template_vars))] if self.template_vars else []),
        ]


def parse_format(value: str) -> Format | None:
    """`/set format`'s value: json (any JSON object), schema FILE (a JSON schema), grammar FILE
    (GBNF), or off; a schema we cannot enforce is refused here, naming its keyword."""
    from localinfer.request import structured

    kind, _, arg = value.strip().partition(" ")
    kind, arg = kind.lower(), unquote(arg.strip())
    if kind in ("off", "none", "text") and not arg:
        return None
    if kind == "json" and not arg:
        return structured.JSON_OBJECT
    if kind in ("schema", "grammar") and arg:
        path = Path(arg).expanduser()
        try:
            with open(path, "rb") as fh:  # read one byte past the bound: structured refuses what is larger
                text = fh.read(structured.MAX_SCHEMA_BYTES + 1).decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read the {kind} file {arg}: {getattr(exc, 'strerror', None) or exc}") from None
        try:
            return structured.from_grammar(text) if kind == "grammar" else structured.from_schema(text, name=path.stem)
        except structured.FormatError as exc:  # named as the CLI names its options
            raise structured.FormatError(f"Invalid value for '/set format {kind}': {exc}") from None
    raise UsageError(f"/set format takes json, schema FILE, grammar FILE or off, not {value.strip()!r}", hint=FORMAT_USAGE)


def format_label(fmt: Format | None) -> str:
    if fmt is None:
        return "off (free text)"
    if fmt.kind == "json":
        return "json (any JSON object)"
    if fmt.kind == "json_schema":
        return f"schema {fmt.name}" if fmt.name else "a JSON schema"
    return f"a grammar ({len(fmt.text.splitlines())} lines)"


def unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return text


# -- session totals --------------------------------------------------------------------------------


@dataclass
class Totals:
    """What the whole session measured (`/stats`)."""

    turns: int = 0
    interrupted: int = 0
    prompt_tokens: int = 0
    evaluated_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_tokens: int = 0  # tokens after the first of each answer (what decode_s covers)
    ttft_s: list[float] = field(default_factory=list)
    total_s: float = 0.0
    dropped_turns: int = 0

    def add(self, result: Answer) -> None:
        s = result.stats
        self.turns += 1
        self.interrupted += s.finish_reason == "interrupted"
        self.prompt_tokens += s.prompt_tokens
        self.evaluated_tokens += s.evaluated_tokens
        self.cached_tokens += s.cached_tokens
        self.completion_tokens += s.completion_tokens
        self.prefill_s += s.prefill_s
        self.decode_s += s.decode_s
        self.decode_tokens += max(0, s.completion_tokens - 1)
        if result.ttft_s is not None:
            self.ttft_s.append(result.ttft_s)
        self.total_s += result.total_s

    @property
    def decode_tps(self) -> float | None:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 and self.decode_tokens else None

    @property
    def prefill_tps(self) -> float | None:
        return self.evaluated_tokens / self.prefill_s if self.prefill_s > 0 and self.evaluated_tokens else None
