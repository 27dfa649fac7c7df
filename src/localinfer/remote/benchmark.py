"""The load test as `bench --endpoint` runs it: check the server with one request, then send the
traffic at each request rate, and return vLLM-shaped result objects (plus what the server said)."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localinfer.errors import UsageError

if TYPE_CHECKING:
    from localinfer.remote.client import Client
    from localinfer.remote.loadtest import Sample

Say = Callable[[str], None]


@dataclass(frozen=True)
class LoadSpec:
    """What traffic to send (the flags of `bench --endpoint`)."""

    rates: tuple[float, ...] = (math.inf,)  # one level, or a --sweep
    requests: int = 100
    burstiness: float = 1.0
    max_concurrency: int | None = None
    input_len: int = 256
    output_len: int = 64
    dataset: Path | None = None
    seed: int = 0
    percentiles: tuple[float, ...] = (99.0,)
    slos: dict[str, float] = field(default_factory=dict)


def parse_rate(text: str) -> float:
    """A request rate: a positive number, or inf (every request at once)."""
    value = text.strip().lower()
    if value in ("inf", "infinity", "max"):
        return math.inf
    try:
        rate = float(value)
    except ValueError:
        rate = -1.0
    if not rate > 0 or math.isnan(rate):
        raise UsageError(f"a request rate is a number of requests per second above 0, or inf; not {text!r}")
    return rate


def parse_rates(rate: str | None, sweep: str | None) -> tuple[float, ...]:
    if sweep:
        rates = tuple(parse_rate(r) for r in sweep.split(",") if r.strip())
        if not rates:
            raise UsageError("--sweep takes request rates separated by commas, e.g. 1,2,4,inf")
        if rate is not None:
            raise UsageError("give either --rate or --sweep, not both")
        return rates
    return (parse_rate(rate or "inf"),)


def samples(spec: LoadSpec) -> list[Sample]:
    from localinfer.remote import loadtest

    if spec.dataset is not None:
        return loadtest.dataset_samples(spec.dataset, spec.requests, spec.output_len, spec.seed)
    return loadtest.random_samples(spec.requests, spec.input_len, spec.output_len, spec.seed)


def probe(client: Client, model: str, sample: Sample, say: Say) -> bool:
    """One untimed request, as vLLM's initial test run: the server answers, and takes ``ignore_eos``
    (llama-server does; a server that refuses it gets requests without it). Whether to send it."""
    from localinfer.remote.loadtest import body_for

    try:
        outcome = client.stream(body_for(model, sample, ignore_eos=True, temperature=0.0))
        ignore_eos = True
    except UsageError as exc:  # 400: most likely the unknown field
        outcome = client.stream(body_for(model, sample, ignore_eos=False, temperature=0.0))
        say(f"the server refused ignore_eos ({exc}): answers may end before --output-len")
        ignore_eos = False
    if outcome.completion_tokens is None:
        say("the server reports no token usage: token totals, TPOT and output throughput will be unknown")
    return ignore_eos


def run_level(client: Client, model: str, spec: LoadSpec, rate: float, items: Sequence[Sample], *,
              ignore_eos: bool, progress: Any = None) -> dict[str, Any]:  # fmt: skip
    """Send the traffic at one rate; the result object (vLLM's keys, then ours)."""
    from localinfer.remote import loadtest, metrics

    bodies = [loadtest.body_for(model, s, ignore_eos=ignore_eos, temperature=0.0) for s in items]
    offsets = loadtest.arrival_offsets(len(bodies), rate, spec.burstiness, spec.seed)
    before = loadtest.scrape_metrics(client.ep)
    outputs, duration = loadtest.drive(client.ep, bodies, offsets, spec.max_concurrency, progress)
    after = loadtest.scrape_metrics(client.ep) if before is not None else None
    result: dict[str, Any] = {
        "date": dt.datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "openai-chat",
        "backend": "openai-chat",
        "label": "localinfer",
        "model_id": model,
        "base_url": client.ep.display,
        "num_prompts": len(bodies),
        "request_rate": "inf" if rate == math.inf else rate,
        "burstiness": spec.burstiness,
        "max_concurrency": spec.max_concurrency,
        "ignore_eos": ignore_eos,
        "dataset": str(spec.dataset) if spec.dataset else f"random words: {spec.input_len} in, {spec.output_len} out",
    }
    result.update(metrics.compute(outputs, duration, percentiles=spec.percentiles, slos=spec.slos or None))
    if spec.slos:
        result["slos_ms"] = dict(spec.slos)
    result["server"] = metrics.server_summary(outputs, loadtest.metrics_delta(before, after))
    return result


def history_record(result: dict[str, Any], model: str, endpoint: str) -> Any:
    """One usage-history row per rate level (command ``bench``, with the endpoint)."""
    from localinfer.usage.history import UsageRecord

    keys = ("request_rate", "num_prompts", "completed", "failed", "request_throughput", "output_throughput",
            "median_ttft_ms", "median_tpot_ms", "max_concurrency", "burstiness")  # fmt: skip
    tpot = result.get("mean_tpot_ms")
    return UsageRecord(
        command="bench", model=model, endpoint=endpoint,
        prompt_tokens=result["total_input_tokens"] or 0, prompt_eval_tokens=result["total_input_tokens"] or 0,
        completion_tokens=result["total_output_tokens"] or 0, ttft_ms=result["median_ttft_ms"] if result["completed"] else None,
        decode_tps=1000.0 / tpot if tpot else None, total_ms=result["duration"] * 1000.0,
        finish_reason="length", exit_status=0 if result["completed"] else 1,
        extra={"test": "load", **{k: result.get(k) for k in keys}},
    )  # fmt: skip
