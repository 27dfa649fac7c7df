"""What the resident processes trust, with real processes: no module of the directory a command was
typed in runs in the server, the runner or the commands it forks; a client never hands a command (or
a request) to a socket in a folder that is not ours alone, nor to a process of another uid or another
mount namespace - it says so in one line, and the listener received nothing (docs/security.md)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import socket
import tempfile
from pathlib import Path

import pytest
from test_keepalive_handover import runner_pids
from test_resident import server_pids

from localinfer.resident import start

NOBODY = 65534
as_root = pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="needs root to make another uid's socket")

# Shadows a standard module: records the process that imported it, then is the real module.
SHADOW = """
import os, sys, sysconfig
with open({marker!r}, "a") as f:
    f.write(f"{{os.getpid()}} {{sys.argv}}\\n")
_real = os.path.join(sysconfig.get_paths()["stdlib"], __name__ + ".py")
exec(compile(open(_real).read(), _real, "exec"))
"""
SHADOWED = ("argparse", "shlex", "textwrap", "gettext", "uuid", "difflib")

# Binds each path (as this user), then becomes ``uid`` and listens; prints what each connection sent.
LISTENER = r"""
import os, select, socket, sys
uid, paths = int(sys.argv[1]), sys.argv[2:]
socks = []
for p in paths:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(p)
    if uid != os.getuid():
        os.chown(p, uid, uid)
    socks.append(s)
if uid != os.getuid():
    os.setgid(uid)
    os.setuid(uid)
for s in socks:
    s.listen(8)
print("ready", flush=True)
while True:
    for s in select.select(socks, [], [])[0]:
        c, _ = s.accept()
        c.settimeout(2)
        n = 0
        try:
            while d := c.recv(65536):
                n += len(d)
        except OSError:
            pass
        print(f"got {n}", flush=True)
        c.close()
