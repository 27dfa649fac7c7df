"""What the serving side trusts, with real processes (docs/security.md): the command runner and the
resident server refuse a peer of another mount namespace (a sandbox of the same uid) before they read
its command or request; the runner takes no command whose environment changes what the processes it
starts import (PYTHONPATH...); ``/resident/load`` never opens a file path it is merely handed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli
from ggufsynth import write_tiny_llama
from test_keepalive_handover import runner_pids
from test_resident import GREEDY, PROMPT, ps_json, server_pids
from test_runner_limits import runner  # noqa: F401  (a real runner on a private socket: a fixture)

from localinfer.errors import ModelNotFoundError
from localinfer.resident import start
from localinfer.resident.loading import check_known_file
from localinfer.store.manifest import Store

GENEROUS_S = 60

# Hands the runner a command, as a client does, from wherever it runs (an unshared child: another
# mount namespace); its stdio is /dev/null. Prints the runner's replies, one JSON line each, as a list.
HAND = r"""
import json, os, socket, sys
from localinfer.resident import command
path, argv, env = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
how = {"encoding": "utf-8", "errors": "strict", "line_buffering": False, "write_through": False, "buffered": True}
header = json.dumps({"identity": command.identity(), "argv": argv, "env": env, "cwd": "/", "umask": 0o022,
                     "stdio": [how] * 3}).encode()
null = os.open(os.devnull, os.O_RDWR)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.settimeout(60)
sock.connect(path)
socket.send_fds(sock, [len(header).to_bytes(4, "big") + header], [null, null, null])
out = b""
try:
    while chunk := sock.recv(65536):
        out += chunk
except ConnectionResetError:  # closed with the command unread
    pass
