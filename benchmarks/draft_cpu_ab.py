#!/usr/bin/env python3
"""Speculative decoding's gain in CPU time, in one process (issue 39): plain vs ``--draft ngram``
decode of the same greedy prompt, interleaved, both models loaded once (two contexts of one file).

On the shared 2-core machine a run's wall time is mostly other processes'; the process's CPU time
over the decode (the prompt is cached by a first 1-token answer) is the work. At 1 thread CPU time
is the decode's own; at 2 threads it includes OpenMP's spin-waiting, which grows with the load.
Per task: tokens per CPU second and per wall second, plain and drafted (medians of ``--rounds``),
drafted / kept tokens, and whether the texts are the same. The drafter keeps what it learnt across
rounds (as a LlamaModel does across answers); the first round is its cold start.

    PYTHONPATH=src .venv/bin/python benchmarks/draft_cpu_ab.py --model PATH -t 1 -n 160 --rounds 3
    PYTHONPATH=src .venv/bin/python benchmarks/draft_cpu_ab.py --model gemma.gguf --raw   # a base model
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-n", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tasks", default="copy-module,rag-quote,free")
    ap.add_argument("--raw", action="store_true", help="plain-completion tasks (a base model: no chat template)")
    args = ap.parse_args()
    from draft_vs_plain import default_model, prompt_tokens, tasks

    from localinfer.engine.model import LlamaModel
    from localinfer.engine.types import GenerationStats, LoadOptions
    from localinfer.request.sampling import SamplingOptions

    path = args.model or default_model()
    ms = {d: LlamaModel(path, LoadOptions(n_ctx=2048, n_threads=args.threads, draft=d)) for d in (None, "ngram")}
    greedy = SamplingOptions(temperature=0)
    print(f"# draft_cpu_ab {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC: {Path(path).name}, -t {args.threads}, "
          f"-n {args.n}, {args.rounds} rounds{' --raw' if args.raw else ''}; load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    for task in args.tasks.split(","):
        text = tasks(args.raw)[task]
        m0 = ms[None]
        prompt = prompt_tokens(m0, text, args.raw)
        for m in ms.values():  # the prompt into each context's cache: the rounds time the decode alone
            list(m.generate(prompt, greedy, GenerationStats(), max_tokens=1))
        cpu: dict = {None: [], "ngram": []}
        wall: dict = {None: [], "ngram": []}
        texts, notes = {}, []
        for r in range(args.rounds):
            for d in (None, "ngram") if r % 2 == 0 else ("ngram", None):
                st = GenerationStats()
                c0 = time.process_time()
                out = "".join(s.text for s in ms[d].generate(prompt, greedy, st, max_tokens=args.n))
                c = time.process_time() - c0
                texts.setdefault(d, out)
                cpu[d].append(st.completion_tokens / c)
                wall[d].append(st.completion_tokens / st.decode_s)
                if d:
                    notes.append(f"{st.draft_accepted}/{st.draft_tokens}")
        pc, dc = statistics.median(cpu[None]), statistics.median(cpu["ngram"])
        pw, dw = statistics.median(wall[None]), statistics.median(wall["ngram"])
        same = "same text" if texts[None] == texts["ngram"] else "TEXT DIFFERS"
        print(f"{task}: tok/CPU-s plain {pc:.2f} draft {dc:.2f} ratio {dc / pc:.3f} (per round "
              f"{', '.join(f'{b / a:.2f}' for a, b in zip(cpu[None], cpu['ngram']))}); tok/s wall plain {pw:.2f} "
              f"draft {dw:.2f} ratio {dw / pw:.3f}; kept/drafted per round {', '.join(notes)}; {same}; "
              f"load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    for m in ms.values():
        m.close()


if __name__ == "__main__":
    main()
