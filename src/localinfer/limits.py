"""How much untrusted input we read: files a user points us at (a chat to /load, a batch file or
stdin) are read up to a documented size, and JSON nested deeper than Python can parse is refused
with one line rather than a RecursionError (README, "Security")."""

from __future__ import annotations

import json
import re
from typing import IO, Any

from localinfer.errors import UsageError

CHAT_FILE_MAX_BYTES = 16 << 20  # a saved conversation: far beyond any context window's text
BATCH_INPUT_MAX_BYTES = 1 << 30  # a whole batch file or stdin
BATCH_LINE_MAX_BYTES = 4 << 20  # one request: ~1M tokens of text, beyond any context window


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


def read_limited(stream: IO[bytes], limit: int, what: str) -> bytes:
    """All of ``stream`` if it holds at most ``limit`` bytes; else a UsageError, having read only
    ``limit + 1`` (``/dev/zero`` or an endless pipe end here too)."""
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise UsageError(f"{what} is larger than {_mib(limit)}", hint="split it, or check that it is the file you meant")
    return data


class NotText(ValueError):
    """A JSON string (or key) holding a lone surrogate: ``"\\ud800"`` parses, but encodes to nothing,
    so every later write or tokenization of it would fail."""

    def __init__(self, path: str, char: str, key: bool = False) -> None:
        what = f"the key '{path}'" if key else f"'{path}'"
        super().__init__(f"{what} holds a lone surrogate (\\u{ord(char):04x}), which is not text")
        self.path = path


def loads(text: str | bytes, where: str) -> Any:
    """json.loads for untrusted input: nesting too deep to parse and an integer too long to convert
    are each a ValueError with one line, like any other bad JSON."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{where} is nested too deeply to read") from None
    except json.JSONDecodeError:
        raise
    except ValueError:  # "Exceeds the limit (4300 digits) for integer string conversion"
        from localinfer.rules import int_digits_limit

        raise ValueError(f"{where} has an integer longer than {int_digits_limit()} digits") from None


def require_text(data: Any, raw: str | bytes) -> None:
    """NotText if a string or key of ``data`` (parsed from ``raw``) holds a lone surrogate: checked
    where the whole document is echoed or written back (a serve body, a batch line)."""
    if _may_hold_surrogates(raw):
        found = lone_surrogate(data)
        if found is not None:
            raise NotText(*found)


_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_ESCAPE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _may_hold_surrogates(text: str | bytes) -> bool:
    """Valid UTF-8 holds no surrogates: only a ``\\uD800``-``\\uDFFF`` escape makes one (a pair of
    them is an emoji, which the walk then lets through). UTF-16/32 bodies are always walked."""
    if isinstance(text, bytes):
        return b"\x00" in text[:4] or _ESCAPE_BYTES.search(text) is not None
    return _ESCAPE.search(text) is not None


def lone_surrogate(data: Any) -> tuple[str, str, bool] | None:
    """(where, the surrogate, whether it is in a key) for a string or key in ``data`` holding one.
    Iterative: data nested as deep as json.loads allows is walked without recursion."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            bad = _SURROGATE.search(value)
            if bad:
                return path or "the value", bad.group(), False
        elif isinstance(value, dict):
            for key, item in value.items():
                bad = _SURROGATE.search(key)
                if bad:
                    return f"{path}.{ascii(key)[1:-1]}".lstrip("."), bad.group(), True
                stack.append((f"{path}.{key}".lstrip("."), item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in reversed(list(enumerate(value))))
    return None


def require_utf8(text: str, what: str) -> None:
    """A UsageError naming the first byte of ``text`` that is not UTF-8 (such bytes reach Python as
    surrogates: from argv, or files read with surrogateescape)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start].encode("utf-8", "surrogateescape")
        raise UsageError(
            f"{what} is not valid UTF-8 (byte 0x{bad.hex()} at character {exc.start + 1})",
            hint="pass UTF-8 text (iconv -t UTF-8 converts other encodings)",
        ) from None
