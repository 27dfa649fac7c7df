"""Where the resident server lives and how it is started, with the standard library alone: the lean
`run` path (``resident.command``) imports this before anything of ours that is heavier.

The starter (the first command, under ``place.lock``) binds both listening sockets itself and hands
them to the two processes it spawns (socket activation): the server (``resident.server``: the models,
HTTP on ``place.socket``) and its command runner (``cli.runner``: the CLI, imported once, on
``place.commands``). A command connects at once and waits in the socket's backlog until the process
accepts: nothing polls. The runner lives as long as the server: it watches a pipe the server holds.

Trust (docs/security.md): both processes start with ``-P`` in ``/`` (nothing of the directory the
first command was typed in is importable), and a client uses a socket only in a folder that is ours
(lstat: no symlink, no group/other bits) and only when the process listening is ours: same uid and,
where /proc tells it, the same mount namespace (:func:`connect`; else :class:`Untrusted`). The
serving side checks its peers the same way (:func:`peer_problem`), and more strictly.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import stat
import struct
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import subprocess

SUN_PATH_MAX = 100  # AF_UNIX paths are at most 104-108 bytes, by platform: a longer one moves to /tmp
_GONE = (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK, errno.EINVAL)
ISOLATED = ("-P",) if sys.version_info >= (3, 11) else ()  # no cwd on sys.path (3.10: the cwd "/" instead)


class Untrusted(PermissionError):
    """A socket, or its folder, that someone else could control: never connected to nor bound in."""


class Place(NamedTuple):
    """The resident server's files: ``folder`` (0700) holds the lock, the log and (usually) the sockets."""

    folder: Path
    socket: Path
    lock: Path
    log: Path
    commands: Path  # the command runner's socket


def place(data_dir: Path) -> Place:
    folder = data_dir / "resident"
    sock, commands = folder / "socket", folder / "commands"
    if len(os.fsencode(commands)) > SUN_PATH_MAX:  # a deep data dir: the sockets in a private folder of /tmp
        import hashlib
        import tempfile

        digest = hashlib.sha256(os.fsencode(data_dir)).hexdigest()[:16]
        tmp = Path(tempfile.gettempdir()) / f"localinfer-{os.getuid()}"
        fits = [b for b in (_runtime_dir(), tmp) if b is not None and len(os.fsencode(b / f"{digest}.cmd")) <= SUN_PATH_MAX]
        # a server started where the other environment put it (cron has no XDG_RUNTIME_DIR, a login
        # shell has one) is found there, not started twice for one data dir
        base = next((b for b in fits if _has_socket(b, f"{digest}.sock")), fits[0] if fits else tmp)
        sock, commands = base / f"{digest}.sock", base / f"{digest}.cmd"
    return Place(folder, sock, folder / "lock", folder / "server.log", commands)


def _has_socket(folder: Path, name: str) -> bool:
    try:
        check_folder(folder)
        return stat.S_ISSOCK((folder / name).lstat().st_mode)
    except OSError:
        return False


def _runtime_dir() -> Path | None:
    """``$XDG_RUNTIME_DIR/localinfer`` when that folder is set and usable (absolute, ours, private):
    nobody else can make a folder there first, as they can in /tmp."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if not xdg or not os.path.isabs(xdg):
        return None
    try:
        st = os.lstat(xdg)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
        return None
    return Path(xdg) / "localinfer"


def unix_sockets() -> bool:
    """Whether this platform has Unix domain sockets (Windows' Python does not expose AF_UNIX)."""
    return hasattr(socket, "AF_UNIX") and os.name == "posix"


def private_folder(path: Path) -> None:
    """Create ``path`` (mode 0700) or check it: ours, and nobody else may enter it. OSError when the
    folder cannot be made (a read-only data dir, a file in the way) or is not private."""
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:  # checked below (a symlink, even a dangling one, is refused)
        pass
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.getuid() or not stat.S_ISDIR(st.st_mode):
        check_folder(path)  # raises Untrusted (a symlink, another user's), or NotADirectoryError
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)  # ours: made private; a socket someone put in it meanwhile fails the peer check
    if not os.access(path, os.W_OK | os.X_OK):
        raise PermissionError(f"{path} is not writable")