print(json.dumps([json.loads(line) for line in out.splitlines()]))
"""

# One HTTP request to the resident server's socket, as any process could send it (no peer check of
# its own): prints the status line's code, then the body.
ASK = r"""
import socket, sys
path, method, target, body = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].encode()
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.settimeout(60)
sock.connect(path)
try:
    sock.sendall(f"{method} {target} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
except OSError:  # answered and closed before the request was sent: the answer is still there to read
    pass
out = b""
try:
    while chunk := sock.recv(65536):
        out += chunk
except ConnectionResetError:  # closed with the request unread
    pass
head, _, rest = out.partition(b"\r\n\r\n")
print(head.split()[1].decode())
print(rest.decode())
"""

# Imported by any Python process started with PYTHONPATH pointing at its folder: it leaves a mark and
# ends that process at once (before it could load llama.cpp).
SITECUSTOMIZE = """
import os
with open({marker!r}, "a") as f:
    f.write(f"{{os.getpid()}}\\n")
os._exit(0)
"""


def _unshared() -> tuple[str, ...]:
    """A prefix that runs a command in a mount namespace of its own, as this uid (root: plain
    ``unshare -m``; else inside a user namespace, which SO_PEERCRED maps back to this uid)."""
    if not shutil.which("unshare"):
        pytest.skip("no unshare(1)")
    wrap = ("unshare", "--mount", "--propagation", "private")
    if os.getuid() != 0:
        wrap = ("unshare", "--user", "--map-root-user", "--mount", "--propagation", "private")
    tried = subprocess.run([*wrap, "true"], capture_output=True, text=True, timeout=GENEROUS_S)
    if tried.returncode != 0:
        pytest.skip(f"cannot make a mount namespace here ({' '.join(wrap)}): {tried.stderr.strip()[-200:]}")
    return wrap


def _hand(path: Path, argv: list[str], env: dict[str, str], wrap: tuple[str, ...] = ()) -> list[dict]:
    proc = subprocess.run([*wrap, sys.executable, "-P", "-c", HAND, str(path), json.dumps(argv), json.dumps(env)],
                          capture_output=True, text=True, timeout=GENEROUS_S, cwd=os.sep)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _ask(path: Path, method: str, target: str, body: object = None, wrap: tuple[str, ...] = ()) -> tuple[int, dict]:
    data = "" if body is None else json.dumps(body)
    proc = subprocess.run([*wrap, sys.executable, "-P", "-c", ASK, str(path), method, target, data],
                          capture_output=True, text=True, timeout=GENEROUS_S, cwd=os.sep)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    status, answer = proc.stdout.split("\n", 1)
    return int(status), json.loads(answer)


def _pull(model: Path, name: str) -> list[str]:
    return ["localinfer", "pull", str(model), "--name", name]


def test_the_runner_runs_nothing_for_a_peer_in_another_mount_namespace(runner, isolated_home, tmp_path):  # noqa: F811
    wrap = _unshared()
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    env = {**os.environ, "LOCALINFER_HOME": str(isolated_home), "LOCALINFER_PROBE": "0"}
    assert _hand(runner, _pull(model, "theirs"), env, wrap) == [], "closed without a word: nothing read, nothing run"
    assert Store().entry("theirs") is None
    mine = _hand(runner, _pull(model, "mine"), env)  # the same command, from this namespace: run
    assert "pid" in mine[0] and mine[-1] == {"exit": 0}, mine
    assert Store().entry("mine") is not None and Store().entry("theirs") is None


def test_a_handed_over_pythonpath_reaches_no_process_the_runner_starts(runner, isolated_home, tmp_path):  # noqa: F811
    folder, marker = tmp_path / "theirs", tmp_path / "imported.txt"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE.format(marker=str(marker)))
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    env = {**os.environ, "LOCALINFER_HOME": str(isolated_home), "PYTHONPATH": str(folder)}
    said = _hand(runner, _pull(model, "tiny"), env)  # a pull tests the file in a child process (engine.probe)
    assert not marker.exists(), f"a process the runner started imported the handed-over PYTHONPATH: {marker.read_text()}"
    assert len(said) == 1 and "PYTHONPATH" in said[0].get("refused", ""), "refused: the command runs in its own process"
    assert Store().entry("tiny") is None, "nothing was run"


def test_what_the_runner_compares_is_what_a_process_reads_as_it_starts():
    env = {"PYTHONPATH": "/x", "PYTHONHOME": "/h", "PYTHONSTARTUP": "/s.py", "PYTHONUSERBASE": "/u", "LD_PRELOAD": "/l.so",
           "LD_LIBRARY_PATH": "/lib", "DYLD_INSERT_LIBRARIES": "/d.dylib", "PATH": "/bin", "HOME": "/h", "OMP_NUM_THREADS": "2"}  # fmt: skip
    assert set(start.startup_env(env)) == {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "LD_PRELOAD",
                                           "LD_LIBRARY_PATH", "DYLD_INSERT_LIBRARIES"}  # fmt: skip


@pytest.fixture
def bare_server(isolated_home, tmp_path):
    """A resident server on a private socket, started as a starter starts it (no model: nothing loads)."""
    folder = tmp_path / "resident"
    start.private_folder(folder)
    ready_r, ready_w = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "localinfer.resident.server", "--socket", str(folder / "socket"), "--lock",
         str(folder / "lock"), "--ready-fd", str(ready_w), "--preload"],
        pass_fds=(ready_w,), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=os.sep,
    )  # fmt: skip
    os.close(ready_w)
    proc.stdin.close()  # no first request: nothing is loaded from its start (nor is llama.cpp imported)
    try:
        assert os.read(ready_r, 1) == b"R", proc.stderr.read().decode()
    finally:
        os.close(ready_r)
    yield folder / "socket", proc
    proc.kill()
    proc.wait(GENEROUS_S)
    proc.stderr.close()


def test_the_resident_server_answers_a_peer_in_another_mount_namespace_403(bare_server, tmp_path):
    wrap = _unshared()
    sock, proc = bare_server
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    for method, target, body in (("GET", "/resident/ps", None), ("POST", "/resident/load", {"spec": str(model), "options": {}}),
                                 ("POST", "/resident/stop", {}), ("GET", "/m/x/v1/models", None)):  # fmt: skip
        status, answer = _ask(sock, method, target, body, wrap)
        assert status == 403 and answer["error"]["code"] == "forbidden", (target, answer)
    status, answer = _ask(sock, "GET", "/resident/ps")  # this namespace: served
    assert status == 200 and answer["models"] == [] and answer["pid"] == proc.pid
    proc.kill()
    proc.wait(GENEROUS_S)
    log = proc.stderr.read().decode()
    assert log.count("refused a connection: the process connecting") == 4 and "another mount namespace" in log, log


def test_resident_load_refuses_a_file_path_the_store_does_not_know(bare_server, tmp_path):
    sock, _proc = bare_server
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    status, answer = _ask(sock, "POST", "/resident/load", {"spec": str(model), "options": {}})
    assert status == 422 and answer["error"]["type"] == "ModelNotFoundError", answer
    assert "never a file path it is handed" in answer["error"]["message"]
    assert _ask(sock, "GET", "/resident/ps")[1]["models"] == [], "nothing loaded"


def test_a_file_is_known_while_the_store_has_its_digest_and_it_is_unchanged(isolated_home, tmp_path):
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    link = tmp_path / "link.gguf"
    link.symlink_to(model)
    with pytest.raises(ModelNotFoundError, match="never a file path it is handed"):
        check_known_file(str(model))
    Store().record_digest(model, "0" * 64)  # what checking it (a local run, a pull) records
    check_known_file(str(model))
    check_known_file(str(link))  # a link to it: the file itself is known
    check_known_file("smollm2:135m")  # a name: the store resolves it (or says it is not installed)
    with open(model, "ab") as fh:
        fh.write(b"\0")  # changed since: not known any more
    with pytest.raises(ModelNotFoundError):
        check_known_file(str(model))


@pytest.mark.slow
def test_a_file_nothing_hashed_runs_in_its_own_process_with_keep_alive(isolated_home, smollm2_path):
    env = {"LOCALINFER_HOME": str(isolated_home), "LOCALINFER_PROBE": "0"}  # no probe: the file is never hashed
    try:
        proc = run_cli("run", "-m", str(smollm2_path), *GREEDY, "--keep-alive", "60s", PROMPT, env=env)
        assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
        (line,) = [ln for ln in proc.stderr.decode().splitlines() if "running locally" in ln]
        assert str(smollm2_path) in line and "LOCALINFER_PROBE=0" in line
        assert b"load 0 (resident)" not in proc.stderr
        assert ps_json(isolated_home)["models"] == [], "the server loaded nothing"
    finally:
        for pid in server_pids(isolated_home) + runner_pids(isolated_home):
            os.kill(pid, signal.SIGKILL)
