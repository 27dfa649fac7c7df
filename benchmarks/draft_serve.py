#!/usr/bin/env python3
"""Speculative decoding where sequences share a batch (issue 39): serve's engine with and without
``--draft ngram``, and one request against llama-server's n-gram ``--spec-type``s.

``engine``: 4 sequences at once in one BatchDecoder (serve's engine, in process), each side loaded as
``serve -np 4`` and ``serve -np 4 --draft ngram`` load it, copy-heavy
chat prompts (and, with ``--free``, free-writing ones), greedy; rounds alternate plain and drafted runs
so the load of a shared machine weighs on both; per run the aggregate decode tok/s (decode-only
steps, BatchStats.decode_tps), the wall time and the process's CPU time; the texts compared.
Floor: aggregate >= 1.1 x without drafting on the copy-heavy prompts.

``native``: one copy-heavy greedy request to ``localinfer serve --draft ngram`` and to llama-server
with ``--spec-type`` none, ngram-simple, ngram-map-k, ngram-mod (each started alone, -np 1, the same
threads and context): predicted tok/s and drafted / accepted tokens from each one's ``timings``.
Floor: ours >= 1.0 x llama-server's best n-gram type.

    PYTHONPATH=src .venv/bin/python benchmarks/draft_serve.py engine -t 1 --rounds 3
    PYTHONPATH=src .venv/bin/python benchmarks/draft_serve.py native -t 1
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
NATIVE = Path(os.environ.get("LLAMA_BIN", "/work/main/benchmarks/.build/bin"))


def _prompts(model, free: bool, raw: bool = False) -> dict[str, list[int]]:
    from draft_vs_plain import PASSAGES, prompt_tokens, tasks

    texts = {"copy-module": tasks(raw)["copy-module"], "rag-quote": tasks(raw)["rag-quote"],
             "rag-2": f"{PASSAGES}\n\nQuote, word for word, the passage about the warship.",
             "rag-3": f"{PASSAGES}\n\nQuote, word for word, the passage about the tardigrade."}  # fmt: skip
    if raw:  # a base model: plain completions worded to copy (draft_vs_plain.tasks)
        texts["rag-2"] = f"{PASSAGES}\n\nThe passage about the warship, quoted word for word:\n\n"
        texts["rag-3"] = f"{PASSAGES}\n\nThe passage about the tardigrade, quoted word for word:\n\n"
    if free:
        texts = {"free-robot": "Write a short story about a robot who learns to paint.",
                 "free-sea": "Write a poem about the sea at night.", "free-city": "Describe a city in the year 3000.",
                 "free-cook": "Explain how to bake bread to a child."}  # fmt: skip
    return {k: prompt_tokens(model, text, raw) for k, text in texts.items()}


def engine(args: argparse.Namespace) -> list[str]:
    from draft_vs_plain import default_model

    from localinfer.generate import loading
    from localinfer.batch import job as batchjob
    from localinfer.engine.batch import BatchDecoder, SeqJob
    from localinfer.engine.types import LoadOptions
    from localinfer.request.sampling import SamplingOptions
    from localinfer.store import resolve_model

    # as `serve -np 4` and `serve -np 4 --draft ngram` load it
    loads = {draft: loading.load(resolve_model(args.model or default_model()), batchjob.batch_load_options(
        LoadOptions(n_threads=args.threads, draft="ngram" if draft else None), parallel=4, ctx_per_seq=1024))
        for draft in (False, True)}  # fmt: skip
    prompts = _prompts(loads[False].model, args.free, args.raw)
    greedy = SamplingOptions(temperature=0)
    lines = [f"# engine, 4 sequences ({', '.join(prompts)}), {args.requests} request(s) per client, -t {args.threads}, "
             f"-n {args.n}; uptime: {_uptime()}"]  # fmt: skip
    ratios, cpu_ratios, texts = [], [], {}
    for r in range(args.rounds):
        got = {}
        for draft in (False, True) if r % 2 == 0 else (True, False):
            # each client sends its next request as soon as its last one is answered (--requests of them)
            jobs = [SeqJob(f"{k}#{i}", p, greedy, max_tokens=args.n) for i in range(args.requests) for k, p in prompts.items()]
            t, c = time.perf_counter(), time.process_time()
            with BatchDecoder(loads[draft].model, 4, keep_cache=True) as dec:
                res = {x.key: x for x in dec.run(jobs)}
            wall, cpu = time.perf_counter() - t, time.process_time() - c
            tokens = sum(x.stats.completion_tokens for x in res.values())
            # aggregate tok/s: decode-only steps (llama-batched-bench's S_TG); with --requests > 1 the
            # answers' tokens over the whole run's wall time (new requests' prefill shares steps)
            tps = dec.stats.decode_tps or 0.0 if args.requests == 1 else tokens / wall
            got[draft] = (tps, wall, cpu, tokens, dec.stats)
            texts.setdefault(draft, []).append({k: x.text for k, x in res.items()})
        (p, pw, pc, pt, _), (s, sw, sc, st, stats) = got[False], got[True]
        ratios.append(s / p)
        cpu_ratios.append((st / sc) / (pt / pc))
        lines.append(f"round {r + 1}: plain {p:.2f} tok/s (wall {pw:.1f} s, cpu {pc:.1f} s, {pt} tokens); "
                     f"draft {s:.2f} tok/s (wall {sw:.1f} s, cpu {sc:.1f} s, {st} tokens), drafted {stats.draft_tokens}, "
                     f"kept {stats.draft_accepted}; ratio {s / p:.3f}, tokens per cpu-s ratio {cpu_ratios[-1]:.3f}; "
                     f"load {os.getloadavg()[0]:.2f}")  # fmt: skip
        print(lines[-1], file=sys.stderr)
    same = all(a == b for a, b in zip(texts[False], texts[True]))
    for r, (a, b) in enumerate(zip(texts[False], texts[True])):
        for k in a:
            if a[k] != b[k]:  # where (a greedy tie that batch shapes round apart, or not: diag with logprobs)
                at = next((i for i, (x, y) in enumerate(zip(a[k], b[k])) if x != y), min(len(a[k]), len(b[k])))
                lines.append(f"round {r + 1}: {k} differs at character {at}: {a[k][at:at + 30]!r} vs {b[k][at:at + 30]!r}")
    lines.append(f"median ratio {statistics.median(ratios):.3f} (decode tok/s), {statistics.median(cpu_ratios):.3f} "
                 f"(tokens per CPU second); texts {'the same' if same else 'DIFFER'}; uptime: {_uptime()}")  # fmt: skip
    for loaded in loads.values():
        loaded.close()
    return lines


def _uptime() -> str:
    return os.popen("uptime").read().strip()


def _post(port: int, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=900) as f:
        return json.loads(f.read())


def _wait(proc: subprocess.Popen, port: int, timeout: float = 300) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as f:
                if f.status == 200:
                    return
        except Exception:
            time.sleep(0.5)
    raise SystemExit("server not ready")


def native(args: argparse.Namespace) -> list[str]:
    from draft_vs_plain import default_model, tasks

    model = args.model or default_model()
    body = {"messages": [{"role": "user", "content": tasks()[args.task]}], "max_tokens": args.n, "temperature": 0}
    common = ["-m", model, "-t", str(args.threads), "-c", "2048", "-np", "1", "--host", "127.0.0.1"]
    runs: list[tuple[str, list[str]]] = [(f"llama-server {s}", [str(NATIVE / "llama-server"), *common, "--spec-type", s])
                                         for s in ("none", "ngram-simple", "ngram-map-k", "ngram-mod")]  # fmt: skip
    ours = [sys.executable, "-m", "localinfer", "serve", "-m", model, "-t", str(args.threads), "-c", "2048", "-np", "1", "--no-log"]
    runs += [("localinfer serve", ours), ("localinfer serve --draft ngram", [*ours, "--draft", "ngram"])]
    lines = [f"# native, {args.task}, -t {args.threads}, -n {args.n}, greedy; uptime: {_uptime()}"]
    env = {**os.environ, "LD_LIBRARY_PATH": str(NATIVE)}
    for rnd in range(args.rounds):
        for name, cmd in runs if rnd % 2 == 0 else runs[::-1]:
            port = 18700 + rnd * 10 + runs.index((name, cmd))
            proc = subprocess.Popen([*cmd, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            try:
                _wait(proc, port)
                ans = _post(port, body)
                t = ans.get("timings", {})
                text = ans["choices"][0]["message"]["content"]
                lines.append(f"round {rnd + 1} {name}: {t.get('predicted_per_second', 0):.2f} tok/s, {t.get('predicted_n')} tokens, "
                             f"drafted {t.get('draft_n', '-')}, kept {t.get('draft_n_accepted', '-')}; text {len(text)} chars "
                             f"{_digest(text)}; load {os.getloadavg()[0]:.2f}")  # fmt: skip
                print(lines[-1], file=sys.stderr)
            finally:
                proc.terminate()
                proc.wait(30)
    return lines


def _digest(text: str) -> str:
    import hashlib

    return hashlib.sha1(re.sub(r"\s+$", "", text).encode()).hexdigest()[:8]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("engine", "native"))
    ap.add_argument("--model", default=None)
    ap.add_argument("-n", type=int, default=120)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--free", action="store_true", help="engine: free-writing prompts instead of copy-heavy ones")
    ap.add_argument("--raw", action="store_true", help="engine: plain completions, for a base model (Gemma-3-270M)")
    ap.add_argument("--requests", type=int, default=1, help="engine: requests per client, each sent when the last is answered")
    ap.add_argument("--task", default="rag-quote", help="native: the draft_vs_plain task to send")
    args = ap.parse_args()
    lines = engine(args) if args.what == "engine" else native(args)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