def check_folder(path: Path) -> None:
    """``path`` is a folder of ours that nobody else may enter (lstat: a symlink is refused, wherever
    it points). FileNotFoundError when it is not there; Untrusted when it is not ours alone."""
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        raise Untrusted(f"refusing the resident server's folder {path}: it is a symbolic link")
    if st.st_uid != os.getuid():
        raise Untrusted(f"refusing the resident server's folder {path}: it belongs to uid {st.st_uid}, not to you")
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "a file is in the way of a folder", str(path))  # ours: unusable, not hostile
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise Untrusted(f"refusing the resident server's folder {path}: others may enter it (mode {stat.S_IMODE(st.st_mode):o})")


def peer_problem(sock: socket.socket, *, serving: bool = False) -> str | None:
    """Why the process at the other end of ``sock`` is not ours; None when it is: our uid
    (SO_PEERCRED) and, where /proc tells it, our mount namespace (a sandbox or container of the same
    uid sees other files). Without /proc the uid decides. A client (``check_peer``) lets a listener
    whose namespace cannot be read pass (the starter that bound the socket may have exited) and
    raises OSError when the credentials cannot be read; the ``serving`` side refuses both (a process
    of ours can hide its namespace by making itself undumpable). Platforms without SO_PEERCRED: None
    (the folder's checks and the sockets' mode protect)."""
    peercred = getattr(socket, "SO_PEERCRED", None)
    if peercred is None:
        return None
    try:
        pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, peercred, struct.calcsize("3i")))
    except OSError as exc:
        if not serving:
            raise
        return f"cannot be identified ({exc})"
    if uid != os.getuid():
        return f"is uid {uid}'s, not yours"
    try:
        ours = os.readlink("/proc/self/ns/mnt")
    except OSError:  # no /proc (or not allowed to look at our own): the uid decides
        return None
    try:
        theirs = os.readlink(f"/proc/{pid}/ns/mnt") if pid > 0 else None  # 0: in a pid namespace we cannot see
    except OSError:
        theirs = None
    if theirs is None:
        return f"(pid {pid}) is in a mount namespace that cannot be read" if serving else None
    return None if theirs == ours else f"(pid {pid}) is in another mount namespace"


def check_peer(sock: socket.socket, path: Path) -> None:
    """The process listening at ``path`` (``sock`` connected to it) is ours (:func:`peer_problem`);
    Untrusted otherwise."""
    why = peer_problem(sock)
    if why is not None:
        raise Untrusted(f"refusing the socket {path}: the process listening there {why}")


def connect(path: Path, timeout_s: float | None = None) -> socket.socket | None:
    """A connection to the socket at ``path``; None when nothing listens there (no folder, no file,
    or a stale one left by a crashed process). Untrusted when the folder or the listening process is
    not ours alone (nothing was sent); other OSErrors are raised."""
    try:
        check_folder(path.parent)
    except FileNotFoundError:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect(str(path))
        check_peer(sock, path)
        return sock
    except OSError as exc:
        sock.close()
        if exc.errno in _GONE and not isinstance(exc, Untrusted):
            return None
        raise


def alive(path: Path) -> bool:
    sock = connect(path)
    if sock is None:
        return False
    sock.close()
    return True


def bind(path: Path) -> socket.socket:
    """A listening socket at ``path``, 0600 from its creation (umask), in the private folder."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(256)
    return sock


_RUNTIME_NAMES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
_RUNTIME_PREFIXES = ("GGML_", "OMP_", "KMP_", "MKL_", "OPENBLAS_")


def runtime_env(environ: Any = None) -> dict[str, str]:
    """The variables llama.cpp and its thread pools read once, as a process starts: the resident
    server keeps its first command's (a command with others is told so: ``resident.backend``)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k in _RUNTIME_NAMES or k.startswith(_RUNTIME_PREFIXES)}


