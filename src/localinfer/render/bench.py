"""`localinfer bench` results on stdout: a Rich table (default), Markdown (llama-bench's layout),
CSV, JSON or JSON lines. Rows come as plain dicts (``BenchResult.to_json``), so every format shows
the same numbers.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from localinfer.usage.cost import Pricing, format_money
from localinfer.render.term import is_tty

FORMATS = ("table", "json", "jsonl", "csv", "md")

CSV_FIELDS = (
    "model", "model_type", "quant", "model_size", "model_n_params", "backend", "n_gpu_layers", "n_threads",
    "n_ctx", "n_batch", "n_ubatch", "test", "kind", "n_prompt", "n_gen", "n_depth", "n_parallel", "reps",
    "avg_ts", "stddev_ts", "raw_avg_ts", "raw_stddev_ts", "overhead", "ttft_p50_ms", "ttft_p95_ms",
    "latency_p50_ms", "latency_p95_ms", "cost_per_million_tokens", "cost_per_request", "api_per_million_tokens",
    "model_sha256", "model_path", "samples_ts",
)  # fmt: skip


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024**2:.2f} MiB"


def _params(n: int | None) -> str:
    if not n:
        return "-"
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(n)


def _tps(mean: float | None, sd: float | None) -> str:
    if mean is None:
        return "-"
    return f"{mean:.2f} ± {sd:.2f}" if sd is not None else f"{mean:.2f}"


def columns(rows: Sequence[dict[str, Any]], pricing: Pricing | None) -> list[tuple[str, str]]:
    """(header, key) pairs; settings that nobody varied or changed from the default stay out."""

    def varied(key: str, default: Any) -> bool:
        return any(r.get(key) != default for r in rows) or len({r.get(key) for r in rows}) > 1

    cols = [("model", "model"), ("size", "_size"), ("quant", "quant"), ("params", "_params"), ("backend", "backend")]
    if varied("n_gpu_layers", 0):
        cols.append(("ngl", "n_gpu_layers"))
    cols.append(("threads", "n_threads"))
    if varied("n_batch", rows[0].get("n_batch") if rows else None):
        cols.append(("n_batch", "n_batch"))
    if any(r.get("n_parallel") for r in rows):
        cols.append(("parallel", "n_parallel"))
    cols += [("test", "test"), ("t/s", "_tps"), ("raw t/s", "_raw")]
    if any(r.get("ttft_p50_ms") is not None for r in rows):
        cols += [("TTFT p50/p95 ms", "_ttft"), ("latency p50/p95 ms", "_latency")]
    if pricing is not None and pricing.priced:
        cols += [("cost/M tok", "_cost_m"), ("cost/request", "_cost_req")]
    if pricing is not None and pricing.compares_api:
        cols.append(("API/M tok", "_api_m"))
    return cols


def _pair(a: float | None, b: float | None) -> str:
    if a is None:
        return "-"
    return f"{a:.0f} / {b:.0f}" if b is not None else f"{a:.0f}"


def cell(row: dict[str, Any], key: str) -> str:
    cost = row.get("cost") or {}
    if key == "_size":
        return _mib(row.get("model_size"))
    if key == "_params":
        return _params(row.get("model_n_params"))
    if key == "_tps":
        return _tps(row.get("avg_ts"), row.get("stddev_ts"))
    if key == "_raw":
        return _tps(row.get("raw_avg_ts"), None)
    if key == "_ttft":
        return _pair(row.get("ttft_p50_ms"), row.get("ttft_p95_ms"))
    if key == "_latency":
        return _pair(row.get("latency_p50_ms"), row.get("latency_p95_ms"))
    if key == "_cost_m":
        return format_money(cost.get("per_million_tokens"))
    if key == "_cost_req":
        return format_money(cost.get("per_request"))
    if key == "_api_m":
        return format_money(cost.get("api_per_million_tokens"))
    value = row.get(key)
    return "-" if value is None else str(value)


_NUMERIC = {"_size", "_params", "n_gpu_layers", "n_threads", "n_batch", "n_parallel", "_tps", "_raw", "_cost_m", "_cost_req", "_api_m", "_ttft", "_latency"}


def markdown(rows: Sequence[dict[str, Any]], cols: list[tuple[str, str]]) -> str:
    """llama-bench's Markdown table: numbers right-aligned."""
    table = [[cell(r, k) for _, k in cols] for r in rows]
    widths = [max(len(h), *(len(t[i]) for t in table)) if table else len(h) for i, (h, _) in enumerate(cols)]
    head = "| " + " | ".join(h.ljust(w) if k not in _NUMERIC else h.rjust(w) for (h, k), w in zip(cols, widths)) + " |"
    rule = "| " + " | ".join(("-" * (w - 1) + ":") if k in _NUMERIC else "-" * w for (_, k), w in zip(cols, widths)) + " |"
    body = [
        "| " + " | ".join(c.rjust(w) if k in _NUMERIC else c.ljust(w) for c, (_, k), w in zip(t, cols, widths)) + " |"
        for t in table
    ]
    return "\n".join([head, rule, *body])


