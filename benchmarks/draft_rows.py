#!/usr/bin/env python3
"""What a decode step of four sequences costs by the rows each carries (issue 39), with a KV stream
per sequence (serve's context) and with one unified pool (llama-server's ``-kvu``): llama.cpp splits a
batch over streams into one pass per run of sequences with the same number of rows, each pass
reading all the weights, so drafts of uneven lengths cost a pass each; a unified pool decodes any
shape in one. Each sequence at a depth of 300 tokens; both contexts loaded at once, medians of
interleaved trials, wall and process CPU time. Also: how far the two layouts' logits for the same
plain step lie apart (the pool's attention spans every sequence's cells).

    PYTHONPATH=src .venv/bin/python benchmarks/draft_rows.py -t 2
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

# drafted rows per sequence, beside each sequence's next token
SHAPES = {
    "4 x 1 (plain)": (0, 0, 0, 0),
    "one drafts 2": (2, 0, 0, 0),
    "one drafts 4": (4, 0, 0, 0),
    "two draft 4": (4, 4, 0, 0),
    "4, 2, 1, 0": (4, 2, 1, 0),
    "each drafts 1": (1, 1, 1, 1),
    "each drafts 2": (2, 2, 2, 2),
    "each drafts 3": (3, 3, 3, 3),
    "each drafts 4": (4, 4, 4, 4),
    # padded to 4 rows more each (throwaway rows, no logits): one pass (engine/batch_draft.py)
    "one drafts 4, padded": (4, 0, 0, 0, "pad"),
    "4, 2, 1, 0, padded": (4, 2, 1, 0, "pad"),
}
DEPTH = 300


class Context:
    """Four sequences at DEPTH tokens in a context loaded as serve loads it (unified: with --draft)."""

    def __init__(self, unified: bool, threads: int, model: str | None = None) -> None:
        from draft_vs_plain import PASSAGES, default_model

        from localinfer.batch.job import batch_load_options
        from localinfer.engine.backend import llama_cpp
        from localinfer.engine.model import LlamaModel
        from localinfer.engine.types import LoadOptions

        from localinfer.engine import model as model_module

        self.llama = llama_cpp
        opts = batch_load_options(LoadOptions(n_threads=threads, draft="ngram"), parallel=4, ctx_per_seq=1024)
        made = model_module.context_params

        def unified_params(options, n_ctx):  # serve's context, but one KV pool (llama-server's -kvu)
            cparams = made(options, n_ctx)
            cparams.kv_unified = True
            return cparams

        model_module.context_params = unified_params if unified else made
        try:
            self.model = LlamaModel(model or default_model(), opts)
        finally:
            model_module.context_params = made
        self.toks = self.model.tokenize(PASSAGES * 4)
        self.batch = llama_cpp.llama_batch_init(512, 0, 4)
        for s in range(4):
            self._fill([(s, 0, self.toks[:DEPTH], 0)])
            assert llama_cpp.llama_decode(self.model._ctx, self.batch) == 0

    def _fill(self, entries: list[tuple[int, int, list[int], int]]) -> None:
        batch, n = self.batch, 0
        for seq, first, tokens, logits in entries:
            for j, t in enumerate(tokens):
                batch.token[n], batch.pos[n], batch.n_seq_id[n], batch.logits[n] = t, first + j, 1, logits
                batch.seq_id[n][0] = seq
                n += 1
        batch.n_tokens = n

    def step(self, extra: tuple[int, ...]) -> tuple[float, float]:
        """One step with ``extra`` drafted rows per sequence: (wall, CPU) seconds; the rows then dropped."""
        llama, m, toks = self.llama, self.model, self.toks
        drafts = [e for e in extra if isinstance(e, int)]
        width = max(drafts) if "pad" in extra else 0
        entries = []
        for s, e in enumerate(drafts):
            entries.append((s, DEPTH, toks[DEPTH : DEPTH + 1 + e], 1))
            entries.append((s, DEPTH + 1 + e, toks[DEPTH + 1 + e : DEPTH + 1 + max(e, width)], 0))
        self._fill(entries)
        c, t = time.process_time(), time.perf_counter()
        assert llama.llama_decode(m._ctx, self.batch) == 0
        llama.llama_synchronize(m._ctx)
        took = time.perf_counter() - t, time.process_time() - c
        for s in range(4):
            llama.llama_memory_seq_rm(m._mem, s, DEPTH, -1)
        return took

    def logits(self) -> list[list[float]]:
        """The four sequences' logits after one plain step (the step then dropped)."""
        llama, m = self.llama, self.model
        self._fill([(s, DEPTH, self.toks[DEPTH : DEPTH + 1], 1) for s in range(4)])
        assert llama.llama_decode(m._ctx, self.batch) == 0
        rows = [llama.llama_get_logits_ith(m._ctx, i)[: m.n_vocab] for i in range(4)]
        for s in range(4):
            llama.llama_memory_seq_rm(m._mem, s, DEPTH, -1)
        return rows

    def close(self) -> None:
        self.llama.llama_batch_free(self.batch)
        self.model.close()


def measure(threads: int, trials: int, model: str | None) -> tuple[dict[bool, dict[str, tuple[float, float]]], list[str]]:
    """Both contexts loaded at once, every shape on each in turn per trial (the load hits all alike);
    and per sequence, how far the layouts' logits for one plain step lie apart."""
    ctxs = {unified: Context(unified, threads, model) for unified in (False, True)}
    apart = []
    for s, (a, b) in enumerate(zip(ctxs[False].logits(), ctxs[True].logits())):
        top_a, top_b = max(range(len(a)), key=a.__getitem__), max(range(len(b)), key=b.__getitem__)
        apart.append(f"sequence {s}: logits apart by {max(abs(x - y) for x, y in zip(a, b)):.4f} at most; "
                     f"top token {'the same' if top_a == top_b else 'DIFFERS'}")  # fmt: skip
    times = {u: {k: [] for k in SHAPES} for u in ctxs}
    for trial in range(trials):
        for name, extra in SHAPES.items():
            for u in (False, True) if trial % 2 == 0 else (True, False):
                times[u][name].append(ctxs[u].step(extra))
    for c in ctxs.values():
        c.close()
    return {u: {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in t.items()}
            for u, t in times.items()}, apart  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="a GGUF file (default: SmolLM2-135M Q4_1)")
    ap.add_argument("--trials", type=int, default=30)
    args = ap.parse_args()
    print(f"# {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, -t {args.threads}, {args.trials} trials, "
          f"depth {DEPTH}, {Path(args.model).name if args.model else 'SmolLM2-135M Q4_1'}; load {os.getloadavg()[0]:.2f}")  # fmt: skip
    got, apart = measure(args.threads, args.trials, args.model)
    base = got[False]["4 x 1 (plain)"][0]
    print(f"{'step':20s} rows  {'streams wall (cpu)':>26s}  {'unified wall (cpu)':>26s}   (x: streams' plain step)")
    for name, extra in SHAPES.items():
        cells = [f"{w * 1000:6.2f} ms x{w / base:.2f} ({c * 1000:6.1f})" for w, c in (got[u][name] for u in (False, True))]
        drafts = [e for e in extra if isinstance(e, int)]
        n_rows = 4 * (1 + max(drafts)) if "pad" in extra else 4 + sum(drafts)
        print(f"{name:20s} {n_rows:4d}  {cells[0]:>26s}  {cells[1]:>26s}")
    print("streams vs unified pool, the same plain step:", *apart, sep="\n  ")
    print(f"# load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
