#!/usr/bin/env python3
"""A chat that resends the model's own answers, each turn with the prompt cache and again with
``cache_prompt: false``: whether the greedy answers agree, and what each turn evaluates and costs.

Issue 50 asks that greedy answers be the same with the cache as without. llama.cpp computes a row
otherwise in a ubatch of fewer than 64 rows of its sequence (``benchmarks/split_logits.py``), so a
cache that reuses a prompt's start, or an answer's cells (decoded a row at a time), can turn a later
answer. serve evaluates a prompt in pieces of at least 64 rows, leaves at least the last 64 to
evaluate on a hit and keeps only prompt cells (``engine/rows.py``); llama-server, with its cache, is
the reference: it reuses both.

Each server gets one session of ``--turns`` turns (a ~750-token system prompt, then short questions;
each turn holds the answers before it as the model gave them with the cache), then the same messages
with ``cache_prompt: false``, turn by turn. Per turn: prompt tokens, cached (``timings.cache_n``),
evaluated (``timings.prompt_n``), prefill ms, the answer's opening words.

    benchmarks/build_native.sh                            # llama-server, once (--no-native: serve alone)
    .venv/bin/python benchmarks/cache_exact.py --out benchmarks/results/cache-exact-DATE.txt
"""

from __future__ import annotations

import argparse
import http.client
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from serve_vs_native import NATIVE_BIN, Server, default_model, free_port  # noqa: E402

SYSTEM = "You are a careful assistant. " + " ".join(f"Rule {i}: answer in plain words about topic {i}." for i in range(50))
QUESTIONS = ["Name a colour and say why you like it.", "And another one?", "Which of the two is warmer?", "Say it in one word.",
             "Thanks. One more colour?", "Why?", "And a colour you do not like?", "Sum it all up."]  # fmt: skip


def ask(server: Server, messages: list[dict], args: argparse.Namespace, cache: bool) -> dict:
    body = {"messages": messages, "max_tokens": args.answer_tokens, "temperature": 0, "cache_prompt": cache}
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=900)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    return json.loads(conn.getresponse().read())


def session(server: Server, args: argparse.Namespace) -> list[dict]:
    """The turns with the cache; each turn's messages then again with ``cache_prompt: false``."""
    messages, rows = [{"role": "system", "content": SYSTEM}], []
    for q in (QUESTIONS * 2)[: args.turns]:
        messages.append({"role": "user", "content": q})
        row = {}
        for key, cache in (("cache", True), ("cold", False)):
            r = ask(server, messages, args, cache)
            t = r["timings"]
            row[key] = {"prompt": t["cache_n"] + t["prompt_n"], "cached": t["cache_n"], "evaluated": t["prompt_n"],
                        "ms": t["prompt_ms"], "text": r["choices"][0]["message"]["content"]}  # fmt: skip
        rows.append(row)
        messages.append({"role": "assistant", "content": row["cache"]["text"]})
    return rows


def report(name: str, rows: list[dict]) -> list[str]:
    out = [f"{name}:", f"  {'turn':<5}{'prompt':>7}{'cached':>7}{'eval':>6}{'ms':>8}{'cold ms':>9}  same  answer (with the cache)"]
    for i, row in enumerate(rows, 1):
        c, k = row["cache"], row["cold"]
        same = "yes" if c["text"] == k["text"] else "NO"
        out.append(f"  {i:<5}{c['prompt']:>7}{c['cached']:>7}{c['evaluated']:>6}{c['ms']:>8.0f}{k['ms']:>9.0f}  {same:<5} {c['text'][:48]!r}")
    agree = sum(row["cache"]["text"] == row["cold"]["text"] for row in rows)
    follow = sorted(row["cache"]["ms"] for row in rows[1:])
    out.append(f"  answers as with cache_prompt:false: {agree}/{len(rows)} turns; follow-up prefill median {follow[len(follow) // 2]:.0f} ms")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=default_model())
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--answer-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-native", action="store_true", help="serve alone (no llama-server)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    model, t = str(args.model), str(args.threads)
    servers = [Server("localinfer", [sys.executable, "-m", "localinfer", "serve", "-m", model, "--port", str(free_port()), "-np", "1",
                                     "-c", "4096", "-t", t, "--no-log", "--offline"])]  # fmt: skip
    if not args.no_native:
        servers.append(Server("llama-server", [str(NATIVE_BIN / "llama-server"), "-m", model, "--port", str(free_port()), "-np", "1",
                                               "-c", "4096", "-t", t, "--no-webui"]))  # fmt: skip
    lines = [f"# benchmarks/cache_exact.py --turns {args.turns} --answer-tokens {args.answer_tokens}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())},",
             f"# {platform.processor() or platform.machine()}, {args.model.name}, -t {t}, -np 1, -c 4096; prefill ms: timings.prompt_ms"]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for server in servers:
            server.start(Path(tmp) / f"{server.name}.log")
            try:
                lines += report(server.name, session(server, args))
            finally:
                server.stop()
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
