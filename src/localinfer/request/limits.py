"""How much untrusted input we read: files a user points us at (a chat to /load, a batch file or
stdin) are read up to a documented size, and JSON nested deeper than Python can parse is refused
with one line rather than a RecursionError (docs/security.md)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import IO, Any

from localinfer.errors import UsageError

CHAT_FILE_MAX_BYTES = 16 << 20  # a saved conversation: far beyond any context window's text
BATCH_INPUT_MAX_BYTES = 1 << 30  # a whole batch file or stdin
BATCH_LINE_MAX_BYTES = 4 << 20  # one request: ~1M tokens of text, beyond any context window
CHAT_LINE_MAX_BYTES = BATCH_LINE_MAX_BYTES  # one piped chat turn
# Piped text is read up to this many bytes per token of the context: real text is 3 to 6 (code and
# CJK included), so more than that cannot fit, and is refused before it is all read and tokenized.
PIPED_BYTES_PER_TOKEN = 32
PIPED_DEFAULT_CTX = 4096  # the context when --ctx-size is not given (DEFAULT_CTX_CEILING)
PIPED_REMOTE_MAX_BYTES = 32 << 20  # to a server (--endpoint), whose context we do not know
_CHUNK = 1 << 20


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n / 1024:g} KiB"


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
        from localinfer.request.rules import int_digits_limit

        raise ValueError(f"{where} has an integer longer than {int_digits_limit()} digits") from None


def non_finite(data: Any, at: str = "") -> Iterator[tuple[str, float]]:
    """Each NaN or infinite number in ``data`` (Python's json reads ``NaN``, ``Infinity`` and
    ``1e999``; JSON has no such numbers) and where it is (``options.temperature``)."""
    if isinstance(data, float):
        if not math.isfinite(data):
            yield at, data
        return
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        if isinstance(value, (dict, list, float)):
            yield from non_finite(value, f"{at}[{key}]" if isinstance(key, int) else f"{at}.{key}" if at else str(key))


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


def piped_limit(n_ctx: int | None) -> int:
    """The most bytes of piped text worth reading for a context of ``n_ctx`` tokens."""
    return (n_ctx or PIPED_DEFAULT_CTX) * PIPED_BYTES_PER_TOKEN


def _not_utf8(what: str, offset: int, byte: int) -> UsageError:
    return UsageError(
        f"{what} is not valid UTF-8 (byte 0x{byte:02x} at byte offset {offset})",
        hint="pass UTF-8 text (iconv -t UTF-8 converts other encodings)",
    )


def read_text(
    stream: IO[bytes], limit: int, what: str, *, keep_tail: bool = False, why: str = "", too_big: type[Exception] = UsageError
) -> str:
    """The UTF-8 text of ``stream``, read in chunks and checked as it comes (a UsageError names the
    first bad byte's offset). Beyond ``limit`` bytes: ``too_big`` having read ``limit + 1``, or with
    ``keep_tail``, the last ``limit`` bytes of it all (read to the end, never more than ``limit``
    held). ``why`` says where the limit comes from, for the message."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    tail: list[bytes] = []
    held = seen = 0
    while True:
        chunk = stream.read(_CHUNK if keep_tail else min(_CHUNK, limit + 1 - held))
        if not chunk:
            break
        pending = len(decoder.getstate()[0])
        try:
            decoder.decode(chunk)
        except UnicodeDecodeError as exc:
            data = exc.object
            raise _not_utf8(what, seen - pending + exc.start, data[exc.start]) from None
        seen += len(chunk)
        tail.append(chunk)
        held += len(chunk)
        if held > limit and not keep_tail:
            raise too_big(
                f"{what} is larger than {_mib(limit)}{why}; not reading the rest",
                hint="shorten it, give a larger --ctx-size, or --on-overflow truncate to keep its end",
            )
        while keep_tail and held - len(tail[0]) >= limit:
            held -= len(tail.pop(0))
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise _not_utf8(what, seen - len(decoder.getstate()[0]), decoder.getstate()[0][0]) from None
    data = b"".join(tail)[-limit:] if keep_tail else b"".join(tail)
    if keep_tail and seen > limit:  # the cut may fall inside a character: start at the next one
        while data and 0x80 <= data[0] < 0xC0:
            data = data[1:]
    return data.decode("utf-8")


def utf8_lines(stream: IO[bytes], what: str, max_bytes: int = CHAT_LINE_MAX_BYTES) -> Iterator[str]:
    """The lines of ``stream`` (newline kept), each checked as UTF-8 and bounded, read as they come:
    a bad or overlong line is a UsageError naming it."""
    number = 0
    while True:
        line = stream.readline(max_bytes + 1)
        if not line:
            return
        number += 1
        if len(line) > max_bytes and not line.endswith(b"\n"):
            raise UsageError(
                f"line {number} of {what} is longer than {_mib(max_bytes)}; not reading the rest",
                hint="split it, or check that it is the input you meant",
            )
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _not_utf8(f"line {number} of {what}", exc.start, line[exc.start]) from None
