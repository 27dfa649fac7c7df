"""`bench --endpoint` on stdout: vLLM's "Serving Benchmark Result" block per request rate (so the
two read side by side), then what the server itself counted. Unknown figures say so."""

from __future__ import annotations

from typing import Any

_W = 50
_GROUPS = (
    ("ttft", "TTFT", "Time to First Token"),
    ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
    ("itl", "ITL", "Inter-token Latency"),
    ("e2el", "E2EL", "End-to-end Latency"),
)


def _v(value: Any, fmt: str = "{:.2f}") -> str:
    if value is None:
        return "unknown"
    if isinstance(value, str):
        return value
    return fmt.format(value)


def _row(label: str, value: Any, fmt: str = "{:.2f}") -> str:
    return f"{label:<40} {_v(value, fmt)}"


def result_lines(r: dict[str, Any], percentiles: tuple[float, ...]) -> list[str]:
    out = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=_W, c="=")]
    out += [
        _row("Endpoint:", f"{r['model_id']} @ {r['base_url']}"),
        _row("Successful requests:", r["completed"], "{}"),
        _row("Failed requests:", r["failed"], "{}"),
    ]
    if r.get("max_concurrency") is not None:
        out.append(_row("Maximum request concurrency:", r["max_concurrency"], "{}"))
    if r["request_rate"] != "inf":
        out.append(_row("Request rate configured (RPS):", r["request_rate"]))
    out += [
        _row("Benchmark duration (s):", r["duration"]),
        _row("Total input tokens:", r["total_input_tokens"], "{}"),
        _row("Total generated tokens:", r["total_output_tokens"], "{}"),
        _row("Request throughput (req/s):", r["request_throughput"]),
    ]
    if r.get("request_goodput") is not None:
        slos = ", ".join(f"{k} <= {v:g} ms" for k, v in (r.get("slos_ms") or {}).items())
        out.append(_row("Request goodput (req/s):", r["request_goodput"]) + f"   ({slos})")
    out += [
        _row("Output token throughput (tok/s):", r["output_throughput"]),
        _row("Total token throughput (tok/s):", r["total_token_throughput"]),
        _row("Peak concurrent requests:", r["max_concurrent_requests"], "{}"),
    ]
    for key, short, header in _GROUPS:
        out.append("{s:{c}^{n}}".format(s=header, n=_W, c="-"))
        out.append(_row(f"Mean {short} (ms):", r[f"mean_{key}_ms"]))
        out.append(_row(f"Median {short} (ms):", r[f"median_{key}_ms"]))
        for p in percentiles:
            word = str(int(p)) if int(p) == p else str(p)
            out.append(_row(f"P{word} {short} (ms):", r[f"p{word}_{key}_ms"]))
    out += _server_lines(r.get("server"))
    out.append("=" * _W)
    errors = sorted({e for e in r.get("errors", ()) if e})
    for e in errors[:5]:
        out.append(f"error: {e}")
    return out


def _server_lines(server: dict[str, Any] | None) -> list[str]:
    if not server:
        return []
    out = ["{s:{c}^{n}}".format(s="What the server counted", n=_W, c="-")]
    if "prompt_n" in server:
        out += [
            _row("Responses with timings:", server["responses_with_timings"], "{}"),
            _row("Prompt tokens evaluated (timings):", server["prompt_n"], "{}"),
            _row("Prompt tokens cached (timings):", server["cache_n"], "{}"),
            _row("Tokens predicted (timings):", server["predicted_n"], "{}"),
            _row("Mean prompt processing (ms):", server["mean_prompt_ms"]),
        ]
    delta = server.get("metrics_delta") or {}
    for name in ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total", "llamacpp:tokens_predicted_total"):
        if name in delta:
            out.append(_row(f"{name.split(':')[1]} (/metrics):", delta[name], "{:.0f}"))
    return out
