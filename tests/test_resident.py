"""The resident server for real: SmolLM2 on real Unix sockets in temp homes, started by the CLI as
users start it, and killed in teardown (no test leaves a process behind)."""

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

from localinfer.resident.start import place

pytestmark = pytest.mark.slow

PROMPT = "Name a colour."
GREEDY = ("--temp", "0", "-n", "8")


def server_pids(home: Path) -> list[int]:
    """Resident servers of ``home`` (by the socket on their command line), from /proc."""
    sock = str(place(home).socket)
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"localinfer.resident.server" in args and sock.encode() in args:
            pids.append(int(entry.name))
    return pids


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (its parent, the command, has exited) counts as gone
        return (Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]) != "Z"
    except OSError:
        return False


def wait_until(check, timeout: float, step: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(step)
    return check()


@pytest.fixture
def home(isolated_home):
    isolated_home.mkdir(parents=True, exist_ok=True)
    yield isolated_home
    for pid in server_pids(isolated_home):
        os.kill(pid, signal.SIGKILL)


def ka(home: Path, *args: str, keep: str = "60s", **kw) -> subprocess.CompletedProcess:
    return run_cli("run", *args, "--keep-alive", keep, env={"LOCALINFER_HOME": str(home)}, **kw)


def ps_json(home: Path) -> dict:
    proc = run_cli("ps", "--json", env={"LOCALINFER_HOME": str(home)})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_resident_run_answers_as_a_local_run_and_ps_stop_manage_it(home, smollm2_path):
    m = str(smollm2_path)
    local = run_cli("run", "-m", m, *GREEDY, "--json", PROMPT)
    assert local.returncode == 0, local.stderr
    first = ka(home, "-m", m, *GREEDY, PROMPT)
    assert first.returncode == 0, first.stderr
    assert first.stdout.decode().strip() == json.loads(local.stdout)["text"].strip()
    assert b"load 0 (resident)" not in first.stderr and b" load " in first.stderr, "the first call loaded it: its load time"
    (pid,) = server_pids(home)
    sock = place(home).socket
    assert sock.stat().st_mode & 0o777 == 0o600 and place(home).folder.stat().st_mode & 0o777 == 0o700

    again = ka(home, "-m", m, *GREEDY, "--json", PROMPT)
    assert again.returncode == 0, again.stderr
    answer = json.loads(again.stdout)
    assert answer["text"] == json.loads(local.stdout)["text"]
    assert set(answer) == set(json.loads(local.stdout)), "the same --json keys as a local run"
    assert answer["timings"]["load_ms"] == 0 and answer["usage"]["completion_tokens"] == 8
    assert b"load 0 (resident)" in again.stderr
    assert server_pids(home) == [pid], "the second command found the first one's server"

    state = ps_json(home)
    assert state["server"]["pid"] == pid
    (model,) = state["models"]
    assert model["path"] == str(smollm2_path.resolve()) and model["sequences"] == 1 and model["context"] > 0
    assert model["size_bytes"] > 50_000_000 and 0 < model["unloads_in_s"] <= 60
    table = run_cli("ps", env={"LOCALINFER_HOME": str(home)})
    assert b"UNLOADS IN" in table.stdout and smollm2_path.name.encode() in table.stdout

    history = run_cli("stats", "--json", env={"LOCALINFER_HOME": str(home)})
    assert history.returncode == 0, history.stderr
    (row,) = json.loads(history.stdout)["models"]  # one row with the local run's: this machine, these weights
    assert row["endpoint"] is None and row["sha256"] and row["requests"] == 3 and row["tokens_out"] == 24

    gone = run_cli("stop", "--all", env={"LOCALINFER_HOME": str(home)})
    assert gone.returncode == 0, gone.stderr
    assert b"unloaded" in gone.stderr
    assert not alive(pid) and not sock.exists(), "stop --all leaves no process and no socket"
    assert ps_json(home) == {"server": None, "models": []}


def test_sampling_never_reloads_a_larger_context_or_other_threads_do_and_say_so(home, smollm2_path):
    m = str(smollm2_path)
    first = ka(home, "-m", m, "-c", "512", *GREEDY, PROMPT)
    assert first.returncode == 0, first.stderr
    for args in (("-c", "256", "--temp", "0.7", "--seed", "3", "-n", "4"), ("-c", "512", "--top-k", "5", "-n", "4")):
        reused = ka(home, "-m", m, *args, PROMPT)
        assert reused.returncode == 0 and b"reloading" not in reused.stderr, reused.stderr
    assert ps_json(home)["models"][0]["context"] == 512
    bigger = ka(home, "-m", m, "-c", "1024", *GREEDY, PROMPT)
    assert bigger.returncode == 0, bigger.stderr
    assert b"reloading" in bigger.stderr and b"context of 1024 tokens is more than the loaded 512" in bigger.stderr
    threads = ka(home, "-m", m, "-c", "1024", "--threads", "1", *GREEDY, PROMPT)
    assert b"--threads 1 differs from the loaded" in threads.stderr, threads.stderr
    assert len(ps_json(home)["models"]) == 1


def test_an_idle_model_unloads_on_time_and_the_server_exits(home, smollm2_path):
    proc = ka(home, "-m", str(smollm2_path), *GREEDY, PROMPT, keep="2s")
    done = time.monotonic()
    assert proc.returncode == 0, proc.stderr
    (pid,) = server_pids(home)
    assert wait_until(lambda: not ps_json(home)["models"], 10, step=0.1)
    unloaded = time.monotonic() - done
    assert 1.0 <= unloaded <= 3.0 + 1.0, f"unloaded after {unloaded:.1f} s for a 2 s keep-alive"  # + a ps call's start
    assert wait_until(lambda: not alive(pid), 5), "the server exits once nothing is loaded"
    assert not place(home).socket.exists()


def test_a_stale_socket_of_a_crashed_server_is_replaced(home, smollm2_path):
    m = str(smollm2_path)
    assert ka(home, "-m", m, *GREEDY, PROMPT).returncode == 0
    (pid,) = server_pids(home)
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not alive(pid), 5)
    assert place(home).socket.exists(), "a crash leaves its socket behind"
    proc = ka(home, "-m", m, *GREEDY, PROMPT)
    assert proc.returncode == 0, proc.stderr
    (new,) = server_pids(home)
    assert new != pid


