"""The lean `run --keep-alive` path: the command handed to the resident server's runner (its stdio
passed over the socket) behaves as the full path run here - the same output, stderr, exit codes and
--json - and the client imports nothing but the standard library and three small modules of ours."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_cli
from test_resident import GREEDY, PROMPT, alive, server_pids, wait_until

from localinfer.resident.command import wants_resident
from localinfer.resident.start import place


def runner_pids(home: Path) -> list[int]:
    sock = str(place(home).commands).encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                args = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"localinfer.cli.runner" in args and sock in args:
                pids.append(int(entry.name))
    return pids


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(") ", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


@pytest.fixture
def home(isolated_home):
    isolated_home.mkdir(parents=True, exist_ok=True)
    yield isolated_home
    for pid in server_pids(isolated_home) + runner_pids(isolated_home):
        os.kill(pid, signal.SIGKILL)


def env_of(home: Path, **extra: str) -> dict[str, str]:
    return {"LOCALINFER_HOME": str(home), **extra}


def test_keep_alive_is_recognised_from_the_flag_or_the_environment_without_typer():
    assert wants_resident(["--keep-alive", "5m", "hi"], {})
    assert wants_resident(["--keep-alive=-1", "hi"], {})
    assert wants_resident(["hi"], {"LOCALINFER_KEEP_ALIVE": "30s"})
    assert not wants_resident(["hi"], {"LOCALINFER_KEEP_ALIVE": "0"})
    assert not wants_resident(["--keep-alive", "5m", "--keep-alive", "off", "hi"], {}), "the last value wins"
    assert not wants_resident(["hi"], {"LOCALINFER_KEEP_ALIVE": "5m", "LOCALINFER_ENDPOINT": "http://x/v1"})
    assert not wants_resident(["--endpoint", "http://x/v1", "--keep-alive", "5m", "hi"], {})
    assert not wants_resident(["--", "--keep-alive", "5m"], {}), "after --, words of the prompt"
    assert not wants_resident(["--keep-alive", "5m"], {"_LOCALINFER_COMPLETE": "bash_complete"})


@pytest.mark.slow
def test_a_handed_over_run_answers_as_the_full_path_and_its_client_imports_no_typer(home, smollm2_path):
    m = str(smollm2_path)
    local = run_cli("run", "-m", m, *GREEDY, "--json", PROMPT)
    assert local.returncode == 0, local.stderr
    first = run_cli("run", "-m", m, *GREEDY, "--keep-alive", "60s", "--json", PROMPT, env=env_of(home))
    assert first.returncode == 0, first.stderr
    assert len(server_pids(home)) == 1 and len(runner_pids(home)) == 1, "the first command started both"
    code = (
        "import json, sys\n"
        f"sys.argv = ['localinfer', 'run', '-m', {m!r}, '--temp', '0', '-n', '8', '--keep-alive', '60s', '--json', {PROMPT!r}]\n"
        "from localinfer.resident.command import hand_over\n"
        "status = hand_over(sys.argv)\n"
        "own = sorted(n for n in sys.modules if n.startswith('localinfer'))\n"
        "heavy = [n for n in ('typer', 'click', 'rich', 'llama_cpp', 'jinja2', 'httpx', 'sqlite3', 'dataclasses') if n in sys.modules]\n"
        "sys.stderr.write(json.dumps({'status': status, 'own': own, 'heavy': heavy}) + '\\n')\n"
    )  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env_of(home)}, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stderr.strip().splitlines()[-1])
    assert seen["status"] == 0, "handed over (None would mean: run here)"
    assert seen["heavy"] == [] and set(seen["own"]) <= {"localinfer", "localinfer.paths", "localinfer.resident",
                                                         "localinfer.resident.command", "localinfer.resident.start"}, seen  # fmt: skip
    answer, ours = json.loads(proc.stdout), json.loads(local.stdout)
    assert answer["text"] == ours["text"] and set(answer) == set(ours), "the same --json as a local run"
    assert answer["timings"]["load_ms"] == 0


@pytest.mark.slow
def test_usage_errors_and_failures_read_the_same_handed_over_or_local(home, smollm2_path):
    m = str(smollm2_path)
    assert run_cli("run", "-m", m, *GREEDY, "--keep-alive", "60s", PROMPT, env=env_of(home)).returncode == 0
    for args in (("--temperature", "banana"), ("--no-such-flag",), ("--top-p", "7"), ("--logprobs", "3"),
                 ("-m", str(home / "missing.gguf"))):  # fmt: skip
        local = run_cli("run", "-m", m, *GREEDY, *args, PROMPT, env=env_of(home))
        handed = run_cli("run", "-m", m, *GREEDY, *args, "--keep-alive", "60s", PROMPT, env=env_of(home))
        assert handed.returncode == local.returncode != 0, (args, handed.stderr)
        assert handed.stderr == local.stderr and handed.stdout == local.stdout, args


@pytest.mark.slow
def test_piped_stdin_reaches_the_handed_over_command(home, smollm2_path):
    m = str(smollm2_path)
    args = ("run", "-m", m, *GREEDY, "--json", "-p", "What colour did I name?")
    local = run_cli(*args, input="My favourite colour is green.\n", env=env_of(home))
    handed = run_cli(*args, "--keep-alive", "60s", input="My favourite colour is green.\n", env=env_of(home))
    assert local.returncode == handed.returncode == 0, handed.stderr
    assert json.loads(handed.stdout)["text"] == json.loads(local.stdout)["text"]
    assert json.loads(handed.stdout)["usage"]["prompt_tokens"] == json.loads(local.stdout)["usage"]["prompt_tokens"]


def _long(home: Path, m: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "localinfer", "run", "-m", m, "--temp", "0", "-n", "3000", "--ignore-eos",
                             "--keep-alive", "60s", PROMPT], env={**os.environ, **env_of(home)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)  # fmt: skip


@pytest.mark.slow
def test_ctrl_c_reaches_the_handed_over_command_which_ends_as_a_local_one(home, smollm2_path):
    m = str(smollm2_path)
    assert run_cli("run", "-m", m, *GREEDY, "--keep-alive", "60s", PROMPT, env=env_of(home)).returncode == 0
    long = _long(home, m)
    assert long.stdout.read(1), "the answer started"
    long.send_signal(signal.SIGINT)
    out, err = long.communicate(timeout=60)
    assert long.returncode == 130, err
    assert b"Error: interrupted" in err and b"tokens" in err, "the partial answer's stats, then the interruption"
    assert b"Traceback" not in err


@pytest.mark.slow
def test_a_command_process_killed_mid_answer_fails_with_exit_1_and_the_next_command_answers(home, smollm2_path):
    m = str(smollm2_path)
    assert run_cli("run", "-m", m, *GREEDY, "--keep-alive", "60s", PROMPT, env=env_of(home)).returncode == 0
    (runner,) = runner_pids(home)
    long = _long(home, m)
    assert long.stdout.read(1), "the answer started"
    (command,) = children(runner)
    os.kill(command, signal.SIGKILL)
    out, err = long.communicate(timeout=60)
    assert long.returncode == 1, err
    lines = [ln for ln in err.decode().splitlines() if ln.strip()]
    assert lines[-2].startswith("Error: the resident server's process for this command ended"), err
    assert lines[-1].startswith("  hint: see ") and b"Traceback" not in err
    again = run_cli("run", "-m", m, *GREEDY, "--keep-alive", "60s", PROMPT, env=env_of(home))
    assert again.returncode == 0 and b"load 0 (resident)" in again.stderr, again.stderr


@pytest.mark.slow
def test_the_runner_leaves_with_its_server_killed_or_stopped(home, smollm2_path):
    m = str(smollm2_path)
    assert run_cli("run", "-m", m, *GREEDY, "--keep-alive", "60s", PROMPT, env=env_of(home)).returncode == 0
    (pid,), (runner,) = server_pids(home), runner_pids(home)
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not alive(runner), 5), "the runner follows its server"
    assert not place(home).commands.exists(), "and removes its socket"
    proc = run_cli("run", "-m", m, *GREEDY, "--keep-alive", "60s", PROMPT, env=env_of(home))
    assert proc.returncode == 0, proc.stderr
    (runner,) = runner_pids(home)
    assert run_cli("stop", "--all", env=env_of(home)).returncode == 0
    started = time.monotonic()
    assert wait_until(lambda: not alive(runner), 2), "stop leaves no process"
    assert time.monotonic() - started < 2
