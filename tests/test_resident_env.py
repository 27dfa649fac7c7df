"""The resident server keeps the environment its first command had: a later command whose
CUDA_VISIBLE_DEVICES / GGML_* / OMP_* differ is told so on stderr (one line), with real processes."""

from __future__ import annotations

import os
import signal

import pytest
from conftest import run_cli
from test_keepalive_handover import runner_pids
from test_resident import GREEDY, PROMPT, server_pids

from localinfer.resident.start import runtime_env

pytestmark = pytest.mark.slow


def test_runtime_env_is_what_llama_cpp_reads_at_start():
    env = {"OMP_NUM_THREADS": "2", "GGML_VK_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "1", "HOME": "/h", "HF_TOKEN": "x"}
    assert runtime_env(env) == {"OMP_NUM_THREADS": "2", "GGML_VK_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "1"}


def test_a_command_with_another_runtime_environment_is_warned(isolated_home, smollm2_path):
    isolated_home.mkdir(parents=True, exist_ok=True)
    m = str(smollm2_path)

    def ka(**env: str):
        return run_cli("run", "-m", m, *GREEDY, "--keep-alive", "60s", PROMPT, env={"LOCALINFER_HOME": str(isolated_home), **env})

    try:
        first = ka(OMP_NUM_THREADS="2")
        assert first.returncode == 0, first.stderr
        same = ka(OMP_NUM_THREADS="2")
        assert same.returncode == 0 and b"environment" not in same.stderr, same.stderr
        other = ka(OMP_NUM_THREADS="1", GGML_SCHED_MAX_COPIES="2")
        assert other.returncode == 0 and other.stdout == first.stdout, other.stderr
        lines = [ln for ln in other.stderr.decode().splitlines() if "environment" in ln]
        assert len(lines) == 1 and "OMP_NUM_THREADS" in lines[0] and "GGML_SCHED_MAX_COPIES" in lines[0], other.stderr
        assert "stop --all" in lines[0]
    finally:
        for pid in server_pids(isolated_home) + runner_pids(isolated_home):
            os.kill(pid, signal.SIGKILL)
