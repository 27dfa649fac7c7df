"""`localinfer launch AGENT` for real: the agents (npm, installed by .ci/run into
~/.cache/localinfer-agents) against the serve launch starts on SmolLM2, from a fresh data folder,
then again with that server left running, then `stop`. A 135M model cannot do agent work: the
protocol is judged (the agent gets its answers and ends its turn), not the answer."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Callable

import pytest
from conftest import run_cli

AGENTS_BIN = Path(os.environ.get("LOCALINFER_AGENTS_DIR", Path.home() / ".cache" / "localinfer-agents")) / "node_modules" / ".bin"
LEAN = ["-p", "hi", "--tools", "", "--system-prompt", "Be brief.", "--output-format", "json"]  # ~900 tokens, not ~20k
# Codex's lean mode (~1.4k tokens, not ~6k): its instructions replaced, and the features that add tools and text off
CODEX_LEAN = ["-c", "web_search=\"disabled\"", "-c", "include_permissions_instructions=false", "-c", "include_environment_context=false",
              *(a for f in ("multi_agent", "goals", "apps", "plugins") for a in ("-c", f"features.{f}=false"))]  # fmt: skip


def _env(agent: str, isolated_home: Path, **extra: str) -> dict[str, str]:
    if not (AGENTS_BIN / agent).exists():
        pytest.skip(f"{agent} is not installed in {AGENTS_BIN.parent.parent} (.ci/run installs it with npm install --prefix)")
    return {"PATH": f"{AGENTS_BIN}{os.pathsep}{os.environ['PATH']}", "HF_HUB_OFFLINE": "1", "LOCALINFER_NO_LOG": "1",
            "HOME": str(isolated_home.parent / "home"), **extra}  # fmt: skip


USER_FILES = (".claude/settings.json", ".codex/config.toml", ".config/opencode/opencode.json", ".qwen/settings.json",
              ".config/crush/crush.json", ".local/share/crush/crush.json", ".continue/config.yaml")  # fmt: skip


def _twice_then_stop(agent: str, args: list[str], env: dict[str, str], isolated_home: Path, smollm2_path: Path,
                     check: Callable[[subprocess.CompletedProcess], None], cwd: Path | None = None, times: int = 2) -> None:  # fmt: skip
    """``launch AGENT -m smol ARGS`` from a fresh data folder, then again on the server it left
    running (``check``-ed each time; ``times``: 1, the first only), then `stop`: one server, the
    user's files not made."""
    assert run_cli("pull", str(smollm2_path), "--name", "smol", env=env, timeout=180).returncode == 0
    record = isolated_home / "launch" / "server.json"
    try:
        results = []
        for _ in range(times):
            proc = run_cli("launch", agent, "-m", "smol", *args, env=env, timeout=400, cwd=cwd)
            check(proc)
            results.append(json.loads(record.read_text()))
        assert results[0]["pid"] == results[-1]["pid"]  # the second launch used the server the first left running
        log = Path(results[0]["log"]).read_text()
        assert log.count("listening on") == 1 and "'*' that is not installed is answered by smol" in log
        home = isolated_home.parent / "home"
        for mine in USER_FILES:
            assert not (home / mine).exists(), mine  # the user's files: none made
    finally:
        stopped = run_cli("stop", env=env, timeout=60)
    assert "stopped the server launch started" in stopped.stderr.decode() and not record.exists()
    with pytest.raises(ProcessLookupError):
        for _ in range(100):
            os.kill(results[0]["pid"], 0)
            time.sleep(0.1)


@pytest.mark.slow
def test_claude_code_gets_its_answers_from_a_started_server_and_again_from_the_running_one(smollm2_path, isolated_home):
    def check(proc: subprocess.CompletedProcess) -> None:
        assert proc.returncode in (0, 1), proc.stderr.decode()  # 1: Claude's own, for an answer cut at 16 tokens
        result = json.loads(proc.stdout)
        assert result["type"] == "result" and result["usage"]["input_tokens"] > 0, result  # the server answered it
        assert result["modelUsage"].keys() == {"smol"}

    env = _env("claude", isolated_home, CLAUDE_CODE_MAX_OUTPUT_TOKENS="16")
    _twice_then_stop("claude", ["--", *LEAN], env, isolated_home, smollm2_path, check)