def csv_text(rows: Sequence[dict[str, Any]], header: bool = True) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    if header:
        writer.writeheader()
    for r in rows:
        flat = dict(r)
        cost = r.get("cost") or {}
        flat["cost_per_million_tokens"] = cost.get("per_million_tokens")
        flat["cost_per_request"] = cost.get("per_request")
        flat["api_per_million_tokens"] = cost.get("api_per_million_tokens")
        flat["samples_ts"] = ";".join(str(x) for x in r.get("samples_ts") or [])
        writer.writerow(flat)
    return buf.getvalue()



# Dropped first when a terminal is too narrow for the whole table (-o md / csv / json keep them all).
NARROW_DROP = ("raw t/s", "params", "backend", "size", "quant", "threads", "n_batch", "ngl",
               "API/M tok", "cost/request", "latency p50/p95 ms")  # fmt: skip


def print_table(rows: Sequence[dict[str, Any]], cols: list[tuple[str, str]], stream: TextIO | None = None, title: str | None = None) -> None:
    """A Rich table; plain (no ANSI) when the stream is not a terminal or NO_COLOR is set.

    On a terminal too narrow for it, columns are dropped (and named under the table), never cut.
    """
    from localinfer.render.term import console as make_console
    from localinfer.render.term import fit_table, print_whole
    from rich.markup import escape
    from rich.table import Table

    stream = stream or sys.stdout
    tty = is_tty(stream)
    console = make_console(
        file=stream,
        highlight=False,
        no_color=bool(os.environ.get("NO_COLOR")) or not tty,
        force_terminal=tty and not os.environ.get("NO_COLOR"),
        width=None if tty else 400,
    )

    def build(dropped: Sequence[str]) -> Table:
        kept = [(h, k) for h, k in cols if h not in dropped]
        table = Table(title=title, title_justify="left")
        for header, key in kept:
            table.add_column(header, justify="right" if key in _NUMERIC else "left", no_wrap=True)
        for r in rows:  # escaped: a test's "[json]", "[ngram copy]" is text, not Rich markup
            table.add_row(*(escape(cell(r, k)) for _, k in kept))
        if dropped:
            table.caption = f"not shown at {console.width} columns: {', '.join(dropped)} (-o md shows all)"
            table.caption_justify = "left"
        return table

    table, _ = fit_table(console, build, NARROW_DROP)
    print_whole(console, table)


class BenchWriter:
    """Writes results in one format; the line formats (jsonl, csv, md) stream, the others wait for the end."""

    def __init__(self, fmt: str, pricing: Pricing | None, stream: TextIO | None = None) -> None:
        self.fmt = fmt
        self.pricing = pricing
        self.stream = stream or sys.stdout
        self.rows: list[dict[str, Any]] = []
        self._csv_header = True

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if self.fmt == "jsonl":
            self._out(json.dumps(row, ensure_ascii=False))
        elif self.fmt == "csv":
            self._out(csv_text([row], header=self._csv_header).rstrip("\n"))
            self._csv_header = False

    def finish(self) -> None:
        if self.fmt == "json":
            self._out(json.dumps(self.rows, indent=2, ensure_ascii=False))
        elif self.fmt == "md" and self.rows:
            self._out(markdown(self.rows, columns(self.rows, self.pricing)))
        elif self.fmt == "table" and self.rows:
            print_table(self.rows, columns(self.rows, self.pricing), self.stream)

    def _out(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()
