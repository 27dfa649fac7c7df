"""A remote answer in the shapes the local commands use: ``run --json``'s object, a batch output
record, a usage-history row. What the server did not report is None (null, "unknown"), never 0."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localinfer.units import json_ms as _ms
from localinfer.units import json_number as _round

if TYPE_CHECKING:
    from localinfer.remote.client import Outcome
    from localinfer.usage.history import UsageRecord


def _timing(timings: dict[str, Any] | None, key: str) -> float | None:
    value = (timings or {}).get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass
class RemoteResult:
    """One answer from a server (``run``/``chat``), with where it came from."""

    outcome: Outcome
    model: str
    endpoint: str  # Endpoint.display: no credentials
    mode: str = "chat"  # chat | raw (completions)
    seed: int | None = None

    @property
    def text(self) -> str:
        return self.outcome.text

    @property
    def finish_reason(self) -> str | None:
        return self.outcome.finish_reason

    @property
    def ttft_s(self) -> float | None:
        return self.outcome.ttft_s

    @property
    def total_s(self) -> float:
        return self.outcome.total_s

    @property
    def prompt_eval_tokens(self) -> int | None:
        """Prompt tokens the server evaluated now: llama-server's ``timings.prompt_n``."""
        n = _timing(self.outcome.server_timings, "prompt_n")
        return None if n is None else int(n)

    @property
    def prefill_s(self) -> float | None:
        ms = _timing(self.outcome.server_timings, "prompt_ms")
        return None if ms is None else ms / 1000.0

    @property
    def prefill_tps(self) -> float | None:
        n, s = self.prompt_eval_tokens, self.prefill_s
        return n / s if n and s else None

    def to_json(self) -> dict[str, Any]:
        """``run --json``'s object for a remote answer: the local keys, null where unknown, plus the
        endpoint and the server's own timings."""
        o = self.outcome
        total = None if o.prompt_tokens is None or o.completion_tokens is None else o.prompt_tokens + o.completion_tokens
        return {
            "model": self.model,
            "endpoint": self.endpoint,
            "text": o.text,
            "finish_reason": o.finish_reason,
            "mode": self.mode,
            "usage": {
                "prompt_tokens": o.prompt_tokens,
                "prompt_eval_tokens": self.prompt_eval_tokens,
                "cached_tokens": o.cached_tokens,
                "completion_tokens": o.completion_tokens,
                "total_tokens": total,
                "truncated_prompt_tokens": None,
            },
            "timings": {
                "load_ms": None,
                "ttft_ms": _ms(o.ttft_s),
                "prefill_ms": _ms(self.prefill_s),
                "prefill_tokens_per_s": _round(self.prefill_tps),
                "decode_ms": _ms(o.decode_s),
                "decode_tokens_per_s": _round(o.decode_tps),
                "total_ms": _ms(o.total_s),
            },
            "server_timings": o.server_timings,
            "seed": self.seed,
        }


def batch_record(rid: Any, o: Outcome) -> dict[str, Any]:
    """A batch output line for a remote answer (the local keys; null where the server is silent)."""
    total = None if o.prompt_tokens is None or o.completion_tokens is None else o.prompt_tokens + o.completion_tokens
    prompt_ms = _timing(o.server_timings, "prompt_ms")
    return {
        "id": rid,
        "text": o.text,
        "finish_reason": o.finish_reason,
        "usage": {
            "prompt_tokens": o.prompt_tokens,
            "completion_tokens": o.completion_tokens,
            "total_tokens": total,
            "truncated_prompt_tokens": None,
        },
        "timings": {
            "ttft_ms": _ms(o.ttft_s),
            "prefill_ms": None if prompt_ms is None else round(prompt_ms, 3),
            "decode_ms": _ms(o.decode_s),
            "decode_tokens_per_s": _round(o.decode_tps),
            "total_ms": _ms(o.total_s),
        },
        "seed": None,
    }


def usage_record(command: str, result: RemoteResult | None, *, model: str | None, endpoint: str,
                 exit_status: int = 0, finish_reason: str | None = None, prompt_text: str | None = None,
                 extra: dict[str, Any] | None = None) -> UsageRecord:  # fmt: skip
    """A history row for a remote request; a count the server did not give is stored as 0 and
    flagged in ``extra`` (the columns are NOT NULL), so ``stats`` can tell."""
    from localinfer.usage.history import UsageRecord, text_logging_enabled

    keep = text_logging_enabled()
    if result is None:
        return UsageRecord(command=command, model=model, endpoint=endpoint, exit_status=exit_status,
                           finish_reason=finish_reason, prompt_text=prompt_text if keep else None, extra=extra)  # fmt: skip
    o = result.outcome
    unknown = [k for k in ("prompt_tokens", "completion_tokens") if getattr(o, k) is None]
    if unknown:
        extra = {**(extra or {}), "unknown": unknown}
    return UsageRecord(
        command=command,
        model=result.model,
        endpoint=endpoint,
        prompt_tokens=o.prompt_tokens or 0,
        prompt_eval_tokens=result.prompt_eval_tokens if result.prompt_eval_tokens is not None else (o.prompt_tokens or 0),
        cached_tokens=o.cached_tokens or 0,
        completion_tokens=o.completion_tokens or 0,
        ttft_ms=None if o.ttft_s is None else o.ttft_s * 1000.0,
        prefill_tps=result.prefill_tps,
        decode_tps=o.decode_tps,
        total_ms=o.total_s * 1000.0,
        finish_reason=finish_reason or o.finish_reason,
        exit_status=exit_status,
        prompt_text=prompt_text if keep else None,
        answer_text=o.text if keep else None,
        extra=extra,
    )