@pytest.mark.slow
def test_codex_exec_ends_its_turn_on_a_started_server_and_again_on_the_running_one(smollm2_path, isolated_home, tmp_path):
    """Codex names no output limit: launch's -n caps the answer (serve's --n-predict), and the
    answer the server cut is a ``response.completed`` Codex ends its turn on (on an ``incomplete``
    one it fails the turn: "Incomplete response returned, reason: max_output_tokens", exit 1)."""
    instructions = tmp_path / "instructions.md"
    instructions.write_text("Be brief. Answer in plain text; call no tools.\n")  # else SmolLM2 may call tool after tool: a turn that never ends

    def check(proc: subprocess.CompletedProcess) -> None:
        err = proc.stderr.decode()
        assert proc.returncode == 0, err
        used = err.split("tokens used\n")[-1].split()[0] if "tokens used\n" in err else ""
        assert int(used.replace(",", "") or 0) > 0, err  # the server's usage, read from the stream's end
        assert "Incomplete response" not in err and "Reconnecting" not in err, err

    env = _env("codex", isolated_home)
    args = ["-n", "16", "--", "-c", f"model_instructions_file={json.dumps(str(instructions))}", *CODEX_LEAN,
            "exec", "--skip-git-repo-check", "--ephemeral", "Say hi"]  # fmt: skip
    _twice_then_stop("codex", args, env, isolated_home, smollm2_path, check)


@pytest.mark.slow
def test_opencode_run_gets_its_answer_from_a_started_server_and_again_from_the_running_one(smollm2_path, isolated_home, tmp_path):
    """OpenCode asks for its model's output limit (launch's -n; without one 32,000, past the context:
    a 400 it answers by compacting, again and again). A project's opencode.json (it ranks above
    launch's) makes the prompt lean: ~300 tokens without the tools and the 9 kB system prompt."""
    project = tmp_path / "project"
    project.mkdir()
    off = dict.fromkeys(("bash", "edit", "glob", "grep", "read", "skill", "task", "todowrite", "webfetch", "write"), False)
    (project / "opencode.json").write_text(json.dumps({"agent": {"build": {"prompt": "Be brief.", "tools": off}}}))

    def check(proc: subprocess.CompletedProcess) -> None:
        err = proc.stderr.decode()
        assert proc.returncode == 0 and "Error" not in err, err
        assert proc.stdout.strip(), err  # the answer, whatever a 135M model says

    env = _env("opencode", isolated_home, PWD=str(project))  # OpenCode's project is $PWD, not the process's directory
    _twice_then_stop("opencode", ["-n", "16", "--", "run", "Say hi"], env, isolated_home, smollm2_path, check, cwd=project)


@pytest.mark.slow
def test_qwen_code_headless_gets_its_answer_from_the_server_launch_starts(smollm2_path, isolated_home, tmp_path):
    """Qwen Code's -p on Chat Completions (launch's -n is its max_tokens). With its 11 tools the
    prompt (~10k tokens) passes SmolLM2's 8k: the server's 400 context_length_exceeded makes Qwen
    Code compress and ask again without tools, which is answered: the protocol, end to end."""
    project = tmp_path / "project"
    project.mkdir()

    def check(proc: subprocess.CompletedProcess) -> None:
        assert proc.returncode == 0, proc.stderr.decode()
        result = json.loads(proc.stdout)[-1]
        assert result["type"] == "result" and not result["is_error"] and result["usage"]["input_tokens"] > 0, result

    env = _env("qwen", isolated_home)
    (isolated_home.parent / "home").mkdir()  # Qwen Code stops at a HOME that is not there
    args = ["-n", "16", "--", "-p", "Say hi", "--system-prompt", "Be brief.", "--output-format", "json"]
    _twice_then_stop("qwen", args, env, isolated_home, smollm2_path, check, cwd=project, times=1)



@pytest.mark.slow
@pytest.mark.parametrize(("n_ctx", "window"), [(65536, "65.5k"), (32768, "200k")])
def test_claude_code_takes_the_served_context_as_its_window(isolated_home, n_ctx, window):
    """Told the server's context (``/props``), Claude Code compacts a session before the server's
    400; below ~48k it would compact every turn, so it keeps its own 200k. Its ``/context`` command
    says the window it works with, without asking the model."""
    import http.server
    import threading

    class Props(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps({"default_generation_settings": {"n_ctx": n_ctx}}).encode()
            self.send_response(200 if self.path.startswith("/props") else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    env = _env("claude", isolated_home)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Props)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proc = run_cli("launch", "claude", "-m", "smol", "--endpoint", f"http://127.0.0.1:{server.server_port}",
                       "--", "-p", "/context", env=env, timeout=120)  # fmt: skip
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stderr.decode()
    assert re.search(rf"Tokens:\**\s*[\d.]+k?\s*/\s*{re.escape(window)}\b", proc.stdout.decode()), proc.stdout.decode()[:400]
