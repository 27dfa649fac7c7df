"""What the resident processes trust, with real processes: no module of the directory a command was
typed in runs in the server, the runner or the commands it forks (docs/security.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_keepalive_handover import runner_pids
from test_resident import server_pids

# Shadows a standard module: records the process that imported it, then is the real module.
SHADOW = """
import os, sys, sysconfig
with open({marker!r}, "a") as f:
    f.write(f"{{os.getpid()}} {{sys.argv}}\\n")
_real = os.path.join(sysconfig.get_paths()["stdlib"], __name__ + ".py")
exec(compile(open(_real).read(), _real, "exec"))
"""
SHADOWED = ("argparse", "shlex", "textwrap", "gettext", "uuid", "difflib")


def _env(home: Path, tmp: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "LOCALINFER_ENDPOINT")}
    env["LOCALINFER_HOME"] = str(home)
    if tmp is not None:
        env["TMPDIR"] = str(tmp)
    return env


def _cli(*args: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The CLI as a user's console script runs it: -P, so that the client itself imports nothing of cwd."""
    return subprocess.run([sys.executable, "-P", "-m", "localinfer", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL)  # fmt: skip


def _kill_resident(home: Path) -> None:
    for pid in server_pids(home) + runner_pids(home):
        os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_no_module_of_the_working_directory_runs_in_the_resident_processes(tmp_path, isolated_home, smollm2_path):
    work, marker = tmp_path / "a clone", tmp_path / "imported.txt"
    work.mkdir()
    for name in SHADOWED:
        (work / f"{name}.py").write_text(SHADOW.format(marker=str(marker)))
    (work / "model.gguf").symlink_to(smollm2_path)  # a file argument relative to the command's cwd
    env = _env(isolated_home)
    try:
        first = _cli("run", "-m", "model.gguf", "--temp", "0", "-n", "4", "--keep-alive", "60s", "Hi", env=env, cwd=work)
        assert first.returncode == 0, first.stderr
        assert server_pids(isolated_home) and runner_pids(isolated_home), "the first command started both"
        again = _cli("run", "-m", "model.gguf", "--temp", "0", "-n", "4", "--keep-alive", "60s", "Hi", env=env, cwd=work)
        assert again.returncode == 0 and again.stdout == first.stdout, again.stderr
        assert not marker.exists(), f"a module of the working directory ran: {marker.read_text()}"
        for pid in server_pids(isolated_home) + runner_pids(isolated_home):
            assert os.readlink(f"/proc/{pid}/cwd") == "/", "the resident processes keep no user's folder busy"
    finally:
        _kill_resident(isolated_home)