"""


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


class Listener:
    """Sockets at ``paths``, listened on as ``uid`` (optionally under ``wrap``, e.g. unshare)."""

    def __init__(self, uid: int, *paths: Path, wrap: tuple[str, ...] = ()) -> None:
        self.proc = subprocess.Popen([*wrap, sys.executable, "-c", LISTENER, str(uid), *map(str, paths)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        ready = self.proc.stdout.readline()  # type: ignore[union-attr]
        if ready != "ready\n":
            self.proc.kill()
            pytest.skip(f"cannot listen as {uid} {wrap}: {self.proc.communicate()[1].strip()[-300:]}")

    def received(self) -> list[int]:
        """Bytes each connection sent, once it is stopped."""
        self.proc.kill()
        out, _ = self.proc.communicate()
        return [int(line.split()[1]) for line in out.splitlines() if line.startswith("got ")]


@pytest.fixture
def short_tmp():
    """A folder with a short path: what these tests put in it must fit AF_UNIX's limit (SUN_PATH_MAX)
    as it would in a real runtime dir, which pytest's tmp_path (longer under xdist, popen-gwN/) need not."""
    folder = Path(tempfile.mkdtemp(prefix="li-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def deep(short_tmp, monkeypatch):
    """A data dir deep enough that the sockets move to $TMPDIR/localinfer-UID; where they go."""
    tmp_path = short_tmp  # $TMPDIR/localinfer-UID/<digest>.sock must fit AF_UNIX's limit
    home = tmp_path / ("d" * 100) / "home"
    home.mkdir(parents=True)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    where = start.place(home)
    assert where.commands.parent == tmp / f"localinfer-{os.getuid()}"
    yield home, tmp, where
    _kill_resident(home)


def _refused(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith("Error: refusing") and all(w in first for w in words), proc.stderr


@as_root
def test_a_folder_another_user_made_first_gets_no_command(deep, smollm2_path):
    home, tmp, where = deep
    folder = where.commands.parent
    folder.mkdir(mode=0o700)
    os.chown(folder, NOBODY, NOBODY)
    spy = Listener(NOBODY, where.commands, where.socket)
    proc = _cli("run", "-m", str(smollm2_path), "-n", "2", "--keep-alive", "60s", "Hi", env=_env(home, tmp))
    assert spy.received() == [], "nothing connected to the other user's sockets"
    _refused(proc, str(folder), f"uid {NOBODY}")
    for args in (("ps",), ("stop", "--all")):
        _refused(_cli(*args, env=_env(home, tmp)), str(folder))


@as_root
def test_a_socket_of_another_uid_in_our_folder_gets_nothing(deep, smollm2_path):
    home, tmp, where = deep
    start.private_folder(where.commands.parent)
    spy = Listener(NOBODY, where.commands, where.socket)
    proc = _cli("run", "-m", str(smollm2_path), "-n", "2", "--keep-alive", "60s", "Hi", env=_env(home, tmp))
    ps = _cli("ps", env=_env(home, tmp))
    stop = _cli("stop", "--all", env=_env(home, tmp))
    assert set(spy.received()) <= {0}, "connected, but sent nothing: not the argv, the environment, the fds"
    _refused(proc, f"uid {NOBODY}")
    _refused(ps, str(where.socket), f"uid {NOBODY}")
    _refused(stop, str(where.socket), f"uid {NOBODY}")


def test_a_symlinked_folder_is_refused_even_to_our_own_socket(deep, smollm2_path, tmp_path):
    home, tmp, where = deep
    elsewhere = tmp_path / "elsewhere"
    start.private_folder(elsewhere)
    where.commands.parent.symlink_to(elsewhere)
    spy = Listener(os.getuid(), elsewhere / where.commands.name, elsewhere / where.socket.name)
    proc = _cli("run", "-m", str(smollm2_path), "-n", "2", "--keep-alive", "60s", "Hi", env=_env(home, tmp))
    assert spy.received() == []
    _refused(proc, "symbolic link")


@as_root
def test_a_listener_in_another_mount_namespace_gets_nothing(deep, smollm2_path):
    if not shutil.which("unshare"):
        pytest.skip("no unshare(1)")
    home, tmp, where = deep
    start.private_folder(where.commands.parent)
    spy = Listener(os.getuid(), where.commands, where.socket, wrap=("unshare", "--mount", "--propagation", "private"))
    proc = _cli("run", "-m", str(smollm2_path), "-n", "2", "--keep-alive", "60s", "Hi", env=_env(home, tmp))
    assert set(spy.received()) <= {0}
    _refused(proc, "mount namespace")


def test_xdg_runtime_dir_is_preferred_when_it_is_private(short_tmp, monkeypatch):
    tmp_path = short_tmp
    deep_home = tmp_path / ("d" * 100)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert start.place(deep_home).commands.parent == runtime / "localinfer"
    assert start.place(tmp_path / "h").commands.parent == tmp_path / "h" / "resident", "a short data dir keeps its own"
    runtime.chmod(0o755)
    assert start.place(deep_home).commands.parent != runtime / "localinfer", "not private: not used"
    monkeypatch.setenv("XDG_RUNTIME_DIR", "relative/run")
    assert start.place(deep_home).commands.parent.parent == Path(tempfile.gettempdir())


def test_a_server_started_without_xdg_runtime_dir_is_found_with_it(short_tmp, monkeypatch):
    tmp_path = short_tmp
    # cron or a service has no XDG_RUNTIME_DIR, a login shell has one: one data dir, one server
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    deep_home = tmp_path / ("d" * 100)
    where = start.place(deep_home)
    where.socket.parent.mkdir(mode=0o700)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(where.socket))
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    try:
        assert start.place(deep_home).socket == where.socket
    finally:
        listener.close()
        where.socket.unlink()
    assert start.place(deep_home).socket.parent == runtime / "localinfer", "none started yet: XDG_RUNTIME_DIR's"


def test_a_folder_others_may_enter_is_refused_before_connecting(tmp_path):
    folder = tmp_path / "sockets"
    folder.mkdir(mode=0o700)
    assert start.connect(folder / "x.cmd") is None, "nothing there: none runs"
    folder.chmod(0o733)
    with pytest.raises(start.Untrusted, match="others may enter it"):
        start.connect(folder / "x.cmd")
    assert start.connect(tmp_path / "absent" / "x.cmd") is None
