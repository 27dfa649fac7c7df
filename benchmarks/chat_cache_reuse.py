#!/usr/bin/env python3
"""`localinfer chat`'s KV-cache reuse, measured: TTFT of turn 1 vs turn 2 over a long history.

Turn 1 sends a long first message (``--tokens``, default 1500) and gets a short answer; turn 2 sends
a short follow-up. With cache reuse, turn 2 evaluates only its new tokens. For comparison the same
turn 2 is then answered again from an empty KV cache (``/retry`` after a reset), which is what a
chat that re-sent the whole history without reuse would pay. Greedy sampling, ``--rounds`` rounds,
medians reported (the machine may be shared: single runs are noisy).

    .venv/bin/python benchmarks/chat_cache_reuse.py                    # SmolLM2 135M, -t 2
    .venv/bin/python benchmarks/chat_cache_reuse.py -m qwen2.5:0.5b -t 4 --tokens 3000 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

PARAGRAPH = (
    "The lighthouse keeper kept a log of every ship that passed the point: its name, its flag, the "
    "hour, the weather and the state of the sea. Over forty years the log grew to thirty volumes, "
    "and in them one can follow the slow change from sail to steam, and from steam to diesel. "
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=None, help="model name or .gguf path (default: the registry default)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx-size", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=1500, help="approximate length of the first message")
    ap.add_argument("--answer-tokens", type=int, default=32, help="max tokens per answer")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    if not os.environ.get("LOCALINFER_HOME"):  # do not touch the user's store for a benchmark
        os.environ["LOCALINFER_HOME"] = tempfile.mkdtemp(prefix="localinfer-bench-")

    from localinfer.generate import loading
    from localinfer.chat.settings import ChatSettings
    from localinfer.chat.conversation import Conversation
    from localinfer.engine.types import LoadOptions
    from localinfer.request.sampling import SamplingOptions
    from localinfer.store import resolve_model

    resolved = resolve_model(args.model, offline=True)
    loaded = loading.load(resolved, LoadOptions(n_ctx=args.ctx_size, n_threads=args.threads))
    settings = ChatSettings(sampling=SamplingOptions(temperature=0.0), max_tokens=args.answer_tokens)
    conv = Conversation(loaded, system="You are a helpful assistant.", settings=settings)
    model = conv.model
    first = PARAGRAPH
    while len(model.tokenize(first, add_special=False)) < args.tokens:
        first += PARAGRAPH
    first += "\nWhat changed over the forty years?"
    follow_up = "Summarize that in one sentence."

    print(f"model {resolved.name} · {model.description} · threads {args.threads} · n_ctx {model.n_ctx}")
    print(f"{'round':>5}  {'turn 1 prompt':>13}  {'turn 1 TTFT':>11}  {'turn 2 cached/eval':>18}  "
          f"{'turn 2 TTFT':>11}  {'turn 2 cold TTFT':>16}  {'speedup':>7}")
    rows = []
    quiet = lambda _t: None  # noqa: E731
    try:
        for r in range(1, args.rounds + 1):
            conv.clear()
            t1 = conv.ask(first, quiet)
            t2 = conv.ask(follow_up, quiet)
            model.reset()  # same turn 2, nothing reused
            cold = conv.retry(quiet)
            assert cold.stats.cached_tokens == 0 and cold.stats.prompt_tokens == t2.stats.prompt_tokens
            speedup = cold.ttft_s / t2.ttft_s
            rows.append((t1.ttft_s, t2.ttft_s, cold.ttft_s, speedup))
            print(
                f"{r:>5}  {t1.stats.prompt_tokens:>13}  {t1.ttft_s * 1000:>8.0f} ms  "
                f"{t2.stats.cached_tokens:>9}/{t2.stats.evaluated_tokens:<8}  {t2.ttft_s * 1000:>8.0f} ms  "
                f"{cold.ttft_s * 1000:>13.0f} ms  {speedup:>6.1f}x"
            )
    finally:
        conv.close()
    med = [statistics.median(col) for col in zip(*rows)]
    print(
        f"median: turn 1 TTFT {med[0] * 1000:.0f} ms; turn 2 TTFT {med[1] * 1000:.0f} ms with cache reuse "
        f"vs {med[2] * 1000:.0f} ms without ({med[3]:.1f}x faster; turn 2 / turn 1 = {med[1] / med[0]:.3f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
