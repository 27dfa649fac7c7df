"""`localinfer launch claude` for real: Claude Code (npm, installed by .ci/run into
~/.cache/localinfer-agents) against the serve launch starts on SmolLM2, from a fresh data folder,
then again with that server left running, then `stop`. A 135M model cannot do agent work: the
protocol is judged (the agent gets its answers and ends its turn), not the answer."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from conftest import run_cli

AGENTS_BIN = Path(os.environ.get("LOCALINFER_AGENTS_DIR", Path.home() / ".cache" / "localinfer-agents")) / "node_modules" / ".bin"
LEAN = ["-p", "hi", "--tools", "", "--system-prompt", "Be brief.", "--output-format", "json"]  # ~900 tokens, not ~20k


@pytest.mark.slow
def test_claude_code_gets_its_answers_from_a_started_server_and_again_from_the_running_one(smollm2_path, isolated_home):
    if not (AGENTS_BIN / "claude").exists():
        pytest.skip(f"Claude Code is not installed in {AGENTS_BIN.parent.parent} (npm install --prefix it @anthropic-ai/claude-code)")
    env = {"PATH": f"{AGENTS_BIN}{os.pathsep}{os.environ['PATH']}", "HF_HUB_OFFLINE": "1", "LOCALINFER_NO_LOG": "1",
           "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "16", "HOME": str(isolated_home.parent / "home")}  # fmt: skip
    assert run_cli("pull", str(smollm2_path), "--name", "smol", env=env, timeout=180).returncode == 0
    record = isolated_home / "launch" / "server.json"
    try:
        results = []
        for _ in range(2):
            proc = run_cli("launch", "claude", "-m", "smol", "--", *LEAN, env=env, timeout=240)
            assert proc.returncode in (0, 1), proc.stderr.decode()  # 1: Claude's own, for an answer cut at 16 tokens
            result = json.loads(proc.stdout)
            assert result["type"] == "result" and result["usage"]["input_tokens"] > 0, result  # the server answered it
            assert result["modelUsage"].keys() == {"smol"}
            results.append(json.loads(record.read_text()))
        assert results[0]["pid"] == results[1]["pid"]  # the second launch used the server the first left running
        log = Path(results[0]["log"]).read_text()
        assert log.count("listening on") == 1 and "'*' that is not installed is answered by smol" in log
        assert not (isolated_home.parent / "home" / ".claude" / "settings.json").exists()  # the user's files: none made
    finally:
        stopped = run_cli("stop", env=env, timeout=60)
    assert "stopped the server launch started" in stopped.stderr.decode() and not record.exists()
    with pytest.raises(ProcessLookupError):
        for _ in range(100):
            os.kill(results[0]["pid"], 0)
            time.sleep(0.1)
