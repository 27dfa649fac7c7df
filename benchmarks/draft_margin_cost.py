#!/usr/bin/env python3
"""What the greedy margin rule (issue 52, engine/speculate.py GREEDY_MARGIN) costs: ``run --draft
ngram --temp 0`` on the copy task, this tree's code against a base revision's (default ``main``,
exported with ``git archive``), each run a process as the user runs it, the two alternating within
each round (the machine is shared); and the plain answer, to say whose text is the plain one.

Per round: decode tok/s of each side, their ratio (this tree / base), and the drafted-token
acceptance rate; the median ratio over rounds. Appended to benchmarks/results/draft-margin-DATE.txt
(--out FILE; --out - for stdout).

    .venv/bin/python benchmarks/draft_margin_cost.py                 # both models, -t 2, -n 160, 3 rounds
    .venv/bin/python benchmarks/draft_margin_cost.py --rounds 1 -n 32 --out -
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))


def run(src: Path, model: str, prompt: str, *, draft: bool, n: int, threads: int, raw: bool) -> dict:
    cmd = [sys.executable, "-m", "localinfer", "run", "-m", model, "--json", "--no-log", "--temp", "0",
           "-n", str(n), "-t", str(threads), "-c", "2048"] + (["--raw"] if raw else [])  # fmt: skip
    cmd += ["--draft", "ngram"] if draft else []
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([*cmd, prompt], capture_output=True, text=True, timeout=1800, env=env, stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        raise SystemExit(f"run failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--base", default="main", help="the revision whose code is 'before'")
    ap.add_argument("--models", nargs="+", default=["smollm2", "gemma"])
    ap.add_argument("--out", default=str(HERE / "results" / f"draft-margin-{dt.date.today()}.txt"))
    args = ap.parse_args()
    import draft_vs_plain as dvp
    import models as test_models

    lines = [f"# benchmarks/draft_margin_cost.py -t {args.threads} -n {args.n} --rounds {args.rounds} --base {args.base}; "
             f"load {os.getloadavg()[0]:.2f}"]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.base, "src"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        sides = {"before": base / "src", "after": ROOT / "src"}
        for name in args.models:
            raw = name == "gemma"
            model = str(test_models.gemma_path() if raw else test_models.smollm2_path())
            prompt = dvp.tasks(raw)["copy-text"]
            plain = run(sides["after"], model, prompt, draft=False, n=args.n, threads=args.threads, raw=raw)
            ratios = []
            for r in range(args.rounds):
                got = {}
                for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
                    got[side] = run(sides[side], model, prompt, draft=True, n=args.n, threads=args.threads, raw=raw)
                parts = []
                for side in ("before", "after"):
                    t = got[side]["timings"]
                    rate = t["draft_accepted_tokens"] / max(1, t["draft_tokens"])
                    same = "plain's text" if got[side]["text"] == plain["text"] else "TEXT DIFFERS from plain"
                    parts.append(f"{side} {t['decode_tokens_per_s']:.2f} tok/s, {t['draft_accepted_tokens']}/{t['draft_tokens']} "
                                 f"drafted kept ({rate:.0%}), {same}")  # fmt: skip
                ratio = got["after"]["timings"]["decode_tokens_per_s"] / got["before"]["timings"]["decode_tokens_per_s"]
                ratios.append(ratio)
                lines.append(f"{name} copy-text round {r + 1}: " + "; ".join(parts) + f"; after/before {ratio:.3f}")
                print(lines[-1], file=sys.stderr, flush=True)
            lines.append(f"{name} copy-text: after/before decode tok/s, median of {len(ratios)}: {statistics.median(ratios):.3f} "
                         f"(plain: {plain['timings']['decode_tokens_per_s']:.2f} tok/s)")  # fmt: skip
    lines.append(f"# load after: {os.getloadavg()[0]:.2f}")
    text = "\n".join(lines) + "\n"
    if args.out == "-":
        sys.stdout.write(text)
    else:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write("\n" + text)
        print(text)


if __name__ == "__main__":
    main()
