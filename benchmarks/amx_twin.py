#!/usr/bin/env python3
"""Could decode use AMX on CPUs where the AMX batch kernels crash? A measurement, not a feature.

On this build (GCC 12, llama.cpp 0c1e570) weights repacked for AMX crash on any matmul with more
than one row (a prompt), so the engine loads them unrepacked there. A single-token decode takes
AMX's VNNI path, which works and is about twice as fast. This script measures the "twin" design:
the prompt is evaluated by the model loaded as usual (A), the sequence's KV cache is copied with
llama_state_seq_get_data/set_data into a context of the same model loaded with repacking (B), and
decoding continues there. It reports B's extra load time and memory, the copy, and decode t/s of
A alone against A -> B, greedy, same prompt; and where the two texts part (the AMX path rounds
differently, so the same seed gives a different text).

    .venv/bin/python benchmarks/amx_twin.py [-t 2] [-n 128] [--reps 3]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import native  # noqa: E402

PROMPT = "<|im_start|>user\nWrite a long story about a robot who learns to paint.<|im_end|>\n<|im_start|>assistant\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", "-m", default=None)
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("-n", type=int, default=128, help="tokens generated")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    model_path = (args.model or native.default_model()).encode()

    from localinfer.engine.backend import cpu_has_amx, ensure_backend, llama_cpp as lc

    if not cpu_has_amx():
        print("this CPU has no AMX: nothing to measure")
        return 0
    ensure_backend(False)
    clock = time.perf_counter

    def load(repack: bool):  # noqa: ANN202
        mp = lc.llama_model_default_params()
        mp.use_extra_bufts = repack
        t0 = clock()
        model = lc.llama_model_load_from_file(model_path, mp)
        cp = lc.llama_context_default_params()
        cp.n_ctx, cp.n_threads, cp.n_threads_batch, cp.no_perf = 4096, args.threads, args.threads, True
        ctx = lc.llama_init_from_model(model, cp)
        return model, ctx, clock() - t0, lc.llama_model_size(model)

    model_a, ctx_a, load_a, size_a = load(False)
    _, ctx_b, load_b, size_b = load(True)
    vocab = lc.llama_model_get_vocab(model_a)
    raw = PROMPT.encode()
    arr = (lc.llama_token * 512)()
    n_prompt = lc.llama_tokenize(vocab, raw, len(raw), arr, 512, True, True)
    prompt = (lc.llama_token * n_prompt)(*arr[:n_prompt])
    one = (lc.llama_token * 1)()
    piece = ctypes.create_string_buffer(64)

    def generate(decode_ctx) -> tuple[bytes, float, float]:  # noqa: ANN001
        for ctx in (ctx_a, ctx_b):
            lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
        assert lc.llama_decode(ctx_a, lc.llama_batch_get_one(prompt, n_prompt)) == 0
        chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_greedy())
        token = lc.llama_sampler_sample(chain, ctx_a, -1)
        copy_s = 0.0
        if decode_ctx is not ctx_a:
            t0 = clock()
            size = lc.llama_state_seq_get_size(ctx_a, 0)
            buf = (ctypes.c_uint8 * size)()
            got = lc.llama_state_seq_get_data(ctx_a, buf, size, 0)
            assert lc.llama_state_seq_set_data(decode_ctx, buf, got, 0) == got
            copy_s = clock() - t0
        out = []
        t0 = clock()
        for _ in range(args.n - 1):
            k = lc.llama_token_to_piece(vocab, token, piece, len(piece), 0, False)
            out.append(piece.raw[:k])
            one[0] = token
            assert lc.llama_decode(decode_ctx, lc.llama_batch_get_one(one, 1)) == 0
            token = lc.llama_sampler_sample(chain, decode_ctx, -1)
        rate = (args.n - 1) / (clock() - t0)
        lc.llama_sampler_free(chain)
        return b"".join(out), rate, copy_s

    rows = {"A alone": [], "A -> B": []}
    copies = []
    for _ in range(args.reps):
        text_a, rate_a, _ = generate(ctx_a)
        text_b, rate_b, copy_s = generate(ctx_b)
        rows["A alone"].append(rate_a)
        rows["A -> B"].append(rate_b)
        copies.append(copy_s)
    part = next((i for i, (x, y) in enumerate(zip(text_a, text_b)) if x != y), None)
    print(f"model {model_path.decode()}, -t {args.threads}, prompt {n_prompt} tokens, {args.n} generated, {args.reps} reps")
    print(f"load + context: A {load_a * 1000:.0f} ms, B (repacked for AMX) {load_b * 1000:.0f} ms; "
          f"weights A {size_a / 2**20:.0f} MiB (mapped), B {size_b / 2**20:.0f} MiB (a second copy)")
    print(f"KV copy A -> B after the prompt: {statistics.median(copies) * 1000:.2f} ms")
    for name, rates in rows.items():
        print(f"decode {name}: {statistics.median(rates):.1f} tok/s")
    print(f"decode A -> B / A alone: {statistics.median(rows['A -> B']) / statistics.median(rows['A alone']):.2f}x")
    print("texts: identical" if part is None else f"texts part at byte {part} (AMX rounds differently)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
