#!/usr/bin/env python3
"""Which n-gram lookup keeps more guessed tokens per step (issue 39), offline: the plain greedy
answers of the draft_vs_plain tasks, and each lookup replayed over them - at every step the guess
(up to K tokens) is compared with what the answer really says next, the step hands out the kept
tokens plus one, as verification would.

Lookups: ``latest`` (ours, engine/draft.py: the longest suffix of 5..2 tokens seen before, what
followed its latest occurrence; prompt-lookup decoding, llama.cpp's ngram-simple with a fallback
over n), ``latest-8`` (suffixes up to 8), ``latest-1`` (down to one token), ``frequent``
(llama.cpp's ngram-map-k: per key n-gram up to 4 continuations counted, the most frequent one's
latest occurrence), ``first`` (the earliest occurrence).

    PYTHONPATH=src .venv/bin/python benchmarks/draft_lookup_sim.py --model PATH [--raw] -n 160 -k 8
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))


def lookup(seq: list[int], k: int, n_max: int, n_min: int, how: str) -> list[int]:
    m = len(seq)
    for n in range(min(n_max, m - 1), n_min - 1, -1):
        key = seq[m - n :]
        hits = [i + n for i in range(m - n) if seq[i : i + n] == key]  # positions after each earlier occurrence
        if not hits:
            continue
        if how == "first":
            at = hits[0]
        elif how == "frequent":
            counts = Counter(seq[h] for h in hits if h < m)
            best = max(counts.values())
            at = max(h for h in hits if counts[seq[h]] == best)
        else:
            at = hits[-1]
        return seq[at : at + k]
    return []


def replay(prompt: list[int], answer: list[int], k: int, **how) -> tuple[int, int, int]:
    """(steps, guessed, kept) over the answer."""
    i, steps, guessed, kept = 0, 0, 0, 0
    while i < len(answer):
        seq = prompt + answer[: i + 1]
        draft = lookup(seq, k, **how)
        truth = answer[i + 1 : i + 1 + len(draft)]
        ok = 0
        while ok < len(truth) and draft[ok] == truth[ok]:
            ok += 1
        steps += 1
        guessed += len(draft)
        kept += ok
        i += ok + 1
    return steps, guessed, kept


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--raw", action="store_true")
    ap.add_argument("-n", type=int, default=160)
    ap.add_argument("-k", type=int, default=8)
    ap.add_argument("-t", "--threads", type=int, default=1)
    args = ap.parse_args()
    from draft_vs_plain import default_model, prompt_tokens, tasks

    from localinfer.engine.model import LlamaModel
    from localinfer.engine.types import GenerationStats, LoadOptions
    from localinfer.request.sampling import SamplingOptions

    path = args.model or default_model()
    m = LlamaModel(path, LoadOptions(n_ctx=2048, n_threads=args.threads))
    lookups = {"latest": dict(n_max=5, n_min=2, how="latest"), "latest-8": dict(n_max=8, n_min=2, how="latest"),
               "latest-1": dict(n_max=5, n_min=1, how="latest"), "frequent": dict(n_max=5, n_min=2, how="frequent"),
               "first": dict(n_max=5, n_min=2, how="first")}  # fmt: skip
    print(f"# {Path(path).name}, -n {args.n}, guesses of {args.k} at most{' --raw' if args.raw else ''}")
    for task, text in tasks(args.raw).items():
        prompt = prompt_tokens(m, text, args.raw)
        answer = [s.token for s in m.generate(prompt, SamplingOptions(temperature=0), GenerationStats(), max_tokens=args.n)
                  if s.token is not None]  # fmt: skip
        for name, how in lookups.items():
            steps, guessed, kept = replay(prompt, answer, args.k, **how)
            print(f"{task:12s} {name:9s} {len(answer)} tokens in {steps} steps ({len(answer) / steps:.2f} a step); "
                  f"guessed {guessed}, kept {kept} ({100 * kept / max(1, guessed):.0f}%)", flush=True)  # fmt: skip
    m.close()


if __name__ == "__main__":
    main()
