#!/usr/bin/env python3
"""A draft model's gain (--draft-model, issue 39): decode tok/s and CPU time of SmolLM2 drafting for
itself against plain decoding, in one process, interleaved, greedy.

A draft model that is the target itself can never pay (each guess costs a full step of the same
model): the figure measures the machinery's overhead and the acceptance, which is what a real
pair (a small draft for a model 10-50 x its size) builds on. Three modes per task and round:
- ``plain``: the target alone;
- ``model``: --draft-model with the drafter's cost model (it drafts while drafts pay, here: a
  few, then it stops);
- ``forced``: every step drafts --draft-max tokens (the cost model off): the acceptance and the
  cost of drafting itself.
Tasks from benchmarks/draft_vs_plain.py (rag-quote and free). The answers are compared token for
token with the plain run's. Report: benchmarks/results/draft-model-YYYY-MM-DD.txt (--out; - for stdout).

    PYTHONPATH=src .venv/bin/python benchmarks/draft_model_vs_plain.py            # -t 1, -n 64, 3 rounds
    PYTHONPATH=src .venv/bin/python benchmarks/draft_model_vs_plain.py -n 16 --rounds 1
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

from draft_vs_plain import default_model, tasks  # noqa: E402

MODES = ("plain", "model", "forced")


def main() -> None:
    from localinfer.engine import draft as d
    from localinfer.engine.templates import ChatTemplate
    from localinfer.engine.types import GenerationStats, LoadOptions
    from localinfer.request.sampling import SamplingOptions
    from localinfer.generate.loading import load
    from localinfer.store import resolve_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="the target (default: SmolLM2-135M Q4_1)")
    ap.add_argument("--draft-model", default=None, help="the draft (default: the target itself)")
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--draft-max", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    target = args.model or default_model()
    drafter = args.draft_model or target
    opts = LoadOptions(n_ctx=2048, n_threads=args.threads)
    plain = load(resolve_model(target), opts)
    spec = load(resolve_model(target), LoadOptions(n_ctx=2048, n_threads=args.threads, draft_model=drafter, draft_max=args.draft_max))
    m = plain.model
    template = ChatTemplate(source="gguf", template=m.chat_template, bos_text=m.bos_text, eos_text=m.eos_text)
    jobs = {k: v for k, v in tasks().items() if k in ("rag-quote", "free")}
    real_worth, real_misses = d.NgramDrafter.worth, d.MISSES_TO_PAUSE

    def once(mode: str, text: str) -> tuple[list[int], GenerationStats, float]:
        model = plain.model if mode == "plain" else spec.model
        forced = mode == "forced"
        d.NgramDrafter.worth = (lambda self, n, available: available) if forced else real_worth  # type: ignore[method-assign]
        d.MISSES_TO_PAUSE = 10**9 if forced else real_misses
        model.reset()
        model.draft_costs = None  # each run learns its costs afresh, as a new process would
        p = template.render([{"role": "user", "content": text}])
        prompt = model.tokenize(p.text, add_special=p.add_special, parse_special=True)
        st = GenerationStats()
        toks, cpu0 = [], None
        for s in model.generate(prompt, SamplingOptions(temperature=0), st, max_tokens=args.n):
            cpu0 = time.process_time() if cpu0 is None else cpu0  # decode only: from the first token on
            toks += [s.token] if s.token is not None else []
        return toks, st, time.process_time() - (cpu0 or 0.0)

    t0 = dt.datetime.now(dt.timezone.utc)
    lines = [f"# draft_model_vs_plain {t0:%Y-%m-%d %H:%M} UTC: target {Path(target).name}, draft {Path(drafter).name}, "
             f"-t {args.threads}, -n {args.n}, --draft-max {args.draft_max}, {args.rounds} rounds; "
             f"loadavg at start {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"]  # fmt: skip
    rate: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    kept: dict[tuple[str, str], list[int]] = {}
    for r in range(args.rounds):
        for name, text in jobs.items():
            order = MODES[r % 3 :] + MODES[: r % 3]
            got = {mode: once(mode, text) for mode in order}
            ref = got["plain"][0]
            for mode in MODES:
                toks, st, c = got[mode]
                tps = (st.completion_tokens - 1) / st.decode_s if st.decode_s else 0.0
                rate.setdefault((name, mode), []).append(tps)
                cpu.setdefault((name, mode), []).append(c / max(1, st.completion_tokens - 1))
                kept.setdefault((name, mode), []).extend((st.draft_tokens, st.draft_accepted))
                same = "same tokens" if toks == ref else f"parted at {next((i for i, (a, b) in enumerate(zip(ref, toks)) if a != b), min(len(ref), len(toks)))}"
                lines.append(f"round {r + 1} {name} {mode}: {tps:.2f} tok/s decode, {1000 * c / max(1, st.completion_tokens - 1):.1f} ms "
                             f"decode CPU/token, drafted {st.draft_tokens}, kept {st.draft_accepted}, {st.completion_tokens} tokens, {same}; "
                             f"load {os.getloadavg()[0]:.2f}")  # fmt: skip
                print(lines[-1], file=sys.stderr)
    d.NgramDrafter.worth, d.MISSES_TO_PAUSE = real_worth, real_misses
    lines.append(f"loadavg at end {os.getloadavg()[0]:.2f}; {(dt.datetime.now(dt.timezone.utc) - t0).total_seconds():.0f} s")
    lines += ["", "| task | mode | decode tok/s (median) | x plain (median of rounds) | decode CPU ms/token (median) | drafted | kept |",
              "| ---- | ---- | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for name in jobs:
        for mode in MODES:
            ratios = [a / b for a, b in zip(rate[(name, mode)], rate[(name, "plain")]) if b]
            k = kept[(name, mode)]
            drafted, accepted = sum(k[0::2]), sum(k[1::2])
            share = f" ({100 * accepted / drafted:.0f}%)" if drafted else ""
            lines.append(f"| {name} | {mode} | {statistics.median(rate[(name, mode)]):.2f} | {statistics.median(ratios):.3f} "
                         f"| {1000 * statistics.median(cpu[(name, mode)]):.1f} | {drafted} | {accepted}{share} |")  # fmt: skip
    plain.close()
    spec.close()
    report = "\n".join(lines) + "\n"
    sys.stdout.write(report)
    if args.out != "-":  # the dated results file unless --out says otherwise
        Path(args.out or HERE / "results" / f"draft-model-{t0:%Y-%m-%d}.txt").write_text(report)

if __name__ == "__main__":
    main()
