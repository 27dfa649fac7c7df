"""Where localinfer keeps its files, resolved when called (never at import time).

``LOCALINFER_HOME`` puts everything under one folder (tests use it; a relative path is refused);
otherwise the platform's data and config dirs (platformdirs): ``~/.local/share/localinfer`` and
``~/.config/localinfer`` on Linux. A data dir that cannot hold our files (a file in the way, read-only) is a usage error
with a hint, raised by :func:`data_dir` before any command reaches the store.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from pathlib import Path

# False inside unchecked(): doctor reports an unusable data dir instead of failing on it.
_checking = contextvars.ContextVar("localinfer_paths_checking", default=True)


def data_dir() -> Path:
    """Models, manifest, history, chat history.

    Raises UsageError (exit 2) when it cannot hold them (see :func:`data_dir_problem`): every command
    that keeps files then fails with one line and a hint, not deep in the store with an OSError.
    """
    path = _raw_data_dir()
    if _checking.get():
        _refuse_relative_home()
        problem = data_dir_problem(path)
        if problem:
            from localinfer.errors import UsageError

            named = f"LOCALINFER_HOME={path}" if os.environ.get("LOCALINFER_HOME") else f"the data folder {path}"
            raise UsageError(f"{named} cannot be used: {problem}", hint="set LOCALINFER_HOME to a folder you can write")
    return path


def _raw_data_dir() -> Path:
    home = os.environ.get("LOCALINFER_HOME")
    if home:
        return Path(home).expanduser().absolute()  # a relative one is refused by data_dir()
    import platformdirs

    return Path(platformdirs.user_data_dir("localinfer", appauthor=False))


def _relative_home() -> str | None:
    """LOCALINFER_HOME when it is a relative path: it would name another store in every working
    directory, each command silently using (or creating) its own, so it is refused rather than
    resolved (docs/models-and-store.md, "Where files live")."""
    home = os.environ.get("LOCALINFER_HOME")
    return home if home and not Path(home).expanduser().is_absolute() else None


def _refuse_relative_home() -> None:
    home = _relative_home()
    if home:
        from localinfer.errors import UsageError

        raise UsageError(
            f"LOCALINFER_HOME={home} is a relative path: it would mean another folder in each working directory",
            hint=f"set it to an absolute path, such as LOCALINFER_HOME={Path(home).expanduser().absolute()}",
        )


def data_dir_problem(path: Path | None = None) -> str | None:
    """Why the data dir (``path``) cannot hold our files, or None when it can: a file in the way, or
    a folder we cannot write (a read-only mount, no permission). Two or three stats, no writes."""
    if _relative_home() and (path is None or path == _raw_data_dir()):
        return f"LOCALINFER_HOME={_relative_home()} is a relative path (another folder in each working directory)"
    probe = _raw_data_dir() if path is None else path
    while not probe.is_dir():  # the folder, else the nearest parent it would be created in
        if probe.exists() or probe.is_symlink():
            if probe.is_dir():
                break  # another process created it between the two looks (several commands at once)
            return f"{probe} is a file, not a folder"
        if probe.parent == probe:
            return f"{probe} does not exist"
        probe = probe.parent
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    return None


@contextlib.contextmanager
def unchecked() -> Iterator[None]:
    """data_dir() without its check, for code that reports the problem itself (doctor)."""
    token = _checking.set(False)
    try:
        yield
    finally:
        _checking.reset(token)


def config_dir() -> Path:
    """User overrides such as an extra ``models.toml``."""
    home = os.environ.get("LOCALINFER_HOME")
    if home:
        return Path(home).expanduser().absolute() / "config"  # a relative one: refused by data_dir()
    import platformdirs

    return Path(platformdirs.user_config_dir("localinfer", appauthor=False))


def models_dir() -> Path:
    """The model store: verified blobs and the manifest."""
    return data_dir() / "models"


def file_identity(path: str | os.PathLike[str]) -> tuple[int, int, int, int, int] | None:
    """What tells a file's bytes apart cheaply: size, modification and change times (ns), inode and
    device; None when there is no such file. Rewriting a file in place moves its change time, which
    no one can set back (on POSIX; Windows reports the creation time there, and the rest must do)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def boot_id() -> str | None:
    """This run of the machine, where the OS names it (Linux): it changes at every restart, and so
    after any crash. None elsewhere."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return None
