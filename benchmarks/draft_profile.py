#!/usr/bin/env python3
"""Where a speculative step's time goes on this machine (issue 39), in one process, interleaved:

- ``llama_decode`` of a batch of k+1 tokens (logits for each row) vs a one-token step, at a depth of
  300 tokens, wall and CPU time (the process's, llama.cpp's threads included), per trial the sizes in
  a rotating order so the load hits them alike;
- the drafter's Python: ``extend`` by one token and ``propose`` on a copy-heavy sequence;
- sampling one row with a greedy chain (``llama_sampler_sample``: the logits' copy and the argmax).

    PYTHONPATH=src .venv/bin/python benchmarks/draft_profile.py -t 2 --trials 30
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--sizes", default="1,2,3,5,9,17")
    args = ap.parse_args()
    from draft_vs_plain import PASSAGES, default_model

    from localinfer.engine.backend import llama_cpp
    from localinfer.engine.draft import NgramDrafter
    from localinfer.engine.model import LlamaModel
    from localinfer.engine.speculate import _VerifyBatch
    from localinfer.engine.types import LoadOptions
    from localinfer.request.sampling import SamplingOptions

    sizes = [int(x) for x in args.sizes.split(",")]
    m = LlamaModel(args.model or default_model(), LoadOptions(n_ctx=2048, n_threads=args.threads))
    toks = m.tokenize(PASSAGES * 4)
    depth = 300
    m._decode(toks[:depth])
    verify = _VerifyBatch(max(sizes))
    wall: dict[int, list[float]] = {k: [] for k in sizes}
    cpu: dict[int, list[float]] = {k: [] for k in sizes}
    print(f"# {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, -t {args.threads}, {args.trials} trials; "
          f"uptime: {os.popen('uptime').read().strip()}")  # fmt: skip
    for trial in range(args.trials):
        order = sizes[trial % len(sizes) :] + sizes[: trial % len(sizes)]
        for k in order:
            t, c = time.perf_counter(), time.process_time()
            rc = llama_cpp.llama_decode(m._ctx, verify.fill(toks[depth : depth + k], depth))
            llama_cpp.llama_synchronize(m._ctx)
            wall[k].append(time.perf_counter() - t)
            cpu[k].append(time.process_time() - c)
            assert rc == 0 and m.drop_tokens(0, depth)
    w1, c1 = statistics.median(wall[1]), statistics.median(cpu[1])
    for k in sizes:
        w, c = statistics.median(wall[k]), statistics.median(cpu[k])
        print(f"decode {k:2d} token(s): wall {w * 1e3:6.2f} ms (x{w / w1:.2f}), cpu {c * 1e3:6.2f} ms (x{c / c1:.2f})")
    # sampling a row: the greedy chain reads the row's logits (vocab floats) and takes the argmax
    llama_cpp.llama_decode(m._ctx, verify.fill(toks[depth : depth + 9], depth))
    chain, _ = m.new_sampler(SamplingOptions(temperature=0), toks[:depth], None)
    n = 2000
    t = time.perf_counter()
    for i in range(n):
        m.sample(chain, i % 9)
    print(f"sample one row (greedy chain): {(time.perf_counter() - t) / n * 1e6:.1f} us")
    m.free_sampler(chain)
    # the drafter: extend by one token, propose, on a sequence that copies the passages
    d = NgramDrafter(toks[:depth])
    rest = toks[depth:] * 3
    t = time.perf_counter()
    for tok in rest:
        d.extend((tok,))
        d.propose()
    per = (time.perf_counter() - t) / len(rest)
    print(f"drafter extend + propose: {per * 1e6:.1f} us per token ({len(rest)} tokens, depth {depth}+)")
    print(f"uptime after: {os.popen('uptime').read().strip()}")
    verify.free()
    m.close()


if __name__ == "__main__":
    main()
