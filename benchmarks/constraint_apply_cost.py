#!/usr/bin/env python3
"""Per-token cost of the constraint's apply (engine/constrain.py) with the greedy shortcut and with the
whole mask, for each shape of structured_varied.py: the model's greedy answer (<= 48 tokens) is
replayed token by token, each time on the whole vocabulary with that token the best candidate.

    PYTHONPATH=src .venv/bin/python benchmarks/constraint_apply_cost.py [MODEL.gguf]
"""

from __future__ import annotations

import ctypes
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from structured_varied import SHAPES  # noqa: E402


def replay(constrain, compiled, tokens: list[int], n: int, greedy: bool) -> tuple[float, int, int, int]:  # type: ignore[no-untyped-def]
    """(median apply us, shortcuts, masks, tokens applied) over ``tokens``."""
    from localinfer.engine.backend import llama_cpp

    s = constrain.ConstraintSampler(compiled)
    s.greedy = greedy
    data = (llama_cpp.llama_token_data * n)()
    rows = np.frombuffer((ctypes.c_char * (n * 12)).from_address(ctypes.addressof(data)), dtype=np.float32).reshape(n, 3)
    times = []
    for t in tokens:
        rows[:, 0] = np.arange(n, dtype=np.int32).view(np.float32)
        rows[:, 1] = 0.0
        rows[t, 1] = 10.0
        cur = llama_cpp.llama_token_data_array(data, n, -1, False)
        t0 = time.perf_counter()
        s._apply(ctypes.pointer(cur))
        times.append(time.perf_counter() - t0)
        if s.error or not s.matcher.consume_token(t):
            break
    return statistics.median(times) * 1e6, s.shortcuts, s.masks, len(times)


def main() -> None:
    import localinfer
    from localinfer.engine import constrain
    from localinfer.request.structured import from_schema

    from serve_vs_native import default_model

    path = sys.argv[1] if len(sys.argv) > 1 else str(default_model())
    with localinfer.load(path, n_ctx=1024) as smol:
        model = smol.loaded.model
        for shape, (question, schema) in SHAPES.items():
            answer = smol.generate(question, json_schema=schema, temperature=0, max_tokens=48)
            tokens = model.tokenize(answer.text, add_special=False, parse_special=False)
            compiled = constrain.compile_for(model, from_schema(schema))
            fast, slow = (replay(constrain, compiled, tokens, model.n_vocab, g) for g in (True, False))
            print(f"{shape:<18} apply median: greedy shortcut {fast[0]:7.1f} us ({fast[1]} shortcuts, {fast[2]} masks)"
                  f"   whole mask {slow[0]:7.1f} us ({slow[2]} masks)   tokens {fast[3]}")  # fmt: skip


if __name__ == "__main__":
    main()
