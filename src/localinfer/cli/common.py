"""What every command shares: error handling, stderr console, option types.

Commands translate flags and call the core; all user-facing failure handling lives here, driven by
the one exception table in :mod:`localinfer.errors`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import NoReturn

import typer

from localinfer.errors import ExitCode, LocalInferError, exit_code_for

SIGPIPE_EXIT = 141  # 128 + SIGPIPE, what a native tool reports when its reader went away


def debug_enabled() -> bool:
    return os.environ.get("LOCALINFER_DEBUG", "").strip() not in ("", "0", "false", "no")


def print_error(message: str, hint: str | None = None) -> None:
    """One line on stderr (plus one hint line), no markup, no traceback."""
    text = f"Error: {message}"
    if hint:
        text += f"\n  hint: {hint}"
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except (BrokenPipeError, OSError):
        pass


def _silence_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so the interpreter's final flush is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


@contextlib.contextmanager
def handle_errors() -> Iterator[None]:
    """Turn our exceptions, Ctrl-C and a closed stdout into a message and an exit code."""
    try:
        yield
    except typer.Exit:
        raise
    except BrokenPipeError:
        _silence_stdout()
        raise typer.Exit(SIGPIPE_EXIT) from None
    except KeyboardInterrupt:
        if debug_enabled():
            raise
        try:
            sys.stdout.flush()
        except (BrokenPipeError, OSError, ValueError):
            _silence_stdout()
        print_error("interrupted")
        raise typer.Exit(ExitCode.INTERRUPTED) from None
    except LocalInferError as exc:
        if debug_enabled():
            raise
        print_error(str(exc), exc.hint)
        raise typer.Exit(exit_code_for(exc)) from None
    except OSError as exc:
        if debug_enabled():
            raise
        known = _os_error(exc)
        if known is None:
            _internal(exc)
        message, hint, code = known
        print_error(message, hint)
        raise typer.Exit(code) from None
    except Exception as exc:  # last line of defence: one line, not a traceback
        if debug_enabled():
            raise
        _internal(exc)


def _internal(exc: BaseException) -> NoReturn:
    print_error(
        f"internal error: {type(exc).__name__}: {exc}",
        "set LOCALINFER_DEBUG=1 to see the traceback, and please report it",
    )
    raise typer.Exit(ExitCode.RUNTIME) from None


def _os_error(exc: OSError) -> tuple[str, str, ExitCode] | None:
    """The OS refusals a user can meet anywhere (a full disk, a read-only folder), as one line."""
    import errno

    where = f" writing {exc.filename}" if exc.filename else ""
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return f"the disk is full{where}", "free some space and run the command again", ExitCode.RESOURCES
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM) and exc.filename:
        return f"cannot write {exc.filename}: {exc.strerror}", "check that folder's permissions", ExitCode.USAGE
    return None
