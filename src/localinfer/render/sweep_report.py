"""The report of `bench --endpoint --sweep`: one self-contained HTML file (inline SVG and CSS, no
script, nothing fetched) with latency percentiles and throughput against the request rate."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

_W, _H = 560, 300  # one chart
_PAD_L, _PAD_R, _PAD_T, _PAD_B = 64, 20, 52, 48
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd")
Series = tuple[str, str, list[tuple[float, float | None]]]  # name, colour, (x, y) points


def _nice_step(span: float, n: int = 5) -> float:
    raw = span / max(n, 1)
    if raw <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)


def _fmt(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 100 or v == int(v) else f"{v:.3g}"


def x_positions(rates: Sequence[float]) -> tuple[list[float], list[tuple[float, str]], float]:
    """Where each rate goes on the x axis, the ticks, and the axis end. An infinite rate sits past
    the largest finite one (a broken axis, labelled "inf")."""
    finite = [r for r in rates if r != math.inf]
    top = max(finite) if finite else 1.0
    inf_at = top * 1.25 if finite else 1.0
    xs = [inf_at if r == math.inf else r for r in rates]
    step = _nice_step(top)
    ticks = [(i * step, _fmt(i * step)) for i in range(int(top / step) + 1)] if finite else []
    if math.inf in rates:
        ticks.append((inf_at, "inf"))
    return xs, ticks, max(xs) * 1.05 if xs else 1.0


def line_chart(title: str, y_label: str, series: Sequence[Series], x_ticks: Sequence[tuple[float, str]], x_end: float) -> str:
    """An SVG line chart (y from 0), with a legend; points without a value are skipped."""
    ys = [y for _, _, pts in series for _, y in pts if y is not None]
    y_top = max(ys) if ys else 1.0
    step = _nice_step(y_top or 1.0)
    y_end = step * math.ceil((y_top or 1.0) / step)
    pw, ph = _W - _PAD_L - _PAD_R, _H - _PAD_T - _PAD_B

    def sx(x: float) -> float:
        return _PAD_L + pw * x / x_end

    def sy(y: float) -> float:
        return _PAD_T + ph * (1 - y / y_end)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" role="img">',
           f'<title>{html.escape(title)}</title>',
           f'<text x="{_PAD_L}" y="18" class="t">{html.escape(title)}</text>']  # fmt: skip
    for i in range(round(y_end / step) + 1):
        y = i * step
        out.append(f'<line x1="{_PAD_L}" x2="{_W - _PAD_R}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" class="g"/>')
        out.append(f'<text x="{_PAD_L - 6}" y="{sy(y) + 4:.1f}" class="yl">{_fmt(y)}</text>')
    for x, label in x_ticks:
        out.append(f'<line x1="{sx(x):.1f}" x2="{sx(x):.1f}" y1="{_PAD_T + ph}" y2="{_PAD_T + ph + 5}" class="a"/>')
        out.append(f'<text x="{sx(x):.1f}" y="{_PAD_T + ph + 18}" class="xl">{html.escape(label)}</text>')
    out.append(f'<line x1="{_PAD_L}" x2="{_W - _PAD_R}" y1="{_PAD_T + ph}" y2="{_PAD_T + ph}" class="a"/>')
    out.append(f'<line x1="{_PAD_L}" x2="{_PAD_L}" y1="{_PAD_T}" y2="{_PAD_T + ph}" class="a"/>')
    out.append(f'<text x="{_PAD_L + pw / 2:.0f}" y="{_H - 8}" class="xl">request rate (req/s)</text>')
    out.append(f'<text x="14" y="{_PAD_T + ph / 2:.0f}" class="xl" transform="rotate(-90 14 {_PAD_T + ph / 2:.0f})">{html.escape(y_label)}</text>')
    for k, (name, color, pts) in enumerate(series):
        drawn = [(sx(x), sy(y)) for x, y in pts if y is not None]
        if len(drawn) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in drawn)
            out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}"/>' for x, y in drawn]
        lx = _PAD_L + 10 + k * 130
        out.append(f'<rect x="{lx}" y="{_PAD_T - 20}" width="12" height="3" fill="{color}"/>')
        out.append(f'<text x="{lx + 16}" y="{_PAD_T - 15}" class="lg">{html.escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _rate(r: dict[str, Any]) -> float:
    return math.inf if r["request_rate"] == "inf" else float(r["request_rate"])


def _series(results: Sequence[dict[str, Any]], xs: list[float], keys: Sequence[tuple[str, str]]) -> list[Series]:
    return [(label, _COLORS[i % len(_COLORS)], [(x, r.get(key)) for x, r in zip(xs, results)]) for i, (label, key) in enumerate(keys)]


def render(results: Sequence[dict[str, Any]], percentiles: Sequence[float]) -> str:
    """The whole HTML page for a sweep (``results``: one result object per rate)."""
    results = sorted(results, key=_rate)
    xs, ticks, x_end = x_positions([_rate(r) for r in results])
    p = max(percentiles) if percentiles else 99.0
    pw = str(int(p)) if int(p) == p else str(p)
    charts = []
    for name, key in (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"), ("E2EL", "e2el")):
        s = _series(results, xs, [("median", f"median_{key}_ms"), (f"p{pw}", f"p{pw}_{key}_ms"), ("mean", f"mean_{key}_ms")])
        charts.append(line_chart(f"{name} (ms)", "ms", s, ticks, x_end))
    charts.append(line_chart("Request throughput (req/s)", "req/s",
                             _series(results, xs, [("achieved", "request_throughput"), ("goodput", "request_goodput")]), ticks, x_end))  # fmt: skip
    charts.append(line_chart("Output token throughput (tok/s)", "tok/s",
                             _series(results, xs, [("output", "output_throughput"), ("total", "total_token_throughput")]), ticks, x_end))  # fmt: skip
    first = results[0] if results else {}
    head = (f"{first.get('model_id', '?')} @ {first.get('base_url', '?')} · {first.get('num_prompts', '?')} requests per rate · "
            f"{first.get('dataset', '')} · burstiness {first.get('burstiness', 1)} · max concurrency {first.get('max_concurrency') or 'none'}")  # fmt: skip
    if first.get("slos_ms"):
        head += " · SLOs " + ", ".join(f"{k} ≤ {v:g} ms" for k, v in first["slos_ms"].items())
    return _PAGE.format(head=html.escape(head), date=html.escape(str(first.get("date", ""))),
                        charts="\n".join(f'<div class="c">{c}</div>' for c in charts), table=_table(results, pw))  # fmt: skip


def _table(results: Sequence[dict[str, Any]], pw: str) -> str:
    cols = [("rate", "request_rate"), ("done", "completed"), ("failed", "failed"), ("req/s", "request_throughput"),
            ("goodput", "request_goodput"), ("out tok/s", "output_throughput"), ("TTFT p50", "median_ttft_ms"),
            (f"TTFT p{pw}", f"p{pw}_ttft_ms"), ("TPOT p50", "median_tpot_ms"), (f"TPOT p{pw}", f"p{pw}_tpot_ms"),
            ("ITL p50", "median_itl_ms"), ("E2EL p50", "median_e2el_ms"), (f"E2EL p{pw}", f"p{pw}_e2el_ms")]  # fmt: skip

    def cell(v: Any) -> str:
        if v is None:
            return "unknown"
        return html.escape(v if isinstance(v, str) else (str(v) if isinstance(v, int) else f"{v:.2f}"))

    head = "".join(f"<th>{html.escape(c)}</th>" for c, _ in cols)
    rows = "".join("<tr>" + "".join(f"<td>{cell(r.get(k))}</td>" for _, k in cols) + "</tr>" for r in results)
    return f"<table><tr>{head}</tr>{rows}</table>"


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>localinfer load test</title>
<style>
body{{font:14px system-ui,sans-serif;margin:24px;color:#222}} h1{{font-size:20px;margin:0 0 4px}}
.s{{color:#555;margin-bottom:16px}} .cs{{display:flex;flex-wrap:wrap;gap:12px}}
.c{{border:1px solid #ddd;border-radius:4px;background:#fff}}
svg text{{font:12px system-ui,sans-serif;fill:#333}} svg .t{{font-weight:600;font-size:13px}}
svg .yl{{text-anchor:end}} svg .xl{{text-anchor:middle}} svg .g{{stroke:#eee}} svg .a{{stroke:#888}}
table{{border-collapse:collapse;margin-top:16px}} td,th{{border:1px solid #ddd;padding:3px 8px;text-align:right}}
th{{background:#f4f4f4}}
</style></head><body>
<h1>Load test: latency and throughput against request rate</h1>
<div class="s">{head}<br>{date} · times in ms, measured on the client (vLLM's definitions); "unknown": the server did not report it</div>
<div class="cs">
{charts}
</div>
{table}
</body></html>
"""
