#!/usr/bin/env python3
"""A text stream's decode rate in serve's batch engine, alone and while other requests' images are
encoded (issue 41: "other sequences keep decoding while an image is encoded").

One BatchDecoder of 2 sequences on SmolLM2-135M with a ViT-sized projector (the tests' random
LLaVA-style one, tests/projector.py, made 768 wide and ``--layers`` deep: SmolVLM-256M's shape is a
12-layer SigLIP-B beside SmolLM2; 224 px, patch 14: 256 image tokens). Sequence A streams; the
other slot runs ``--images`` requests one after another, each an image and 1 token to answer; A is
cancelled when they are done. Modes, interleaved round after round (a busy machine weighs on each
alike):

- ``alone``: A by itself (``-n`` tokens);
- ``worker``: images encoded on engine/vision_encode.py's worker (now);
- ``engine``: images encoded on the engine thread as they are admitted (before; emulated by making
  the worker's submit encode at once, on the calling thread).

Printed per mode (medians): A's tokens per second while an image was being encoded (A's tokens
streamed inside the encodes' time windows over those windows' length), A's overall rate, and the
encode time. The image's embeddings are decoded on the engine thread either way (a 256-token
prefill, which A waits for as it waits for any prompt's).

    python benchmarks/vision_stream.py [-t 1] [-n 64] [-r 3] [--images 3] [--layers 12]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

MODES = ("alone", "text", "worker", "engine")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-t", "--threads", type=int, default=1, help="llama.cpp's and the projector's threads each")
    ap.add_argument("-n", "--tokens", type=int, default=64, help="tokens A streams alone")
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("--images", type=int, default=3, help="image requests beside A per round")
    ap.add_argument("--layers", type=int, default=12, help="the projector's encoder layers")
    args = ap.parse_args()

    import projector
    from models import smollm2_path

    from localinfer.engine import vision
    from localinfer.engine.batch import BatchDecoder
    from localinfer.engine.types import LoadOptions, SeqJob
    from localinfer.engine.vision_encode import Encoding, ImageEncoder
    from localinfer.generate.loading import load
    from localinfer.generate.prepare import build_prompt
    from localinfer.request import images
    from localinfer.request.request import build
    from localinfer.request.sampling import SamplingOptions
    from localinfer.store.resolve import resolve_model

    projector.N_EMBD, projector.N_HEAD, projector.N_FF, projector.N_LAYER = 768, 12, 3072, args.layers
    tmp = Path(tempfile.mkdtemp(prefix="vision-stream-"))
    mmproj = projector.write_projector(tmp / "mmproj-vit.gguf", image_size=224, patch=14)
    resolved = dataclasses.replace(resolve_model(str(smollm2_path())), mmproj=mmproj)
    loaded = load(resolved, LoadOptions(n_ctx=4096, n_threads=args.threads, n_seq_max=2))
    mmproj.unlink()
    greedy = SamplingOptions(temperature=0)

    def tokens(text: str, pictures=()):
        req = build(messages=[images.message("user", text, list(pictures))], sampling=greedy)
        return build_prompt(loaded, req, n_ctx=loaded.model.n_ctx_seq)[0]

    stream = tokens("Tell me a long story about the sea.")
    pics = [images.from_bytes(projector.png(s, (300, 200)), f"{s}.png") for s in range(1, 9)]
    pic_prompts = [tokens(f"Picture {i}: what is in it?", [p]) for i, p in enumerate(pics)]

    real_submit, real_encode = ImageEncoder.submit, vision.encode_copy
    windows: list[tuple[float, float]] = []

    def timed_encode(pr, chunk):
        t0 = time.perf_counter()
        out = real_encode(pr, chunk)
        windows.append((t0, time.perf_counter()))
        return out

    def on_this_thread(self, media, start):  # the old way: encoded where it is admitted
        job = Encoding(media, start)
        for chunk in media.images_from(start):
            embd, spent = vision.encode_copy(media.projector, chunk)
            job.embds.append(embd)
            job.encode_s += spent
        job.done = True
        self.ready.set()
        return job

    vision.encode_copy = timed_encode

    def one_round(mode: str, k: int) -> tuple[float, float, float]:
        """A's rate during encodes, A's overall rate, the median encode (ms)."""
        ImageEncoder.submit = on_this_thread if mode == "engine" else real_submit
        windows.clear()
        stamps: list[float] = []
        ended: list[str] = []
        cancel = threading.Event()
        n = args.tokens if mode == "alone" else 100000
        a = SeqJob("a", stream, greedy, n, ignore_eos=True, cancel=cancel, on_text=lambda _p: stamps.append(time.perf_counter()))

        def source():
            yield a
            for i in range(0 if mode == "alone" else args.images):
                yield SeqJob(f"o{i}", pic_prompts[(k + i) % len(pic_prompts)], greedy, 1, cache_prompt=False)
                while f"o{i}" not in ended:
                    yield None
            if mode != "alone":
                cancel.set()  # the images are done: so is A

        with BatchDecoder(loaded.model, 2, keep_cache=True) as decoder:
            for r in decoder.run(source()):
                ended.append(r.key)
                if r.key == "a":
                    st = r.stats
        overall = (st.completion_tokens - 1) / st.decode_s if st.decode_s > 0 else 0.0  # 1 token: no rate
        if not windows:
            return overall, overall, 0.0
        inside = sum(any(t0 <= t <= t1 for t0, t1 in windows) for t in stamps)
        span = sum(t1 - t0 for t0, t1 in windows)
        return inside / span, overall, statistics.median(t1 - t0 for t0, t1 in windows) * 1000

    one_round("worker", 0)  # warm: the projector's graph, the caches
    modes = ("alone", "worker", "engine")
    rows: dict[str, list[tuple[float, float, float]]] = {m: [] for m in modes}
    for k in range(args.rounds):
        for mode in modes:
            rows[mode].append(one_round(mode, k))
    ImageEncoder.submit, vision.encode_copy = real_submit, real_encode
    loaded.close()

    alone = statistics.median(r[0] for r in rows["alone"])
    print(f"load: {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} cores; threads {args.threads} (llama.cpp and "
          f"the projector each); projector 768 wide, {args.layers} layers, 256 tokens an image; {args.images} images "
          f"a round; rounds {args.rounds}")  # fmt: skip
    for mode in modes:
        during = statistics.median(r[0] for r in rows[mode])
        overall = statistics.median(r[1] for r in rows[mode])
        enc = statistics.median(r[2] for r in rows[mode])
        label = "A alone" if mode == "alone" else "A while images encode"
        print(f"{mode:7s} {label:22s} {during:7.1f} tok/s  x{during / alone:5.2f} of alone   A overall {overall:6.1f} tok/s"
              + (f"   encode median {enc:7.1f} ms" if enc else "") + f"   {[round(r[0], 1) for r in rows[mode]]}")
    return 0


if __name__ == "__main__":
    start = time.time()
    code = main()
    print(f"took {time.time() - start:.0f} s")
    raise SystemExit(code)
