#!/usr/bin/env python3
"""Image encode + prefill: localinfer's engine vs llama.cpp's own ``llama-mtmd-cli``, same model,
projector and image (issue 41's floor: ours >= 0.9 x native, as a rate).

The model is SmolLM2-135M; the projector is the tests' random LLaVA-style one (tests/projector.py)
at 224 px, patch 14: 256 image tokens. Each tool's own figures: ours ``image_encode_s + prefill_s``
(a fresh cache each time), llama-mtmd-cli's "mtmd batch encoding done in N ms" plus its
``llama_perf`` "prompt eval time" (every llama_decode of the prompt, text and image). Runs are
interleaved (ours, theirs, ours...) so that a busy machine weighs on both alike.

llama-mtmd-cli is not among build_native.sh's tools: build it beside them, or give its path
(``--cli``); it links the libmtmd and libllama built there.

    python benchmarks/vision_vs_mtmd_cli.py --cli /path/to/llama-mtmd-cli [-t 2] [-r 5]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

PROMPT = "What is in this picture?"


def theirs(cli: str, model: str, mmproj: Path, image: Path, threads: int) -> float:
    cmd = [cli, "-m", model, "--mmproj", str(mmproj), "--image", str(image), "-p", PROMPT, "-n", "1", "--temp", "0",
           "-t", str(threads), "-v"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600).stderr
    enc = re.search(r"mtmd batch encoding done in (\d+) ms", out)
    pp = re.search(r"prompt eval time =\s+([\d.]+) ms", out)
    if not enc or not pp:
        raise SystemExit(f"could not read llama-mtmd-cli's timings:\n{out[-2000:]}")
    return float(enc.group(1)) + float(pp.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", default=os.environ.get("LLAMA_MTMD_CLI", str(HERE / ".build" / "bin" / "llama-mtmd-cli")))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--reps", type=int, default=5)
    args = ap.parse_args()

    import numpy as np
    from PIL import Image as PILImage
    from models import smollm2_path
    from projector import write_projector

    from localinfer.request import images
    from localinfer.engine.types import LoadOptions
    from localinfer.request.sampling import SamplingOptions
    from localinfer.generate.loading import load
    from localinfer.generate.run import generate
    from localinfer.request.request import build
    from localinfer.store.resolve import resolve_model
    import dataclasses

    tmp = Path(tempfile.mkdtemp(prefix="vision-bench-"))
    mmproj = write_projector(tmp / "mmproj-224.gguf", image_size=224, patch=14)
    image = tmp / "noise.png"
    PILImage.fromarray(np.random.default_rng(5).integers(0, 255, (300, 400, 3)).astype(np.uint8)).save(image)
    model = str(smollm2_path())
    resolved = dataclasses.replace(resolve_model(model), mmproj=mmproj)
    loaded = load(resolved, LoadOptions(n_ctx=2048, n_threads=args.threads))
    picture = images.from_file(image)
    req = build(messages=[images.message("user", PROMPT, [picture])], sampling=SamplingOptions(temperature=0), max_tokens=1)

    ours_ms: list[float] = []
    theirs_ms: list[float] = []
    n_prompt = 0
    for _ in range(args.reps):
        loaded.model.reset()
        a = generate(loaded, req, lambda _t: None)
        ours_ms.append((a.stats.image_encode_s + a.stats.prefill_s) * 1000)
        n_prompt = a.stats.prompt_tokens
        theirs_ms.append(theirs(args.cli, model, mmproj, image, args.threads))
    loaded.close()
    o, t = statistics.median(ours_ms), statistics.median(theirs_ms)
    print(f"load: {os.getloadavg()[0]:.2f} (1 min); threads {args.threads}; reps {args.reps}; prompt {n_prompt} tokens, 256 of the image")
    print(f"localinfer    encode+prefill median {o:9.1f} ms  {[round(x) for x in ours_ms]}")
    print(f"llama-mtmd-cli encode+prefill median {t:9.1f} ms  {[round(x) for x in theirs_ms]}")
    print(f"rate ratio (native time / ours): {t / o:.3f}  (floor 0.9)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
