"""Embeddings as plain values, and the core of `localinfer embed`: inputs from text lines or JSONL,
one output record per input in input order (``id``, ``embedding``, ``tokens``; an ``error`` record
for a line that is not an input or an input that does not fit). No llama_cpp here: a backend
(``Backend.embeddings``: the engine here, or a server's /v1/embeddings) computes the vectors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from localinfer.answer.finite import dumps as finite_dumps  # NaN/Infinity as null: JSON has neither
from localinfer.request.limits import BATCH_LINE_MAX_BYTES, NotText, loads, require_text

CHUNK = 256  # inputs handed to a backend at once: progress and output come per chunk


@dataclass(frozen=True)
class Embedding:
    """One input's vector (``tokens``: what was embedded, None where a server does not say), or why
    it has none (``error``; ``exc`` the exception, for the API to raise)."""

    vector: list[float] | None
    tokens: int | None = None
    truncated: int = 0  # tokens cut off the end (truncate)
    error: str | None = None
    exc: BaseException | None = None


@dataclass(frozen=True)
class EmbedItem:
    """One input line: ``text``, or ``error`` where the line is not an input."""

    id: Any
    line: int
    text: str | None = None
    error: str | None = None


def parse_lines(data: bytes, fmt: str = "auto") -> list[EmbedItem]:
    """Every non-blank line: plain text (the id is the line number) or JSONL (``{"id", "text"}`` or
    ``{"id", "input"}``); ``fmt``: auto (a first line starting with ``{`` is JSONL), text or jsonl."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    lines = [(n, raw.rstrip(b"\r")) for n, raw in enumerate(data.split(b"\n"), start=1)]
    lines = [(n, raw) for n, raw in lines if raw.strip()]
    if fmt == "auto":
        fmt = "jsonl" if lines and lines[0][1].lstrip().startswith(b"{") else "text"
    items = []
    for number, raw in lines:
        if len(raw) > BATCH_LINE_MAX_BYTES:
            items.append(EmbedItem(number, number, error=f"the line is {len(raw):,} bytes; an input may take {BATCH_LINE_MAX_BYTES:,}"))
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            items.append(EmbedItem(number, number, error=f"not valid UTF-8 (byte {exc.start + 1})"))
            continue
        items.append(EmbedItem(number, number, text=line) if fmt == "text" else _json_line(line, number))
    return items


def _json_line(line: str, number: int) -> EmbedItem:
    try:
        obj = loads(line, "the line")
    except ValueError as exc:
        return EmbedItem(number, number, error=f"not valid JSON: {getattr(exc, 'msg', exc)}")
    if not isinstance(obj, dict):
        return EmbedItem(number, number, error="a line must be a JSON object with 'text' (or 'input')")
    rid = obj.get("id", number)
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        return EmbedItem(number, number, error="'id' must be a string or an integer")
    unknown = sorted(set(obj) - {"id", "text", "input"})
    if unknown:
        return EmbedItem(rid, number, error=f"unknown field {', '.join(map(repr, unknown))} (allowed: id, text, input)")
    given = [k for k in ("text", "input") if k in obj]
    if len(given) != 1:
        return EmbedItem(rid, number, error="a line needs exactly one of 'text' or 'input'")
    text = obj[given[0]]
    if not isinstance(text, str):
        return EmbedItem(rid, number, error=f"'{given[0]}' must be a string")
    try:
        require_text(text, line)
    except NotText as exc:
        return EmbedItem(rid, number, error=str(exc))
    if not text:
        return EmbedItem(rid, number, error=f"'{given[0]}' is empty: nothing to embed")
    return EmbedItem(rid, number, text=text)


class Embeds(Protocol):
    """What ``run`` needs of a backend (``localinfer.backends.Backend``, which imports this module)."""

    def embeddings(self, inputs: Sequence[str], **options: Any) -> list[Embedding]: ...


@dataclass
class EmbedSummary:
    inputs: int = 0
    embedded: int = 0
    errors: int = 0
    tokens: int = 0


def run(
    items: Sequence[EmbedItem],
    backend: Embeds,
    write: Callable[[dict[str, Any]], None],
    *,
    normalize: bool = True,
    pooling: str | None = None,
    truncate: bool = False,
    n_ctx: int | None = None,
    on_done: Callable[[int], None] | None = None,
) -> EmbedSummary:
    """Embed ``items`` ``CHUNK`` at a time and ``write`` one record per item, in input order."""
    summary = EmbedSummary(inputs=len(items))
    for start in range(0, len(items), CHUNK):
        chunk = items[start : start + CHUNK]
        good = [i for i in chunk if i.error is None]
        texts = [cast(str, i.text) for i in good]  # an item with no error has its text
        results = iter(backend.embeddings(texts, normalize=normalize, pooling=pooling,
                                          truncate=truncate, n_ctx=n_ctx, on_done=on_done))  # fmt: skip
        for item in chunk:
            if item.error is not None:
                summary.errors += 1
                write({"id": item.id, "line": item.line, "error": item.error})
                if on_done is not None:
                    on_done(1)
                continue
            e = next(results)
            if e.error is not None:
                summary.errors += 1
                write({"id": item.id, "line": item.line, "error": e.error})
                continue
            summary.embedded += 1
            summary.tokens += e.tokens or 0
            record: dict[str, Any] = {"id": item.id, "embedding": e.vector, "tokens": e.tokens}
            if e.truncated:
                record["truncated_tokens"] = e.truncated
            write(record)
    return summary


def dumps(record: dict[str, Any]) -> str:
    """One output line (floats as Python writes them: the shortest text that reads back the same)."""
    return finite_dumps(record, ensure_ascii=False, separators=(",", ":"))
