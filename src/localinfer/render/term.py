"""Facts about an output stream, asked the same way everywhere: is it a terminal, may it be styled,
and writing a line to it when it may already be gone."""

from __future__ import annotations

import os
from typing import Any, TextIO


def is_tty(stream: Any) -> bool:
    """Whether ``stream`` is a terminal; False for None, a closed stream, or one without ``isatty``."""
    try:
        return bool(stream.isatty())
    except (ValueError, AttributeError):
        return False


def styled(stream: Any) -> bool:
    """Whether ANSI styling may go to ``stream``: a terminal, and NO_COLOR not set."""
    return not os.environ.get("NO_COLOR") and is_tty(stream)


def write_line(stream: TextIO, text: str) -> None:
    """``text`` and a newline, flushed; silent when the stream is closed or its reader went away."""
    try:
        stream.write(text + "\n")
        stream.flush()
    except (OSError, ValueError):
        pass


def console(**kwargs: Any) -> Any:
    """A rich Console whose reader going away (``| head``) is a BrokenPipeError, which the CLI turns
    into exit 141 like every other command: rich's own answer is SystemExit(1)."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return _Console(**kwargs)
