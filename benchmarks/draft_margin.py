#!/usr/bin/env python3
"""How far a verification batch's logits round apart from one-token steps (issue 52): the bound on
the top-1 minus top-2 margin below which greedy verification decodes a position alone
(engine/speculate.py, GREEDY_MARGIN).

Two contexts of the same model at the same thread count. ``plain`` decodes greedily one token at a
time; ``batched`` is teacher-forced on the same tokens in chunks of 2-9 tokens (what a draft of 1-8
tokens verifies: the last sampled token and the guess), every row asking for logits. Each chunk's
rows are compared with the plain rows of the same positions, and then the chunk's last token is
decoded again alone in ``batched`` (what the margin rule does at an unsure position: its cells
before it were filled by batches) and compared too. So the batched context's cache is filled by
batches the whole way, as a drafting answer's is, and what is measured includes that drift.

Per row, over the tokens within NEAR nats of the top of either row (far below it a token cannot
overtake; Gemma's rows move some far tokens by up to 11 nats): ``margin diff`` = |(top1 - top2)
batched - (top1 - top2) plain|; ``pair drift`` = the largest change of the batched row's top token's
lead over such a token: ``(B[b] - B[x]) - (P[b] - P[x])``. A batched top token whose margin exceeds
the largest pair drift is the plain row's top token too.

    .venv/bin/python benchmarks/draft_margin.py                   # both models, 2 threads, ~450 rows each
    .venv/bin/python benchmarks/draft_margin.py -t 1 -n 60 --out -
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))
CHUNKS = (9, 5, 3, 2, 7, 4, 8, 6)  # verify batches: the last token and a draft of 1-8
NEAR = 4.0  # nats below a row's top token: the tokens that could overtake it under a bound of ~2


def _row(model, i: int) -> np.ndarray:
    from localinfer.engine.backend import llama_cpp

    ptr = llama_cpp.llama_get_logits_ith(model._ctx, i)
    view = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(model.n_vocab,))
    return view.astype(np.float64)


def _margin(row: np.ndarray) -> tuple[int, float]:
    top2 = np.argpartition(-row, 1)[:2]
    a, b = (top2[0], top2[1]) if row[top2[0]] >= row[top2[1]] else (top2[1], top2[0])
    return int(a), float(row[a] - row[b])


def compare(plain: np.ndarray, batched: np.ndarray) -> tuple[float, float, bool, float]:
    """(margin diff, pair drift, top tokens differ, plain margin) of one position: both over the
    tokens within NEAR nats of the top in either row (far below it, a token cannot overtake)."""
    pa, pm = _margin(plain)
    ba, bm = _margin(batched)
    near = np.union1d(np.flatnonzero(plain >= plain[pa] - NEAR), np.flatnonzero(batched >= batched[ba] - NEAR))
    near = near[near != ba]
    if not len(near):
        return 0.0, 0.0, pa != ba, pm
    drift = np.abs((batched[ba] - batched[near]) - (plain[ba] - plain[near])).max()
    return (abs(bm - pm) if min(bm, pm) < NEAR else 0.0), float(drift), pa != ba, pm


def measure(path: str, prompts: list[list[int]], threads: int, n: int) -> dict:
    from localinfer.engine.backend import llama_cpp
    from localinfer.engine.model import LlamaModel
    from localinfer.engine.speculate import _VerifyBatch
    from localinfer.engine.types import LoadOptions

    plain = LlamaModel(path, LoadOptions(n_ctx=2048, n_threads=threads))
    batched = LlamaModel(path, LoadOptions(n_ctx=2048, n_threads=threads))
    verify = _VerifyBatch(max(CHUNKS))
    rows: list[tuple[int, float, float, bool, float]] = []  # (chunk size, margin diff, drift, differ, plain margin)
    alone: list[tuple[float, float, bool, float]] = []
    try:
        for prompt in prompts:
            for m in (plain, batched):
                m.reset()
                m._decode(prompt)
            token = int(np.argmax(_row(plain, -1)))
            done, c = 0, 0
            while done < n:
                size = CHUNKS[c % len(CHUNKS)]
                c += 1
                inputs, want = [], []
                for _ in range(size):  # the plain greedy answer, one token at a time
                    inputs.append(token)
                    plain._decode([token])
                    want.append(_row(plain, -1))
                    token = int(np.argmax(want[-1]))
                start = len(batched._tokens)
                assert llama_cpp.llama_decode(batched._ctx, verify.fill(inputs, start)) == 0
                batched._tokens.extend(inputs)
                for i in range(size):
                    rows.append((size, *compare(want[i], _row(batched, i))))
                # the chunk's last position again, alone over the batched cache (the margin rule's fallback)
                assert batched.drop_tokens(0, start + size - 1)
                del batched._tokens[start + size - 1 :]
                batched._decode(inputs[-1:])
                alone.append(compare(want[-1], _row(batched, -1)))
                done += size
                if plain.token_out(token)[2] or len(plain._tokens) + max(CHUNKS) >= 2000:
                    break
    finally:
        verify.free()
        plain.close()
        batched.close()
    return {"rows": rows, "alone": alone}


def summary(name: str, threads: int, got: dict) -> list[str]:
    rows, alone = got["rows"], got["alone"]
    out = [f"{name}, {threads} thread(s): {len(rows)} batch rows, {len(alone)} positions decoded alone after a batch"]

    def line(label: str, sel: list) -> str:
        if not sel:
            return f"  {label}: none"
        md = max(r[-4] for r in sel)
        drifts = sorted(r[-3] for r in sel)
        q = [drifts[min(len(drifts) - 1, int(f * len(drifts)))] for f in (0.5, 0.9, 0.99)]
        flips = [r[-1] for r in sel if r[-2]]
        flip = f", top token differs at {len(flips)} (plain margins {', '.join(f'{f:.3f}' for f in flips)})" if flips else ""
        return (f"  {label}: {len(sel)} rows, max margin diff {md:.4f}, pair drift max {drifts[-1]:.4f} "
                f"(median {q[0]:.4f}, p90 {q[1]:.4f}, p99 {q[2]:.4f}){flip}")

    out.append(line("all batch rows", rows))
    for lo, hi in ((2, 3), (4, 9)):
        out.append(line(f"batches of {lo}-{hi}", [r for r in rows if lo <= r[0] <= hi]))
    out.append(line("alone after batches", alone))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-t", "--threads", type=int, nargs="+", default=[2])
    ap.add_argument("-n", type=int, default=150, help="answer tokens per task (3 tasks a model)")
    ap.add_argument("--models", nargs="+", default=["smollm2", "gemma"])
    ap.add_argument("--out", default=str(HERE / "results" / f"draft-margin-{dt.date.today()}.txt"))
    args = ap.parse_args()
    import draft_vs_plain as dvp
    import models as test_models

    from localinfer.engine.model import LlamaModel
    from localinfer.engine.types import LoadOptions

    lines = [f"# benchmarks/draft_margin.py -t {' '.join(map(str, args.threads))} -n {args.n}; load {os.getloadavg()[0]:.2f}"]
    for name in args.models:
        raw = name == "gemma"  # the base model: plain completions, as draft_vs_plain --raw
        path = str(test_models.gemma_path() if raw else test_models.smollm2_path())
        probe = LlamaModel(path, LoadOptions(n_ctx=2048, n_threads=1))
        texts = dvp.tasks(raw)
        prompts = [dvp.prompt_tokens(probe, texts[k], raw) for k in ("copy-text", "copy-module", "free")]
        probe.close()
        for t in args.threads:
            got = measure(path, prompts, t, args.n)
            lines += summary(f"{name} ({Path(path).name})", t, got)
            print("\n".join(lines[-5:]), file=sys.stderr, flush=True)
    lines.append(f"# load after: {os.getloadavg()[0]:.2f}")
    text = "\n".join(lines) + "\n"
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text)
        print(text)


if __name__ == "__main__":
    main()
