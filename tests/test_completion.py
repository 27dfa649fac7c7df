"""Shell completion (issue 21): Typer's --show-completion, with model names from the registry."""

from __future__ import annotations

import os
import subprocess
import sys


def _localinfer(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localinfer", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip


def test_show_completion_prints_a_bash_script():
    proc = _localinfer("--show-completion", "bash")
    assert proc.returncode == 0 and "complete -o" in proc.stdout and "_localinfer" in proc.stdout.lower()


def test_model_names_complete_from_the_registry():
    env = {"_LOCALINFER_COMPLETE": "complete_bash", "COMP_WORDS": "localinfer run -m smollm2:1", "COMP_CWORD": "3"}
    # `python -m localinfer` completes as the program it names: the console script's variable
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "localinfer")], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip
    assert proc.returncode == 0
    assert proc.stdout.split() == ["smollm2:1.7b", "smollm2:135m"]
