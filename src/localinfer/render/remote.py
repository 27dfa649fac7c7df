"""What `run` and `chat` print on stderr for an answer from a server (--endpoint): the same lines as
for a local answer, with the server named, and "unknown" for what the server did not report."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from localinfer.render.term import styled
from localinfer.units import human_duration as _ms
from localinfer.units import human_rate

if TYPE_CHECKING:
    from localinfer.remote.results import RemoteResult

UNKNOWN = "unknown"


def _n(value: int | None) -> str:
    return UNKNOWN if value is None else str(value)


def _tps(value: float | None) -> str:
    return UNKNOWN if value is None else human_rate(value)


def _prompt(r: RemoteResult) -> str:
    o = r.outcome
    if o.prompt_tokens is None:
        return f"prompt {UNKNOWN}"
    cached = "" if o.cached_tokens is None else f", {o.cached_tokens} cached"
    return f"prompt {o.prompt_tokens} tokens{cached}"


def summary_line(r: RemoteResult) -> str:
    o = r.outcome
    return " · ".join([
        f"{r.model} @ {r.endpoint}",
        f"{_n(o.completion_tokens)} tokens",
        f"TTFT {_ms(o.ttft_s)}",
        _prompt(r),
        f"decode {_tps(o.decode_tps)}",
        f"total {_ms(o.total_s)}",
        f"finish {o.finish_reason or '-'}",
    ])  # fmt: skip


def turn_line(r: RemoteResult) -> str:
    """`chat`'s dim line after an answer."""
    o = r.outcome
    parts = [f"{_n(o.completion_tokens)} tokens", f"TTFT {_ms(o.ttft_s)}", f"decode {_tps(o.decode_tps)}", _prompt(r)]
    if o.finish_reason in ("length", "interrupted"):
        parts.append(o.finish_reason)
    return " · ".join(parts)


def rows(r: RemoteResult) -> list[tuple[str, str]]:
    """The --verbose table (and chat's /stats): client measurements, then what the server said."""
    o = r.outcome
    prefill = UNKNOWN if r.prefill_s is None else f"{_ms(r.prefill_s)} · {_tps(r.prefill_tps)} (the server's timings)"
    return [
        ("model", r.model),
        ("endpoint", r.endpoint),
        ("mode", r.mode),
        ("finish reason", o.finish_reason or "-"),
        ("TTFT", f"{_ms(o.ttft_s)} (request sent -> first text received)"),
        ("prompt tokens", _n(o.prompt_tokens) + ("" if o.cached_tokens is None else f" ({o.cached_tokens} cached)")),
        ("prefill", prefill),
        ("completion tokens", _n(o.completion_tokens)),
        ("decode", f"{_ms(o.decode_s)} · {_tps(o.decode_tps)} (tokens after the first, timed here)"),
        ("end to end", _ms(o.total_s)),
        ("seed", "-" if r.seed is None else str(r.seed)),
    ]


def print_summary(r: RemoteResult, *, verbose: bool = False, stream: TextIO | None = None) -> None:
    stream = stream or sys.stderr
    if verbose:
        table = rows(r)
        width = max(len(k) for k, _ in table)
        stream.write("".join(f"{k:<{width}}  {v}\n" for k, v in table))
    else:
        line = summary_line(r)
        stream.write(f"\x1b[2m{line}\x1b[0m\n" if styled(stream) else line + "\n")
    stream.flush()