def test_two_commands_starting_at_once_start_one_server(home, smollm2_path):
    env = {**os.environ, "LOCALINFER_HOME": str(home)}
    args = [sys.executable, "-m", "localinfer", "run", "-m", str(smollm2_path), *GREEDY, "--keep-alive", "60s", PROMPT]
    procs = [subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    assert outs[0][0] == outs[1][0]
    assert len(server_pids(home)) == 1
    assert len(ps_json(home)["models"]) == 1


def test_a_server_killed_mid_answer_fails_the_command_with_exit_1_and_the_next_one_recovers(home, smollm2_path):
    m = str(smollm2_path)
    assert ka(home, "-m", m, *GREEDY, PROMPT).returncode == 0  # resident now
    (pid,) = server_pids(home)
    env = {**os.environ, "LOCALINFER_HOME": str(home)}
    long = subprocess.Popen([sys.executable, "-m", "localinfer", "run", "-m", m, "--temp", "0", "-n", "3000", "--ignore-eos",
                             "--keep-alive", "60s", PROMPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)  # fmt: skip
    assert long.stdout.read(1), "the answer started"
    os.kill(pid, signal.SIGKILL)
    out, err = long.communicate(timeout=60)
    assert long.returncode == 1, err
    lines = [ln for ln in err.decode().splitlines() if ln.strip()]
    assert any("resident server" in ln and "during the answer" in ln for ln in lines), err
    assert b"Traceback" not in err
    proc = ka(home, "-m", m, *GREEDY, PROMPT)
    assert proc.returncode == 0, proc.stderr
    assert server_pids(home) and server_pids(home)[0] != pid


def test_an_unusable_resident_folder_runs_locally_with_one_warning(home, smollm2_path):
    (home / "resident").write_text("in the way")  # no folder for the socket, the lock or the log
    proc = ka(home, "-m", str(smollm2_path), *GREEDY, PROMPT)
    assert proc.returncode == 0, proc.stderr
    warnings = [ln for ln in proc.stderr.decode().splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and "running locally" in warnings[0], proc.stderr
    assert b"load 0 (resident)" not in proc.stderr and proc.stdout.strip()
    assert server_pids(home) == []


def test_the_client_path_imports_no_llama_cpp_jinja2_rich_tables_or_httpx(home, smollm2_path):
    m = str(smollm2_path)
    assert ka(home, "-m", m, *GREEDY, PROMPT).returncode == 0  # resident now
    code = (
        "import sys\n"
        f"sys.argv = ['localinfer', 'run', '-m', {m!r}, '--keep-alive', '60s', '-q', '--temp', '0', '-n', '4', 'hi']\n"
        "from localinfer.cli.main import main\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "heavy = ('llama_cpp', 'jinja2', 'rich.table', 'httpx', 'httpx2', 'huggingface_hub', 'localinfer.engine.model', 'uvicorn')\n"
        "sys.stderr.write(repr([name for name in heavy if name in sys.modules]))\n"
    )  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "LOCALINFER_HOME": str(home)},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip(), "it answered"
    assert proc.stderr.strip().endswith("[]"), proc.stderr


def test_several_models_on_demand_stop_one_and_max_models_unloads_the_least_recent(home, smollm2_path, tmp_path):
    other = tmp_path / "other.gguf"
    os.link(smollm2_path, other)  # another file of the same bytes: another model to the server
    a, b = str(smollm2_path.resolve()), str(other.resolve())
    assert ka(home, "-m", a, *GREEDY, PROMPT).returncode == 0
    assert ka(home, "-m", b, *GREEDY, PROMPT).returncode == 0
    assert {m["path"] for m in ps_json(home)["models"]} == {a, b}
    stopped = run_cli("stop", a, env={"LOCALINFER_HOME": str(home)})
    assert stopped.returncode == 0 and b"unloaded" in stopped.stderr, stopped.stderr
    assert [m["path"] for m in ps_json(home)["models"]] == [b]
    missing = run_cli("stop", "no-such-model", env={"LOCALINFER_HOME": str(home)})
    assert missing.returncode == 3 and b"not resident" in missing.stderr
    again = ka(home, "-m", a, "--max-models", "1", *GREEDY, PROMPT)
    assert again.returncode == 0, again.stderr
    assert b"to keep at most 1 model(s) loaded" in again.stderr
    assert [m["path"] for m in ps_json(home)["models"]] == [a]


def test_a_model_that_does_not_fit_is_refused_with_the_preflights_figures_as_a_local_run_is(home, smollm2_path):
    env = {"LOCALINFER_HOME": str(home), "LOCALINFER_FAKE_RAM": "20MB"}  # the server inherits it from its starter
    local = run_cli("run", "-m", str(smollm2_path), *GREEDY, PROMPT, env=env)
    resident = run_cli("run", "-m", str(smollm2_path), *GREEDY, "--keep-alive", "60s", PROMPT, env=env)
    assert local.returncode == resident.returncode == 6, resident.stderr
    first_line = [ln for ln in local.stderr.decode().splitlines() if ln.startswith("Error")][0]
    assert first_line in resident.stderr.decode(), resident.stderr  # the same refusal, word for word
    assert "MB" in first_line or "GB" in first_line, first_line  # with the pre-flight's figures
    assert wait_until(lambda: not server_pids(home), 10), "nothing loaded: the server exits"
