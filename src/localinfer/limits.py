"""How much untrusted input we read: files a user points us at (a chat to /load, a batch file or
stdin) are read up to a documented size, and JSON nested deeper than Python can parse is refused
with one line rather than a RecursionError (README, "Security")."""

from __future__ import annotations

import json
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


def loads(text: str | bytes, where: str) -> Any:
    """json.loads, with nesting too deep to parse as a ValueError like any other bad JSON."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{where} is nested too deeply to read") from None


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
