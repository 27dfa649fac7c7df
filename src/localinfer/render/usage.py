"""`localinfer stats` on stdout: per-model and per-day tables, with small bar charts (tokens per
day, median decode tok/s per model). Rich on a terminal; the same tables without ANSI otherwise.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from localinfer.usage.cost import format_money
from localinfer.render.term import is_tty

if TYPE_CHECKING:
    from rich.table import Table

_BLOCKS = " ▏▎▍▌▋▊▉█"
BAR_WIDTH = 30
# Dropped first when a terminal is too narrow for the table (`stats --json` has everything).
MODEL_DROP = ("API cost", "cost/M out", "prefill tok/s p50", "failed", "TTFT ms", "TTFT p50 / p95 ms", "tok/s",
              "decode tok/s p50 / p95")  # fmt: skip
DAY_DROP = ("", "TTFT ms", "TTFT p50 ms", "tok/s", "decode tok/s p50")


def bar(value: float | None, top: float, width: int = BAR_WIDTH) -> str:
    """A horizontal bar in eighths of a character, ``value / top`` of ``width``."""
    if not value or top <= 0:
        return ""
    eighths = round(max(0.0, min(1.0, value / top)) * width * 8)
    full, part = divmod(eighths, 8)
    return "█" * full + (_BLOCKS[part] if part else "") or "▏"


def count(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def _num(x: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if x is None else fmt.format(x)


def _pair(a: float | None, b: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if a is None else f"{fmt.format(a)} / {_num(b, fmt)}"


def model_label(entry: dict[str, Any]) -> str:
    """A model run here by its name; one on a server (--endpoint) with the server's URL."""
    return f"{entry['model']} @ {entry['endpoint']}" if entry.get("endpoint") else entry["model"]


def _console(stream: TextIO):
    from localinfer.render.term import console

    tty = is_tty(stream)
    no_color = bool(os.environ.get("NO_COLOR")) or not tty
    return console(file=stream, highlight=False, no_color=no_color, force_terminal=tty and not no_color, width=None if tty else 200)


def _box(tty: bool, compact: bool) -> Any:
    from rich import box

    if not tty:
        return None  # plain text for pipes and files
    return box.SIMPLE_HEAD if compact else box.HEAVY_HEAD


def print_stats(summary: dict[str, Any], stream: TextIO | None = None) -> None:
    from rich.table import Table  # the runtime import of the name typed above

    stream = stream or sys.stdout
    console = _console(stream)
    totals = summary["totals"]
    span = f"since {summary['since']}" if summary.get("since") else "all time"
    filters = "".join(f", {k} {summary[k]}" for k in ("model", "command") if summary.get(k))
    if not totals["requests"]:
        console.print(f"No requests recorded ({span}{filters}).", markup=False)
        return
    console.print(
        f"{totals['requests']} requests ({totals['failed']} failed), {count(totals['tokens_in'])} tokens in, "
        f"{count(totals['tokens_out'])} tokens out - {span}{filters}",
        markup=False,
    )
    priced = "cost" in totals and totals["cost"].get("total") is not None
    api = "cost" in totals and totals["cost"].get("api_total") is not None

    # At 80 columns the full table does not fit: fewer, shorter columns (p50s only, failures beside
    # the requests); still too wide (long names, a server's URL), columns are dropped, never cut.
    # Not a terminal: plain text, no box drawing.
    from localinfer.render.term import fit_table, print_whole

    tty = is_tty(stream)
    compact = console.width < 120
    box = _box(tty, compact)
    names = [model_label(m) for m in summary["models"]]
    headers = (
        ("reqs", "failed", "in", "out", "TTFT ms", "tok/s") if compact
        else ("requests", "failed", "tokens in", "tokens out", "TTFT p50 / p95 ms", "decode tok/s p50 / p95", "prefill tok/s p50")
    )  # fmt: skip
    rows = []
    for name, m in zip(names, summary["models"]):
        if compact:
            row = [name, str(m["requests"]), str(m["failed"]), count(m["tokens_in"]), count(m["tokens_out"]),
                   _num(m["ttft_ms_p50"]), _num(m["decode_tps_p50"], "{:.1f}")]  # fmt: skip
        else:
            row = [
                name, str(m["requests"]), str(m["failed"]), count(m["tokens_in"]), count(m["tokens_out"]),
                _pair(m["ttft_ms_p50"], m["ttft_ms_p95"]), _pair(m["decode_tps_p50"], m["decode_tps_p95"], "{:.1f}"),
                _num(m["prefill_tps_p50"], "{:.1f}"),
            ]
        if priced:
            row.append(format_money(m["cost"]["total"]))
            if not compact:
                row.append(format_money(m["cost"]["per_million_tokens_out"]))
        if api:
            row.append(format_money(m["cost"]["api_total"]))
        rows.append(row)
    all_headers = ("model", *headers, *(("cost",) if priced else ()), *(("cost/M out",) if priced and not compact else ()),
                   *(("API cost",) if api else ()))  # fmt: skip

    def per_model(dropped: Sequence[str]) -> Table:
        table = Table(title="Per model", title_justify="left", box=box, pad_edge=False)
        keep = [i for i, h in enumerate(all_headers) if h not in dropped]
        for i in keep:
            table.add_column(all_headers[i], justify="left" if i == 0 else "right", no_wrap=True)
        for row in rows:
            table.add_row(*(row[i] for i in keep))
        return table

    print_whole(console, fit_table(console, per_model, MODEL_DROP)[0])

    days = summary["days"]
    top = max((d["tokens_in"] + d["tokens_out"]) for d in days) if days else 0
    day_headers = ("day", "reqs", "in", "out", "TTFT ms", "tok/s", "") if compact else (
        "day", "requests", "tokens in", "tokens out", "TTFT p50 ms", "decode tok/s p50", "")

    def per_day(dropped: Sequence[str]) -> Table:
        table = Table(title="Tokens per day (in + out)", title_justify="left", box=box, pad_edge=False)
        keep = [i for i, h in enumerate(day_headers) if h not in dropped]
        for i in keep:
            table.add_column(day_headers[i], justify="left" if day_headers[i] in ("day", "") else "right", no_wrap=True)
        for d in days:
            cells = (d["day"], str(d["requests"]), count(d["tokens_in"]), count(d["tokens_out"]),
                     _num(d["ttft_ms_p50"]), _num(d["decode_tps_p50"], "{:.1f}"),
                     bar(d["tokens_in"] + d["tokens_out"], top, BAR_WIDTH // 2 if compact else BAR_WIDTH))  # fmt: skip
            table.add_row(*(cells[i] for i in keep))
        return table

    print_whole(console, fit_table(console, per_day, DAY_DROP)[0])

    rated = [m for m in summary["models"] if m["decode_tps_p50"] is not None]
    if rated:
        fastest = max(m["decode_tps_p50"] for m in rated)
        labels = [(model_label(m), f"{m['decode_tps_p50']:.1f}", m["decode_tps_p50"]) for m in rated]
        # the bars take what the names and figures leave (the names and figures are never cut)
        room = console.width - max(len(n) for n, _, _ in labels) - max(len(v) for _, v, _ in labels) - 6
        chart = Table(title="Decode tok/s per model (median)", title_justify="left", show_header=False, box=None)
        chart.add_column(no_wrap=True)
        chart.add_column(justify="right", no_wrap=True)
        if room >= 5:
            chart.add_column(no_wrap=True)
        for name, value, tps in sorted(labels, key=lambda x: -x[2]):
            chart.add_row(name, value, *((bar(tps, fastest, min(BAR_WIDTH, room)),) if room >= 5 else ()))
        print_whole(console, chart)
