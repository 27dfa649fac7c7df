"""The stats line after an answer, the --verbose table, and warnings - all on stderr.

Plain text when stderr is not a terminal or NO_COLOR is set; Rich styling (dim) on a terminal.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from localinfer.render.term import styled
from localinfer.units import human_bytes
from localinfer.units import human_duration as _ms
from localinfer.units import human_rate as _tps

if TYPE_CHECKING:
    from localinfer.answer.answer import Answer




def summary_line(result: Answer) -> str:
    s = result.stats
    parts = [
        result.model,
        f"{s.completion_tokens} tokens",
        f"TTFT {_ms(result.ttft_s)}",
        f"prefill {_tps(s.prefill_tps)} ({s.evaluated_tokens} evaluated, {s.cached_tokens} cached)",
        f"decode {_tps(s.decode_tps)}",
        f"total {_ms(result.total_s)}",
        "load 0 (resident)" if getattr(result, "resident", False) else f"load {_ms(result.load_s)}",
        f"peak RSS {human_bytes(result.peak_rss)}",
        f"finish {s.finish_reason or '-'}",
    ]
    if s.draft:  # speculative decoding: how much of what was guessed the model kept
        from localinfer.engine.draft import acceptance

        parts.insert(5, acceptance(s.draft_tokens, s.draft_accepted))
    if s.image_tokens:  # of the prompt's tokens; their encoding is not in prefill
        parts.insert(4, f"images {s.image_tokens} tokens, encoded in {_ms(s.image_encode_s)}")
    if s.truncated_tokens:
        parts.append(f"prompt truncated by {s.truncated_tokens} tokens")
    if getattr(result, "reasoning_tokens", None):  # a reasoning model's: TTFT is its first answer text
        parts.insert(2, f"{result.reasoning_tokens} thinking (first after {_ms(result.reasoning_ttft_s)})")
    if getattr(result, "gpu_layers", None):
        parts.append(f"GPU layers {result.gpu_layers}")
    return " · ".join(parts)


def print_summary(result: Answer, *, verbose: bool = False, stream: TextIO | None = None) -> None:
    stream = stream or sys.stderr
    if not verbose:
        line = summary_line(result)
        if styled(stream):
            from localinfer.render.term import console

            console(file=stream, highlight=False).print(line, style="dim", markup=False, soft_wrap=True)
        else:
            stream.write(line + "\n")
        stream.flush()
        return
    print_table(result, stream)


def _rows(result: Answer) -> list[tuple[str, str]]:
    s = result.stats
    return [
        ("model", result.model),
        ("mode", result.mode),
        ("finish reason", s.finish_reason or "-"),
        ("load time", _ms(result.load_s)),
        ("TTFT", _ms(result.ttft_s)),
        ("prompt tokens", f"{s.prompt_tokens} ({s.evaluated_tokens} evaluated, {s.cached_tokens} cached)"),
        ("prompt truncated", f"{s.truncated_tokens} tokens" if s.truncated_tokens else "no"),
        ("prefill", f"{_ms(s.prefill_s)} · {_tps(s.prefill_tps)}"),
        *([("images", f"{s.image_tokens} of the prompt tokens · encoded in {_ms(s.image_encode_s)}")] if s.image_tokens else []),
        ("completion tokens", str(s.completion_tokens)),
        ("decode", f"{_ms(s.decode_s)} · {_tps(s.decode_tps)} (tokens after the first)"),
        ("speculative", f"{s.draft}: {s.draft_accepted} of {s.draft_tokens} drafted tokens kept" if s.draft else "off"),
        ("end to end", _ms(result.total_s)),
        ("context", f"{s.context_used} / {s.n_ctx} tokens" + _ctx_note(result)),
        ("GPU layers", _gpu_note(result)),
        ("weights on", _weights_note(result)),
        ("memory", _memory_note(result)),
        ("peak RSS", human_bytes(result.peak_rss)),
        ("seed", str(s.extra.get("seed", "-"))),
    ]


def _ctx_note(result: Answer) -> str:
    plan = getattr(result, "plan", None)
    if plan is None:
        return ""
    train = f"trained on {plan.n_ctx_train}" if plan.n_ctx_train else "trained context unknown"
    return f" ({plan.ctx_source}; {train})"


def _gpu_note(result: Answer) -> str:
    plan = getattr(result, "plan", None)
    layers = getattr(result, "gpu_layers", None)
    if plan is None or layers is None:
        return "-"
    text = f"{layers} / {plan.n_offloadable} offloaded" if plan.n_offloadable else f"{layers} offloaded"
    if not plan.budget.gpu_offload:
        return text + " (CPU-only llama.cpp build)"
    return text + f" (--gpu-layers {plan.gpu_layers_requested})"


def _weights_note(result: Answer) -> str:
    """Where llama.cpp put the weights: one figure per buffer (a split over devices shows here)."""
    buffers = getattr(result, "buffers", None)
    placed = buffers.by_device("model") if buffers is not None else {}
    return ", ".join(f"{dev} {human_bytes(n)}" for dev, n in placed.items()) or "-"


def _memory_note(result: Answer) -> str:
    """llama.cpp's buffers (weights, KV cache, compute) and our estimate of them."""
    buffers = getattr(result, "buffers", None)
    plan = getattr(result, "plan", None)
    parts = []
    if buffers is not None and buffers.buffers:
        parts.append(
            f"weights {human_bytes(buffers.total('model'))} · KV {human_bytes(buffers.total('KV'))} · "
            f"compute {human_bytes(buffers.total('compute'))}"
        )
    if plan is not None and plan.estimate is not None:
        parts.append(f"(estimated {human_bytes(plan.estimate.total)} in all)")
    return " ".join(parts) or "-"


def print_table(result: Answer, stream: TextIO) -> None:
    rows = _rows(result)
    if not styled(stream):
        width = max(len(k) for k, _ in rows)
        stream.write("".join(f"{k:<{width}}  {v}\n" for k, v in rows))
        stream.flush()
        return
    from localinfer.render.term import console
    from rich.table import Table

    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for k, v in rows:
        table.add_row(k, v)
    console(file=stream, highlight=False).print(table)


def warn(message: str, stream: TextIO | None = None) -> None:
    """One warning line on stderr."""
    stream = stream or sys.stderr
    if styled(stream):
        stream.write(f"\x1b[33mwarning:\x1b[0m {message}\n")
    else:
        stream.write(f"warning: {message}\n")
    stream.flush()
