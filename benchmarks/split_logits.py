#!/usr/bin/env python3
"""Does the way a prompt is split into batches change its last token's logits? (issue 50: greedy answers
with the prompt cache and with ``cache_prompt: false``.)

A prompt found whole in the cache has its last token evaluated alone; a cold one evaluates it in a
batch with the rest. Here the same prompt (~360 tokens on SmolLM2) is evaluated in one batch, then
with its last k tokens in a batch of their own, on llama.cpp's own context (the bindings' low-level
API, no localinfer code), and the last token's logits compared: flash attention ``auto`` (on, on CPU)
and ``off``. On a 2-core AVX2 EPYC (benchmarks/results/split-logits-2026-12-07.txt): with it on,
k = 1..48 differ by up to 0.7, k >= 64 are bit-equal; with it off every k is bit-equal here (on a
~60-token prompt k = 1 differed by 0.49).

    .venv/bin/python benchmarks/split_logits.py 2>/dev/null     # -t 1 (llama.cpp's log on stderr)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from serve_vs_native import default_model  # noqa: E402

TEXT = ("<|im_start|>system\n" + "You are a careful assistant who explains arithmetic step by step. " * 25
        + "You can call tools. Respond in JSON.<|im_end|>\n<|im_start|>user\nWhat is 17 plus 25?<|im_end|>\n"
        '<|im_start|>assistant\n{"tool_calls": [{"name": "add", "arguments": {"a": ')  # fmt: skip


def main() -> None:
    import llama_cpp as L
    import numpy as np

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("-t", "--threads", type=int, default=1)
    args = ap.parse_args()
    L.llama_backend_init()
    model = L.llama_model_load_from_file(str(args.model or default_model()).encode(), L.llama_model_default_params())
    vocab = L.llama_model_get_vocab(model)
    buf = (L.llama_token * 1024)()
    n = L.llama_tokenize(vocab, TEXT.encode(), len(TEXT.encode()), buf, 1024, True, True)
    tokens = list(buf[:n])

    def last_logits(fa: int, split: int) -> np.ndarray:
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.no_perf = 1024, 512, 512, True
        cp.n_threads = cp.n_threads_batch = args.threads
        cp.flash_attn_type = fa
        ctx = L.llama_init_from_model(model, cp)
        for a, b in ((0, split), (split, n)) if split else ((0, n),):
            batch = L.llama_batch_init(b - a, 0, 1)
            for i, t in enumerate(tokens[a:b]):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, a + i, 1, a + i == n - 1
                batch.seq_id[i][0] = 0
            batch.n_tokens = b - a
            assert L.llama_decode(ctx, batch) == 0
            L.llama_batch_free(batch)
        out = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(L.llama_vocab_n_tokens(vocab),)).copy()
        L.llama_free(ctx)
        return out

    print(f"# split_logits: {n}-token prompt, -t {args.threads}; max |logit - one batch's| of the last token")
    for name, fa in (("auto", L.LLAMA_FLASH_ATTN_TYPE_AUTO), ("off", L.LLAMA_FLASH_ATTN_TYPE_DISABLED)):
        whole = last_logits(fa, 0)
        row = [f"k={k}: {np.abs(last_logits(fa, n - k) - whole).max():.2g}" for k in (1, 2, 8, 32, 48, 64, 128, 200)]
        print(f"flash attention {name:4}  " + "  ".join(row))


if __name__ == "__main__":
    main()
