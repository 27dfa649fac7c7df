"""Facts about an output stream, asked the same way everywhere: is it a terminal, may it be styled,
and writing a line to it when it may already be gone."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Sequence
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


def fit_table(console: Any, build: Callable[[Collection[str]], Any], drop_order: Sequence[str]) -> tuple[Any, list[str]]:
    """The table ``build(dropped)`` makes, dropping columns (by header, in ``drop_order``) until it
    fits ``console``'s width.

    Rich would otherwise squeeze every column and cut its cells ("smollm2:1…"); a cell is never cut
    here. Returns the table and the headers dropped. One still too wide is returned whole: print it
    with :func:`print_whole` (the terminal wraps the lines, but no cell loses characters).
    """
    dropped: list[str] = []
    table = build(dropped)
    for header in drop_order:
        if table_width(console, table) <= console.width:
            break
        if any(c.header == header for c in table.columns):
            dropped.append(header)
            table = build(dropped)
    return table, dropped


def table_width(console: Any, table: Any) -> int:
    """The width ``table`` takes with no cell wrapped or cut, not counting what a narrower terminal
    may crop without loss: the padding after the last column of an open box and its rule."""
    from rich.cells import cell_len

    lines = console.render_lines(table, console.options.update(width=10_000), pad=False)
    return max((cell_len("".join(seg.text for seg in line).rstrip(" ─")) for line in lines), default=0)


def print_whole(console: Any, table: Any) -> None:
    """Print ``table`` with no cell cut: wider than the console if it must be (the terminal wraps)."""
    width = console.width
    console.width = max(width, table_width(console, table))
    try:
        console.print(table)
    finally:
        console.width = width


def terminal_width(stream: Any) -> int | None:
    """The columns of the terminal ``stream`` writes to; None when it is not a terminal (a pipe or a
    file keeps one line per line: scripts read those)."""
    if not is_tty(stream):
        return None
    import shutil

    return shutil.get_terminal_size().columns


_HANG = re.compile(r"\s*(?:- |\S.*?\s{2,}(?=\S))?")  # a bullet, or an aligned "key   value" row


def wrap(text: str, width: int | None) -> str:
    """``text`` with each line longer than ``width`` wrapped at word boundaries (never inside a
    word), continuation lines indented under the line's value or bullet text."""
    if not width:
        return text
    import textwrap

    out: list[str] = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        hang = m.end() if (m := _HANG.match(line)) else 0  # it always matches (all optional)
        if hang > width // 2:
            hang = len(line) - len(line.lstrip())
        out += textwrap.wrap(line, width, subsequent_indent=" " * hang, break_long_words=False,
                             break_on_hyphens=False) or [line]  # fmt: skip
    return "\n".join(out)


def write_wrapped(stream: TextIO, text: str) -> None:
    """``text`` and a newline, wrapped at word boundaries to the terminal's width (not on a pipe)."""
    stream.write(wrap(text, terminal_width(stream)) + "\n")
    stream.flush()


def wrap_command(command: str, width: int | None, indent: int) -> str:
    """A shell command indented by ``indent``, wrapped at spaces with ``\\`` continuations so that it
    still pastes as one command (a continuation inside double quotes is removed by the shell too)."""
    pad = " " * indent
    if not width or indent + len(command) <= width:
        return pad + command
    import textwrap

    lines = textwrap.wrap(command, max(20, width - indent - 2), break_long_words=False, break_on_hyphens=False)
    return " \\\n".join(pad + line for line in lines)
