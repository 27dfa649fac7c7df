#!/usr/bin/env python3
"""Python calls per token and per request of one sequence's answer on `run`'s path
(``generate.run.generate``: the request prepared, the engine's one-sequence loop, the finish),
counted with ``sys.setprofile``: a count is the same on a quiet machine and a loaded one, where
timings on our shared 2-core machine are not.

Two answers of different lengths (greedy, end of generation ignored, so each has exactly N tokens)
give the calls each token costs and what a request costs besides. To compare two checkouts, run it
with each on PYTHONPATH (the script prints which ``localinfer`` it imported):

    .venv/bin/python benchmarks/single_calls.py                       # this checkout
    PYTHONPATH=/work/main/src .venv/bin/python benchmarks/single_calls.py   # another one
    .venv/bin/python benchmarks/single_calls.py --draft ngram         # the speculative loop
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a .gguf (default: the tests' SmolLM2 135M)")
    ap.add_argument("--short", type=int, default=16)
    ap.add_argument("--long", type=int, default=80)
    ap.add_argument("--draft", default=None, help="speculative decoding (ngram)")
    args = ap.parse_args()

    import localinfer
    from localinfer.api import load
    from localinfer.generate.run import generate
    from localinfer.request import request as rq
    from localinfer.request.sampling import SamplingOptions

    path = args.model
    if path is None:
        sys.path.insert(0, "tests")
        from models import smollm2_path

        path = str(smollm2_path())
    model = load(path, n_ctx=1024, n_threads=1, draft=args.draft)
    prompt = "Write the numbers from one to a hundred, in words, one per line."

    def calls(n: int) -> tuple[int, int, int]:
        request = rq.build(prompt, max_tokens=n, ignore_eos=True, sampling=SamplingOptions(temperature=0.0))
        model.loaded.model.reset()  # each answer evaluates the whole prompt, as the first did
        counts = {"call": 0, "c_call": 0}

        def profile(frame: object, event: str, arg: object) -> None:
            if event in counts:
                counts[event] += 1

        sys.setprofile(profile)
        try:
            answer = generate(model.loaded, request, lambda text: None)
        finally:
            sys.setprofile(None)
        return counts["call"], counts["c_call"], answer.stats.completion_tokens

    calls(args.short)  # warm: imports, compiled constraints, the token pieces' cache
    short, long_ = calls(args.short), calls(args.long)
    assert short[2] == args.short and long_[2] == args.long, (short, long_)
    n = args.long - args.short
    per_py, per_c = (long_[0] - short[0]) / n, (long_[1] - short[1]) / n
    print(f"localinfer from {localinfer.__file__}")
    print(f"draft={args.draft}  tokens {args.short} / {args.long}")
    print(f"python calls: {short[0]} / {long_[0]}  per token {per_py:.2f}  per request {short[0] - per_py * args.short:.0f}")
    print(f"C calls:      {short[1]} / {long_[1]}  per token {per_c:.2f}  per request {short[1] - per_c * args.short:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
