"""The load test's metrics, with vLLM's ``bench serve`` definitions and JSON keys.

Per successful request (all measured on the client, seconds):

* TTFT: request sent -> first chunk carrying text. vLLM counts the first chunk with any choice; a
  server that sends an empty role chunk ahead of the first token (llama-server sends both together)
  would make vLLM's figure smaller.
* ITL: the gaps between successive chunks carrying text (one token per chunk on llama.cpp servers).
* TPOT: (E2EL - TTFT) / (output tokens - 1), with the server's token count; 0 for goodput when there
  was one token, left out of the TPOT statistics (as vLLM).
* E2EL: request sent -> end of the stream.

Over the test: request throughput = completed / duration, output throughput = output tokens /
duration, goodput = requests meeting every SLO / duration. Token totals come from the servers'
``usage``; a server that does not report it leaves them (and the output throughput, TPOT) null.
Statistics: mean, median, standard deviation (population, as numpy's default) and linear
percentiles (numpy's default), in milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from localinfer.errors import UsageError
from localinfer.usage.stats import percentile

if TYPE_CHECKING:
    from localinfer.remote.loadtest import RequestOutput

SLO_NAMES = ("ttft", "tpot", "e2el")
DEFAULT_PERCENTILES = (99.0,)


def parse_slos(values: Sequence[str] | None) -> dict[str, float]:
    """``--slo ttft:500 --slo tpot:50`` (or ``"ttft:500,tpot:50"``, or space-separated) -> ms per name."""
    out: dict[str, float] = {}
    for value in values or ():
        for part in value.replace(",", " ").split():
            name, sep, ms = part.partition(":")
            name = name.strip().lower()
            try:
                number = float(ms)
            except ValueError:
                number = -1.0
            if not sep or name not in SLO_NAMES or not number >= 0 or math.isinf(number):
                raise UsageError(f"--slo takes NAME:MS with NAME one of {', '.join(SLO_NAMES)}, not {part!r}",
                                 hint="e.g. --slo ttft:500 --slo tpot:50 --slo e2el:2000")  # fmt: skip
            out[name] = number
    return out


def parse_percentiles(value: str | None) -> tuple[float, ...]:
    """``--percentiles 50,90,99`` (vLLM's --metric-percentiles)."""
    if not value:
        return DEFAULT_PERCENTILES
    try:
        ps = tuple(float(p) for p in value.split(",") if p.strip())
    except ValueError:
        raise UsageError(f"--percentiles takes numbers between 0 and 100, e.g. 50,90,99, not {value!r}") from None
    if not ps or any(not 0 <= p <= 100 for p in ps):
        raise UsageError(f"--percentiles takes numbers between 0 and 100, e.g. 50,90,99, not {value!r}")
    return ps


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _std(xs: Sequence[float]) -> float:
    if not xs:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def _p_word(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def _stats(name: str, seconds: Sequence[float], percentiles: Sequence[float], known: bool = True) -> dict[str, Any]:
    """mean/median/std/pN of ``seconds`` in ms under vLLM's keys (0 for no values, as vLLM; None when
    the figure cannot be known)."""
    out: dict[str, Any] = {}
    ms = [s * 1000.0 for s in seconds]
    for stat, value in (("mean", _mean(ms)), ("median", percentile(ms, 50) or 0.0), ("std", _std(ms))):
        out[f"{stat}_{name}_ms"] = value if known else None
    for p in percentiles:
        out[f"p{_p_word(p)}_{name}_ms"] = (percentile(ms, p) or 0.0) if known else None
    return out


def _tpot(o: RequestOutput) -> float | None:
    if o.output_tokens is None or o.ttft is None:
        return None
    return (o.latency - o.ttft) / (o.output_tokens - 1) if o.output_tokens > 1 else 0.0


def _good(o: RequestOutput, slos: dict[str, float]) -> bool:
    tpot = _tpot(o)
    values = {"ttft": o.ttft, "tpot": tpot, "e2el": o.latency}
    return all((v := values[k]) is not None and v * 1000.0 <= ms for k, ms in slos.items())


def compute(outputs: Sequence[RequestOutput], duration_s: float, *, percentiles: Sequence[float] = DEFAULT_PERCENTILES,
            slos: dict[str, float] | None = None) -> dict[str, Any]:  # fmt: skip
    """The result object: vLLM's keys where the metric is the same."""
    ok = [o for o in outputs if o.success]
    counts_known = bool(ok) and all(o.output_tokens is not None and o.prompt_tokens is not None for o in ok)
    total_in = sum(o.prompt_tokens or 0 for o in ok) if counts_known else None
    total_out = sum(o.output_tokens or 0 for o in ok) if counts_known else None
    dur = duration_s if duration_s > 0 else float("nan")
    tpots = [t for o in ok if (t := _tpot(o)) is not None and (o.output_tokens or 0) > 1]
    result: dict[str, Any] = {
        "duration": duration_s,
        "completed": len(ok),
        "failed": len(outputs) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / dur,
        "request_goodput": (sum(_good(o, slos) for o in ok) / dur) if slos else None,
        "output_throughput": None if total_out is None else total_out / dur,
        "total_token_throughput": None if total_out is None or total_in is None else (total_in + total_out) / dur,
        "max_concurrent_requests": _peak_concurrency(ok),
    }
    result.update(_stats("ttft", [o.ttft for o in ok if o.ttft is not None], percentiles))
    result.update(_stats("tpot", tpots, percentiles, known=counts_known or not ok))
    result.update(_stats("itl", [x for o in ok for x in o.itl], percentiles))
    result.update(_stats("e2el", [o.latency for o in ok], percentiles))
    result.update({
        "input_lens": [o.prompt_tokens for o in outputs],
        "output_lens": [o.output_tokens if o.success else 0 for o in outputs],
        "ttfts": [o.ttft if o.success else 0.0 for o in outputs],
        "itls": [o.itl for o in outputs],
        "latencies": [o.latency for o in outputs],
        "errors": [o.error or "" for o in outputs],
    })  # fmt: skip
    return result


def _peak_concurrency(ok: Sequence[RequestOutput]) -> int:
    """The most requests in flight at once (half-open intervals, a departure before an arrival)."""
    events = sorted([(o.start, 1) for o in ok] + [(o.start + o.latency, -1) for o in ok])
    peak = level = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    return peak


def server_summary(outputs: Sequence[RequestOutput], delta: dict[str, float] | None) -> dict[str, Any] | None:
    """What the server said about the same requests: the sums of its per-response ``timings``, and
    how much its ``/metrics`` counters grew (llama-server: prompt, cached and predicted tokens)."""
    timed = [o.server_timings for o in outputs if o.success and o.server_timings]
    if not timed and not delta:
        return None
    out: dict[str, Any] = {"responses_with_timings": len(timed)}
    if timed:
        def total(key: str) -> float:
            return sum(float(t.get(key) or 0.0) for t in timed)

        out.update({
            "prompt_n": int(total("prompt_n")), "cache_n": int(total("cache_n")), "predicted_n": int(total("predicted_n")),
            "mean_prompt_ms": total("prompt_ms") / len(timed),
        })  # fmt: skip
    if delta:
        out["metrics_delta"] = delta
    return out
