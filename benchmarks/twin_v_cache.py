#!/usr/bin/env python3
"""Which KV cache should the AMX decoding twin keep? Decode speed by depth, and what it does to the output.

The twin (engine.twin) decodes one token at a time on weights repacked for AMX. ggml's CPU flash
attention accumulates an F16 V cache's weighted sum in F16, converting each value on the way in and
out; with a BF16 V cache it converts with native AVX512-BF16 instructions and accumulates in F32.
This script measures, on the twin's own contexts:

1. speed: tokens/s of back-to-back single-token decodes (no sampling), ``-n`` tokens from depths
   ``--depths``, for each configuration (K type / V type / flash attention), rounds interleaved;
2. output: the next-token distributions over ``--tokens`` tokens of real text (this repository's
   README), each configuration against a reference with an F32 cache and no flash attention (the
   most exact ggml computes): mean and 99th-percentile KL divergence, top-1 agreement, and the
   text's negative log-likelihood. F16 against the reference is the bar: a configuration as close
   to the reference as F16 loses nothing F16 had.

    .venv/bin/python benchmarks/twin_v_cache.py [-m MODEL] [-t 2] [--rounds 3] [--depths 0,48,200,450,600]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import native  # noqa: E402

F32, F16, BF16 = 0, 1, 30
NAMES = {F32: "f32", F16: "f16", BF16: "bf16"}
# (K type, V type, flash attention): what the twin used before (f16 with and without flash
# attention), what it uses now (bf16 V with flash attention), and the neighbours
SPEED = [(F16, F16, True), (F16, F16, False), (F16, BF16, True), (BF16, BF16, True), (F16, BF16, False)]
OUTPUT = [(F16, F16, True), (F16, F16, False), (F16, BF16, True), (F16, F32, False)]
REFERENCE = (F32, F32, False)


def label(cfg: tuple[int, int, bool]) -> str:
    return f"K {NAMES[cfg[0]]} V {NAMES[cfg[1]]} FA {'on' if cfg[2] else 'off'}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", "-m", default=None)
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("-n", type=int, default=128, help="tokens decoded per speed trial")
    ap.add_argument("--depths", default="0,48,200,450,600")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=800, help="tokens of text for the output comparison")
    ap.add_argument("--only", default="speed,output")
    args = ap.parse_args()
    model_path = args.model or str(native.default_model())

    import numpy as np

    from localinfer.engine import twin as T
    from localinfer.engine.backend import cpu_has_amx, cpu_has_avx512_bf16, llama_cpp
    from localinfer.engine.llama import Model
    from localinfer.engine.types import LoadOptions

    if not cpu_has_amx():
        print("this CPU has no AMX: the engine has no decoding twin here")
        return 0
    print(f"model: {model_path}\nthreads {args.threads}, AVX512-BF16: {cpu_has_avx512_bf16()}")
    depths = [int(d) for d in args.depths.split(",")]
    text = (HERE.parent / "README.md").read_text(encoding="utf-8")
    m = Model(model_path, LoadOptions(n_threads=args.threads, n_ctx=4096))
    m.prepare_decode_twin()
    tw = m._twin
    assert tw is not None and tw.ready(), "the twin did not load"
    tokens = m.tokenize(text)
    one = (llama_cpp.llama_token * 1)()
    batch = llama_cpp.llama_batch_get_one(one, 1)

    def context(cfg: tuple[int, int, bool], n_ctx: int) -> None:
        settings = T.decode_settings(m._params[1], n_ctx, cfg[2])
        settings.type_k, settings.type_v = cfg[0], cfg[1]
        if cfg[2]:
            settings.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        assert tw.remake(settings), f"no context for {label(cfg)}"

    def decode(token: int) -> None:
        one[0] = token
        assert llama_cpp.llama_decode(tw.ctx, batch) == 0

    if "speed" in args.only:
        rates: dict[tuple, list[float]] = {}
        for r in range(args.rounds):
            for depth in depths:
                for cfg in SPEED:
                    context(cfg, -(-(depth + args.n + 1) // 256) * 256)  # sized as the twin sizes it
                    for t in tokens[:depth]:
                        decode(t)
                    t0 = time.perf_counter()
                    for t in tokens[depth : depth + args.n]:
                        decode(t)
                    rates.setdefault((depth, cfg), []).append(args.n / (time.perf_counter() - t0))
            print(f"speed round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        base = SPEED[1]  # F16 without flash attention: the twin's choice before BF16
        print(f"\n## decode tokens/s, tg{args.n} from each depth (median of {args.rounds} rounds; ratio to {label(base)})\n")
        print("| depth | " + " | ".join(label(c) for c in SPEED) + " |")
        print("|---:|" + "---:|" * len(SPEED))
        for depth in depths:
            b = statistics.median(rates[(depth, base)])
            cells = [f"{statistics.median(rates[(depth, c)]):.1f} ({statistics.median(rates[(depth, c)]) / b:.2f})" for c in SPEED]
            print(f"| {depth} | " + " | ".join(cells) + " |")

    if "output" in args.only:
        sample = tokens[: args.tokens]
        n_vocab = m.n_vocab

        def log_probs(cfg: tuple[int, int, bool]) -> np.ndarray:
            context(cfg, -(-(len(sample) + 1) // 256) * 256)
            out = np.empty((len(sample), n_vocab), np.float64)
            for i, t in enumerate(sample):
                decode(t)
                out[i] = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(tw.ctx, -1), shape=(n_vocab,))
            out -= out.max(axis=1, keepdims=True)
            return out - np.log(np.exp(out).sum(axis=1, keepdims=True))

        ref = log_probs(REFERENCE)
        p_ref = np.exp(ref)
        following = np.array(sample[1:])
        print(f"\n## next-token distributions over {len(sample)} tokens of README.md, against {label(REFERENCE)}\n")
        print("| configuration | KL mean | KL p99 | top-1 agreement | NLL of the text |")
        print("|---|---:|---:|---:|---:|")
        for cfg in [REFERENCE, *OUTPUT]:
            lp = ref if cfg == REFERENCE else log_probs(cfg)
            kl = (p_ref * (ref - lp)).sum(axis=1)
            top1 = float((ref.argmax(axis=1) == lp.argmax(axis=1)).mean())
            nll = float(-lp[np.arange(len(sample) - 1), following].mean())
            print(f"| {label(cfg)} | {kl.mean():.2e} | {np.quantile(kl, 0.99):.2e} | {top1:.4f} | {nll:.4f} |")
    m.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
