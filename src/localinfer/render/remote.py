"""What `run` and `chat` print on stderr for an answer from a server (--endpoint): the same lines as
for a local answer, with the server named, and "unknown" for what the server did not report."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from localinfer.render.term import styled
from localinfer.units import human_duration as _ms
from localinfer.units import human_rate

if TYPE_CHECKING:
    from localinfer.answer.answer import Answer

UNKNOWN = "unknown"


def _n(value: int | None) -> str:
    return UNKNOWN if value is None else str(value)


def _tps(value: float | None) -> str:
    return UNKNOWN if value is None else human_rate(value)


def _prompt(r: Answer) -> str:
    if r.prompt_tokens is None:
        return f"prompt {UNKNOWN}"
    cached = "" if r.cached_tokens is None else f", {r.cached_tokens} cached"
    return f"prompt {r.prompt_tokens} tokens{cached}"


def summary_line(r: Answer) -> str:
    return " · ".join([
        f"{r.model} @ {r.backend}",
        f"{_n(r.completion_tokens)} tokens",
        f"TTFT {_ms(r.ttft_s)}",
        _prompt(r),
        f"decode {_tps(r.decode_tps)}",
        f"total {_ms(r.total_s)}",
        f"finish {r.finish_reason or '-'}",
    ])  # fmt: skip


def turn_line(r: Answer) -> str:
    """`chat`'s dim line after an answer."""
    parts = [f"{_n(r.completion_tokens)} tokens", f"TTFT {_ms(r.ttft_s)}", f"decode {_tps(r.decode_tps)}", _prompt(r)]
    if r.finish_reason in ("length", "interrupted"):
        parts.append(r.finish_reason)
    return " · ".join(parts)


def rows(r: Answer) -> list[tuple[str, str]]:
    """The --verbose table (and chat's /stats): client measurements, then what the server said."""
    prefill = UNKNOWN if r.prefill_s is None else f"{_ms(r.prefill_s)} · {_tps(r.prefill_tps)} (the server's timings)"
    return [
        ("model", r.model),
        ("endpoint", r.backend),
        ("mode", r.mode),
        ("finish reason", r.finish_reason or "-"),
        ("TTFT", f"{_ms(r.ttft_s)} (request sent -> first text received)"),
        ("prompt tokens", _n(r.prompt_tokens) + ("" if r.cached_tokens is None else f" ({r.cached_tokens} cached)")),
        ("prefill", prefill),
        ("completion tokens", _n(r.completion_tokens)),
        ("decode", f"{_ms(r.decode_s)} · {_tps(r.decode_tps)} (tokens after the first, timed here)"),
        ("end to end", _ms(r.total_s)),
        ("seed", "-" if r.seed is None else str(r.seed)),
    ]


def print_summary(r: Answer, *, verbose: bool = False, stream: TextIO | None = None) -> None:
    stream = stream or sys.stderr
    if verbose:
        table = rows(r)
        width = max(len(k) for k, _ in table)
        stream.write("".join(f"{k:<{width}}  {v}\n" for k, v in table))
    else:
        line = summary_line(r)
        stream.write(f"\x1b[2m{line}\x1b[0m\n" if styled(stream) else line + "\n")
    stream.flush()