_STARTUP_PREFIXES = ("PYTHON", "LD_", "DYLD_")  # CPython's variables; the dynamic loader's (Linux/BSD, macOS)


def startup_env(environ: Any = None) -> dict[str, str]:
    """The variables an interpreter and the dynamic loader read once, as a process starts: where
    Python finds code (PYTHONPATH, PYTHONHOME, PYTHONUSERBASE, PYTHONPYCACHEPREFIX...), what it runs
    first (PYTHONSTARTUP, PYTHONINSPECT, PYTHONWARNINGS...), which libraries are loaded (LD_PRELOAD,
    LD_LIBRARY_PATH, LD_AUDIT, DYLD_*). A forked command cannot take another's: the runner takes a
    command only when these are its own (``cli.runner``)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k.startswith(_STARTUP_PREFIXES)}


class Started(NamedTuple):
    server: subprocess.Popen
    ready: int  # read end of a pipe: one byte once the server serves, EOF if it exits first


def start(where: Place, *, max_models: int | None = None, preload: dict[str, Any] | None = None) -> Started | None:
    """Start the server and its command runner unless one runs (None then). The caller holds the lock
    (:func:`locked`); on return both sockets accept connections (the processes are still starting)."""
    if alive(where.socket):  # another command started it while we waited for the lock
        return None
    import subprocess  # here: a command that finds the server running never needs it
    for path in (where.socket, where.commands):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # stale: its process is gone
    server_sock, commands_sock = bind(where.socket), bind(where.commands)
    ready_r, ready_w = os.pipe()
    life_r, life_w = os.pipe()  # the runner's read end sees EOF when the server (which holds the write end) exits
    fd = os.open(where.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        args = [sys.executable, *ISOLATED, "-m", "localinfer.resident.server", "--socket", str(where.socket), "--lock", str(where.lock),
                "--socket-fd", str(server_sock.fileno()), "--ready-fd", str(ready_w), "--life-fd", str(life_w)]  # fmt: skip
        if max_models:
            args += ["--max-models", str(max_models)]
        if preload is not None:
            args.append("--preload")
        server = subprocess.Popen(args, stdin=subprocess.PIPE if preload is not None else subprocess.DEVNULL, stdout=fd,
                                  stderr=fd, start_new_session=True, pass_fds=(server_sock.fileno(), ready_w, life_w),
                                  cwd=os.sep)  # fmt: skip
        runner = [sys.executable, *ISOLATED, "-m", "localinfer.cli.runner", "--socket", str(where.commands), "--lock", str(where.lock),
                  "--socket-fd", str(commands_sock.fileno()), "--life-fd", str(life_r)]  # fmt: skip
        subprocess.Popen(runner, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, start_new_session=True,
                         pass_fds=(commands_sock.fileno(), life_r), cwd=os.sep)  # fmt: skip
    finally:
        for f in (fd, ready_w, life_r, life_w):
            os.close(f)
        server_sock.close()  # theirs now: a process that dies closes the last copy, and waiting commands learn it
        commands_sock.close()
    if server.stdin is not None:
        with contextlib.suppress(OSError):
            server.stdin.write(json.dumps(preload).encode())  # not on its command line, which other users can read
        server.stdin.close()
    return Started(server, ready_r)


@contextlib.contextmanager
def locked(where: Place) -> Any:
    """The start lock (flock), after making the private folders; OSError when they cannot be made."""
    import fcntl

    private_folder(where.folder)
    private_folder(where.socket.parent)
    with open(where.lock, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def unlink_if(path: Path, inode: int, lock: Path) -> None:
    """Remove our socket (not a newer process's), holding the start lock so no starter races us."""
    import fcntl

    with contextlib.suppress(OSError), open(lock, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        if os.stat(path).st_ino == inode:
            path.unlink()
