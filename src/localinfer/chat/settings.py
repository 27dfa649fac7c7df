"""Chat settings (`/set KEY VALUE`, parsed and validated) and the session's running totals (`/stats`).

Plain values, no heavy imports: the CLI and tests use them without loading anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from localinfer.engine.types import SamplingOptions
from localinfer.errors import UsageError

if TYPE_CHECKING:
    from localinfer.generate import Result

# -- settings --------------------------------------------------------------------------------------


def _float(lo: float, hi: float | None = None) -> Callable[[str], float]:
    def parse(text: str) -> float:
        v = float(text)
        if v != v or v < lo or (hi is not None and v > hi):
            raise ValueError
        return v

    parse.__doc__ = f"a number ≥ {lo:g}" + (f" and ≤ {hi:g}" if hi is not None else "")
    return parse


def _int(lo: int, hi: int | None = None, *, none_words: tuple[str, ...] = ()) -> Callable[[str], int | None]:
    def parse(text: str) -> int | None:
        if text.lower() in none_words:
            return None
        v = int(text)
        if v < lo or (hi is not None and v > hi):
            raise ValueError
        return v

    parse.__doc__ = f"a whole number ≥ {lo}" + (f" and ≤ {hi}" if hi is not None else "")
    if none_words:
        parse.__doc__ += f", or {none_words[0]}"
    return parse


# key -> (parser, where the value lives: "sampling" or "chat")
_KEYS: dict[str, tuple[Callable[[str], Any], str]] = {
    "temperature": (_float(0.0), "sampling"),
    "top_p": (_float(0.0, 1.0), "sampling"),
    "top_k": (_int(0), "sampling"),
    "min_p": (_float(0.0, 1.0), "sampling"),
    "repeat_penalty": (_float(0.0), "sampling"),
    "repeat_last_n": (_int(-1), "sampling"),
    "seed": (_int(0, 2**32 - 2, none_words=("random", "none")), "sampling"),
    "max_tokens": (_int(1, none_words=("none", "unlimited")), "chat"),
}
_ALIASES = {"temp": "temperature", "n": "max_tokens", "num_predict": "max_tokens", "repeat_n": "repeat_last_n"}
SETTING_KEYS: tuple[str, ...] = (*_KEYS, "stop")


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

    def with_value(self, key: str, value: str) -> ChatSettings:
        """A copy with ``key`` set from the text ``value``; UsageError naming the valid values."""
        name = canonical_key(key)
        value = value.strip()
        if name == "stop":
            if value.lower() in ("", "none"):
                return replace(self, stop=())
            return replace(self, stop=(*self.stop, unquote(value)))
        if name not in _KEYS:
            from localinfer.fuzzy import did_you_mean

            raise UsageError(
                f"unknown setting {key!r}", hint=did_you_mean(name, SETTING_KEYS) or f"settings: {', '.join(SETTING_KEYS)}"
            )
        parse, where = _KEYS[name]
        if not value:
            raise UsageError(f"/set {name} needs a value ({parse.__doc__})")
        try:
            parsed = parse(value)
        except ValueError:
            raise UsageError(f"{name} must be {parse.__doc__}, not {value!r}") from None
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
        ]


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

    def add(self, result: Result) -> None:
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
