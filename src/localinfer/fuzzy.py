"""One way to suggest what the user meant: model names, commands, /set keys (difflib)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def suggest(word: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """The choices closest to ``word``, case-insensitively, best first; [] when none is close."""
    by_lower: dict[str, str] = {}
    for choice in choices:
        by_lower.setdefault(choice.lower(), choice)
    found = difflib.get_close_matches(word.lower(), list(by_lower), n=n, cutoff=0.6)
    return [by_lower[f] for f in found]


def rank(word: str, choices: Iterable[str]) -> list[str]:
    """All of ``choices``, closest to ``word`` first (ties in their given order)."""
    key = word.lower()
    return sorted(choices, key=lambda c: -difflib.SequenceMatcher(None, key, c.lower()).ratio())


def did_you_mean(word: str, choices: Iterable[str], prefix: str = "") -> str | None:
    """'did you mean X, Y?' or None."""
    close = suggest(word, choices)
    return f"did you mean {', '.join(prefix + c for c in close)}?" if close else None
