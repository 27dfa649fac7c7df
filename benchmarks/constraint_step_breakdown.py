#!/usr/bin/env python3
"""Where a decoding step goes with N constrained sequences (issue 27's serve floor, without HTTP).

One BatchDecoder (the one serve runs) decodes --parallel chat requests together, each under one of
structured_serve_vs_native.py's nested schemas, greedy, at most -n tokens; then the same requests
unconstrained; alternating, --pairs times. Per decode-only step (every sequence generating, no
prompt in the batch), medians over the steps with all N sequences active:

* step:          from filling the batch to the end of sampling (BatchStats' decode-only step)
* llama_decode:  inside llama_decode
* sample:        the rest: the N llama_sampler_sample calls and our Python around them
* of which, per constrained token: the constraint's apply (mask + masking the candidates) and
  accept (the matcher advanced), and how many tokens needed the whole mask at all

    PYTHONPATH=src .venv/bin/python benchmarks/constraint_step_breakdown.py [-t 2] [--pairs 3] [-n 192]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from structured_serve_vs_native import SCHEMAS  # noqa: E402


def _model_path(arg: str | None) -> str:
    if arg:
        return arg
    from models import smollm2_path

    return str(smollm2_path())


def _timed(cls: type, name: str, bucket: list[float]) -> None:
    """Wrap cls.name to add each call's seconds to bucket."""
    inner = getattr(cls, name)
    clock = time.perf_counter

    def wrapper(self, *a):  # type: ignore[no-untyped-def]
        t0 = clock()
        try:
            return inner(self, *a)
        finally:
            bucket.append(clock() - t0)

    setattr(cls, name, wrapper)


def run_once(model, decoder, prompts, formats, n_tokens, constrained: bool, probes: dict) -> dict:  # type: ignore[no-untyped-def]
    from localinfer.engine.batch import BatchDecoder
    from localinfer.engine.types import SeqJob
    from localinfer.request.sampling import SamplingOptions

    greedy = SamplingOptions(temperature=0.0)
    jobs = [SeqJob(i, toks, greedy, n_tokens, (), False, constraint=fmt if constrained else None)
            for i, (toks, fmt) in enumerate(zip(prompts, formats))]  # fmt: skip
    steps: list[tuple[float, float, int]] = []  # (step s, llama_decode s, active) of decode-only steps
    orig_step = BatchDecoder._step

    def step(self, active):  # type: ignore[no-untyped-def]
        st = self.stats
        n_active, before = len(active), (st.decode_only_steps, st.decode_only_s, st.decode_only_llama_s)
        out = orig_step(self, active)
        if st.decode_only_steps > before[0]:
            steps.append((st.decode_only_s - before[1], st.decode_only_llama_s - before[2], n_active))
        return out

    for v in probes.values():
        v.clear()
    BatchDecoder._step = step
    try:
        t0 = time.perf_counter()
        results = list(decoder.run(jobs))
        wall = time.perf_counter() - t0
    finally:
        BatchDecoder._step = orig_step
    full = [s for s in steps if s[2] == len(jobs)]
    tokens = sum(r.stats.completion_tokens for r in results)
    valid = sum(_valid(r.text, json.loads(f.text)) for r, f in zip(sorted(results, key=lambda r: r.key), formats))
    return {
        "constrained": constrained, "tokens": tokens, "wall_s": wall, "tps": tokens / wall,
        "full_steps": len(full),
        "step_ms": 1e3 * statistics.median(s[0] for s in full) if full else None,
        "llama_ms": 1e3 * statistics.median(s[1] for s in full) if full else None,
        "sample_ms": 1e3 * statistics.median(s[0] - s[1] for s in full) if full else None,
        "apply_us": 1e6 * statistics.median(probes["apply"]) if probes["apply"] else None,
        "accept_us": 1e6 * statistics.median(probes["accept"]) if probes["accept"] else None,
        "applies": len(probes["apply"]), "masks": sum(probes["masks"]),
        "valid": valid if constrained else None,
    }  # fmt: skip


def _valid(text: str, schema: dict) -> bool:
    try:
        import jsonschema

        jsonschema.validate(json.loads(text), schema)
        return True
    except Exception:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", "-m")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-np", "--parallel", type=int, default=4)
    ap.add_argument("-n", "--tokens", type=int, default=192)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--no-plain", action="store_true", help="the constrained runs only")
    args = ap.parse_args()

    from localinfer.engine import constrain
    from localinfer.engine.batch import BatchDecoder
    from localinfer.engine.model import LlamaModel
    from localinfer.engine.types import LoadOptions
    from localinfer.request.structured import from_schema

    model = LlamaModel(_model_path(args.model), LoadOptions(n_ctx=1024 * args.parallel, n_threads=args.threads,
                                                       n_seq_max=args.parallel))  # fmt: skip
    probes: dict[str, list] = {"apply": [], "accept": [], "masks": []}
    _timed(constrain.ConstraintSampler, "_apply", probes["apply"])
    _timed(constrain.ConstraintSampler, "_accept", probes["accept"])
    compute = constrain.ConstraintSampler.__dict__.get("_mask")
    if compute is not None:  # count the whole masks computed (the rest took a shortcut)
        def counted(self, *a):  # type: ignore[no-untyped-def]
            probes["masks"].append(1)
            return compute(self, *a)

        constrain.ConstraintSampler._mask = counted
    prompts, formats = [], []
    for i in range(args.parallel):
        _, question, schema = SCHEMAS[i % len(SCHEMAS)]
        text = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
        prompts.append(model.tokenize(text, add_special=False, parse_special=True))
        formats.append(from_schema(schema))
    for f in formats:
        constrain.compile_for(model, f)
    print(f"# constraint_step_breakdown: {Path(_model_path(args.model)).name}, -t {args.threads}, "
          f"{args.parallel} sequences, <= {args.tokens} tokens, greedy; load {os.getloadavg()[0]:.2f}")  # fmt: skip
    rows = []
    with BatchDecoder(model, args.parallel) as decoder:
        for p in range(args.pairs):
            for constrained in (True,) if args.no_plain else (True, False) if p % 2 == 0 else (False, True):
                row = run_once(model, decoder, prompts, formats, args.tokens, constrained, probes)
                rows.append(row)
                print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
    print(f"# load {os.getloadavg()[0]:.2f} at the end; medians over runs:")
    for constrained in (True, False):
        sel = [r for r in rows if r["constrained"] is constrained]
        if not sel:
            continue

        def med(key: str, sel=sel) -> float:
            vals = [r[key] for r in sel if r[key] is not None]
            return statistics.median(vals) if vals else float("nan")

        line = (f"{'constrained' if constrained else 'plain':<12} step {med('step_ms'):7.2f} ms  llama_decode "
                f"{med('llama_ms'):7.2f} ms  sample {med('sample_ms'):6.3f} ms  tok/s {med('tps'):6.1f}")  # fmt: skip
        if constrained:
            line += (f"  apply {med('apply_us'):6.1f} us  accept {med('accept_us'):5.1f} us  masks/applies "
                     f"{med('masks'):.0f}/{med('applies'):.0f}  valid {min(r['valid'] for r in sel)}/{args.parallel}")  # fmt: skip
        print(line)
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
