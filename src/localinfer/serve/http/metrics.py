"""The server's figures in Prometheus text format (``GET /metrics``), as llama-server's ``/metrics``
names them where it has one: requests, tokens, TTFT and time-per-output-token histograms, requests
running and waiting, KV cells used.

Counters are updated on the engine thread (a request ended) and the event loop (a request was
answered); one lock keeps them whole. The gauges are read when scraped.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from localinfer.serve.scheduler.worker import Ended

PREFIX = "localinfer_"
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class Histogram:
    """Cumulative buckets, a sum and a count: Prometheus's histogram."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, total = [], 0
        for bound, n in zip((*self.buckets, float("inf")), self.counts, strict=True):
            total += n
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            out.append(f'{name}_bucket{{le="{le}"}} {total}')
        out += [f"{name}_sum {self.sum:.6f}", f"{name}_count {self.count}"]
        return out


@dataclass(frozen=True)
class Gauges:
    """What is true now, read from the engine when scraped."""

    running: int = 0
    queued: int = 0
    kv_cells_used: int = 0
    kv_cells: int = 0
    ready: bool = False
    # the host prompt cache (engine.prompt_cache), over the loaded models: held now, and since each loaded
    cache_entries: int = 0
    cache_bytes: int = 0
    cache_hits: int = 0
    cache_tokens_restored: int = 0

    @classmethod
    def of(cls, engines: list[Any], queued: int = 0) -> Gauges:
        """The figures of these engines (serve.scheduler.worker.Engine), added up; ``queued``: waiting elsewhere."""
        caches = [c for c in (e.prompt_cache for e in engines) if c is not None]
        return cls(sum(e.running for e in engines), sum(e.queued for e in engines) + queued,
                   sum(e.cells_used for e in engines), sum(e.cells_total for e in engines), True,
                   sum(c.entries for c in caches), sum(c.bytes for c in caches), sum(c.hits for c in caches),
                   sum(c.tokens_restored for c in caches))  # fmt: skip


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answers: dict[tuple[str, int], int] = {}  # (endpoint, HTTP status) -> count
        self._tokens = {"prompt": 0, "prompt_cached": 0, "completion": 0, "draft": 0, "draft_accepted": 0, "drafts": 0}
        self._finished: dict[str, int] = {}  # finish reason -> count
        # serve without -m: model -> its share of the totals above (and its loads), kept under the
        # same lock so that a scrape sees per-model figures that add up to the totals
        self._models: dict[str, dict[str, int]] = {}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)

    def answered(self, endpoint: str, status: int) -> None:
        """An HTTP answer, whatever its status (499: the client went away first)."""
        with self._lock:
            key = (endpoint, status)
            self._answers[key] = self._answers.get(key, 0) + 1

    def loaded(self, model: str) -> None:
        with self._lock:
            self._model(model)["loads"] += 1

    def _model(self, model: str) -> dict[str, int]:
        return self._models.setdefault(model, {"loads": 0, "finished": 0, "prompt": 0, "completion": 0})

    def finished(self, outcome: Ended, model: str | None = None) -> None:
        """A request left the engine (engine thread); ``model``: the model that answered it."""
        s = outcome.stats
        with self._lock:
            if model is not None:
                counts = self._model(model)
                counts["finished"] += 1
                counts["prompt"] += s.prompt_tokens
                counts["completion"] += s.completion_tokens
            self._tokens["prompt"] += s.prompt_tokens
            self._tokens["prompt_cached"] += s.cached_tokens
            self._tokens["completion"] += s.completion_tokens
            self._tokens["draft"] += s.draft_tokens
            self._tokens["draft_accepted"] += s.draft_accepted
            self._tokens["drafts"] += s.draft_steps
            reason = outcome.finish_reason or "unknown"
            self._finished[reason] = self._finished.get(reason, 0) + 1
            if outcome.ttft_s is not None:
                self.ttft.observe(outcome.ttft_s)
            if s.completion_tokens > 1 and s.decode_s > 0:
                self.tpot.observe(s.decode_s / (s.completion_tokens - 1))
            self.e2e.observe(outcome.total_s)

    def render(self, g: Gauges, by_model: Callable[[dict[str, dict[str, int]]], str] | None = None) -> str:
        """The figures; ``by_model`` renders the per-model counts, read in the same instant as the totals."""
        p = PREFIX
        with self._lock:
            models = {name: dict(counts) for name, counts in self._models.items()}
            lines = [f"# HELP {p}requests_total HTTP answers by endpoint (chat, completions, models, health, metrics, other; connection: refused before a route) and status.",
                     f"# TYPE {p}requests_total counter"]  # fmt: skip
            for (endpoint, status), n in sorted(self._answers.items()):
                lines.append(f'{p}requests_total{{endpoint="{endpoint}",status="{status}"}} {n}')
            lines += _counter(f"{p}prompt_tokens_total", "Prompt tokens, cached ones included.", self._tokens["prompt"])
            lines += _counter(f"{p}prompt_tokens_cached_total", "Prompt tokens reused from a slot's KV cache.", self._tokens["prompt_cached"])
            lines += _counter(f"{p}completion_tokens_total", "Tokens generated.", self._tokens["completion"])
            # speculative decoding (serve --draft), under llama-server's names
            lines += _counter(f"{p}spec_decode_num_draft_tokens_total", "Speculative: tokens drafted.", self._tokens["draft"])
            lines += _counter(f"{p}spec_decode_num_accepted_tokens_total", "Speculative: drafted tokens the model kept.", self._tokens["draft_accepted"])
            lines += _counter(f"{p}spec_decode_num_drafts_total", "Speculative: drafts verified (one batch each).", self._tokens["drafts"])
            lines += [f"# HELP {p}requests_finished_total Requests that left the engine, by finish reason.",
                      f"# TYPE {p}requests_finished_total counter"]  # fmt: skip
            lines += [f'{p}requests_finished_total{{reason="{r}"}} {n}' for r, n in sorted(self._finished.items())]
            for name, hist, text in (
                ("time_to_first_token_seconds", self.ttft, "From arrival to the first token sampled."),
                ("time_per_output_token_seconds", self.tpot, "Decode time per token after the first."),
                ("request_duration_seconds", self.e2e, "From arrival to the last token."),
            ):
                lines += [f"# HELP {p}{name} {text}", f"# TYPE {p}{name} histogram", *hist.lines(p + name)]
        lines += _gauge(f"{p}requests_running", "Requests decoding now.", g.running)
        lines += _gauge(f"{p}requests_queued", "Requests waiting for a free sequence.", g.queued)
        lines += _gauge(f"{p}kv_cache_used_cells", "KV cache cells in use (running and kept for reuse).", g.kv_cells_used)
        lines += _gauge(f"{p}kv_cache_cells", "KV cache cells in all (sequences x context).", g.kv_cells)
        lines += _gauge(f"{p}ready", "1 once the model is loaded.", int(g.ready))
        lines += _gauge(f"{p}prompt_cache_entries", "Idle sequences' prompts kept in host memory (--cache-ram).", g.cache_entries)
        lines += _gauge(f"{p}prompt_cache_bytes", "Host memory the prompt cache holds.", g.cache_bytes)
        lines += _counter(f"{p}prompt_cache_hits_total", "Prompts that got their prefix back from host memory.", g.cache_hits)
        lines += _counter(f"{p}prompt_cache_tokens_total", "Prompt tokens restored from host memory, not evaluated.", g.cache_tokens_restored)
        return "\n".join(lines) + "\n" + (by_model(models) if by_model is not None else "")


def _counter(name: str, text: str, value: int) -> list[str]:
    return [f"# HELP {name} {text}", f"# TYPE {name} counter", f"{name} {value}"]


def _gauge(name: str, text: str, value: int) -> list[str]:
    return [f"# HELP {name} {text}", f"# TYPE {name} gauge", f"{name} {value}"]
