"""The core of `localinfer stats`: usage history rows summed and ranked per model and per day.

Plain values in (``history.UsageRecord``), plain dicts out (what ``--json`` prints and the tables
show). Percentiles interpolate linearly between the two nearest values (numpy's default).
"""

from __future__ import annotations

import datetime as dt
import math
import re
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from localinfer.errors import UsageError
from localinfer.units import json_number as _r

if TYPE_CHECKING:
    from localinfer.usage.cost import Pricing
    from localinfer.usage.history import UsageRecord

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MAX_FILLED_DAYS = 62  # a per-day chart shows empty days between the first and the last, up to this many


def parse_since(text: str | None, now: float | None = None) -> float | None:
    """``7d``, ``12h``, ``30m``, ``2w``, ``90s`` ago, or a date / date-time (``2025-01-31``, local time)."""
    if text is None or not text.strip():
        return None
    now = time.time() if now is None else now
    value = text.strip().lower()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhdw])", value)
    if m:
        return now - float(m.group(1)) * _UNITS[m.group(2)]
    if value == "today":
        day = dt.datetime.fromtimestamp(now).date()
        return dt.datetime.combine(day, dt.time()).timestamp()
    try:
        return dt.datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise UsageError(
            f"--since must be a duration (7d, 12h, 30m, 2w) or a date (2025-01-31), not {text!r}"
        ) from None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation; None for no values."""
    data = sorted(v for v in values if v is not None and not math.isnan(v))
    if not data:
        return None
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def _busy_seconds(r: UsageRecord) -> float:
    return ((r.total_ms or 0.0) + (r.load_ms or 0.0)) / 1000.0


def summarize_group(records: Sequence[UsageRecord], pricing: Pricing | None = None) -> dict[str, Any]:
    """Counts, token sums, TTFT and rate percentiles, machine time and its cost, for some records."""
    ttft = [r.ttft_ms for r in records if r.ttft_ms is not None]
    decode = [r.decode_tps for r in records if r.decode_tps is not None]
    prefill = [r.prefill_tps for r in records if r.prefill_tps is not None]
    tokens_in = sum(r.prompt_tokens for r in records)
    tokens_out = sum(r.completion_tokens for r in records)
    busy = sum(_busy_seconds(r) for r in records)
    out: dict[str, Any] = {
        "requests": len(records),
        "failed": sum(1 for r in records if r.exit_status != 0),
        "tokens_in": tokens_in,
        "tokens_in_evaluated": sum(r.prompt_eval_tokens for r in records),
        "tokens_in_cached": sum(r.cached_tokens for r in records),
        "tokens_out": tokens_out,
        "ttft_ms_p50": _r(percentile(ttft, 50)),
        "ttft_ms_p95": _r(percentile(ttft, 95)),
        "decode_tps_p50": _r(percentile(decode, 50)),
        "decode_tps_p95": _r(percentile(decode, 95)),
        "prefill_tps_p50": _r(percentile(prefill, 50)),
        "prefill_tps_p95": _r(percentile(prefill, 95)),
        "busy_s": _r(busy),
    }
    if pricing is not None and (pricing.priced or pricing.compares_api):
        total = pricing.for_seconds(busy)
        out["cost"] = {
            "total": _r(total, 9),
            "per_request": _r(total / len(records), 9) if total is not None and records else None,
            "per_million_tokens_out": _r(total * 1e6 / tokens_out, 9) if total is not None and tokens_out else None,
            "per_million_tokens": _r(total * 1e6 / (tokens_in + tokens_out), 9) if total is not None and tokens_in + tokens_out else None,
            "api_total": _r(pricing.api_cost(tokens_in, tokens_out), 9),
        }
    return out


def _group(records: Iterable[UsageRecord], key: Callable[[UsageRecord], Hashable]) -> dict[Any, list[UsageRecord]]:
    groups: dict[Any, list[UsageRecord]] = {}
    for r in records:
        groups.setdefault(key(r), []).append(r)
    return groups


def local_day(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).date().isoformat()


def _days_between(first: str, last: str) -> list[str]:
    a, b = dt.date.fromisoformat(first), dt.date.fromisoformat(last)
    n = (b - a).days
    if n < 0 or n >= MAX_FILLED_DAYS:
        return []
    return [(a + dt.timedelta(days=i)).isoformat() for i in range(n + 1)]


def summarize(
    records: Sequence[UsageRecord],
    pricing: Pricing | None = None,
    *,
    since: float | None = None,
    model: str | None = None,
    command: str | None = None,
) -> dict[str, Any]:
    """Totals, one entry per model (busiest first) and one per local day (oldest first)."""
    # a model served elsewhere (--endpoint) is its own entry: its figures are that server's, not ours
    by_model = _group(records, lambda r: (r.model or "-", r.endpoint))
    models = []
    for (name, endpoint), rows in by_model.items():
        entry = {"model": name, "endpoint": endpoint, "sha256": next((r.model_sha256 for r in reversed(rows) if r.model_sha256), None)}
        entry["commands"] = sorted({r.command for r in rows})
        entry.update(summarize_group(rows, pricing))
        models.append(entry)
    models.sort(key=lambda m: (-(m["tokens_in"] + m["tokens_out"]), m["model"], m["endpoint"] or ""))
    by_day = _group(records, lambda r: local_day(r.ts))
    day_keys = sorted(by_day)
    if day_keys:
        day_keys = _days_between(day_keys[0], day_keys[-1]) or day_keys
    days = []
    for day in day_keys:
        rows = by_day.get(day, [])
        entry = {"day": day}
        entry.update(summarize_group(rows, pricing))
        days.append(entry)
    return {
        "since": dt.datetime.fromtimestamp(since).astimezone().isoformat(timespec="seconds") if since else None,
        "model": model,
        "command": command,
        "first": dt.datetime.fromtimestamp(records[0].ts).astimezone().isoformat(timespec="seconds") if records else None,
        "last": dt.datetime.fromtimestamp(records[-1].ts).astimezone().isoformat(timespec="seconds") if records else None,
        "totals": summarize_group(records, pricing),
        "models": models,
        "days": days,
        "pricing": pricing.to_json() if pricing is not None and (pricing.priced or pricing.compares_api) else None,
    }
