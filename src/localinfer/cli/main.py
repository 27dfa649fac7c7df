"""The `localinfer` command: wires the command modules into one Typer app.

Each command lives in its own module and only translates flags into a call to the core. Command
modules import nothing heavy at import time, so `localinfer --help` stays fast.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import typer

from localinfer import __version__

# Modules under localinfer.cli; each has register(app), which adds its command(s).
_COMMAND_MODULES: tuple[str, ...] = (
    "run",
    "chat",
    "pull",
    "models",
    "batch",
    "embed",
    "serve",
    "launch",
    "ps",
    "bench",
    "stats",
    "doctor",
)


# `localinfer --help`'s list of commands, as the command modules' docstrings summarize them
# (tests/test_cli_runner.py: the listing app prints what the whole app prints). Listed from here, none
# of those modules is imported: where their bytecode is not written (PYTHONDONTWRITEBYTECODE, a
# checkout never run before) compiling them was a third of --help's time (1.57 x `import typer`).
_LISTING: tuple[tuple[str, str], ...] = (
    ("run", "Run a prompt and stream the answer to stdout"),
    ("chat", "Chat with a model: a REPL on a terminal (/help lists its commands)"),
    ("pull", "Download a model (resuming, sha256-verified) or register a local GGUF file without copying it"),
    ("list", "List installed models (name, size, quant, params, arch, context, source, last used) and disk use"),
    ("show", "Show a model's architecture, parameters, quantization, context, layers, template, license, path, sha256"),
    ("rm", "Remove a model: frees its disk space"),
    ("verify", "Re-hash installed models against their recorded sha256"),
    ("batch", "Run many requests through one model, several sequences at a time"),
    ("embed", "Embed texts (one vector per line) with a local model or a server's /v1/embeddings"),
    ("serve", "Serve a model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/embeddings)"),
    ("launch", "Run a coding agent (Claude Code, Codex, OpenCode, Qwen Code, Crush, Continue) on a local model: a `serve` is started in the "
               "background if none runs (and left running: `localinfer stop` stops it)"),
    ("ps", "List the models kept loaded by --keep-alive (size, sequences, context, idle time, unload time)"),
    ("stop", "Unload a resident model (or all of them: the server then exits, and the server `launch` started stops)"),
    ("bench", "Measure prompt processing (pp) and generation (tg) speed, as llama-bench does, for one or more models and settings"),
    ("stats", "Usage from the history: tokens in and out, requests, TTFT and tok/s per model and per day"),
    ("doctor", "Check this machine: CPU, RAM, GPUs, the llama.cpp build, disk"),
)  # fmt: skip


def _version_callback(value: bool) -> None:
    import typer

    if value:
        sys.stdout.write(f"localinfer {__version__}\n")
        raise typer.Exit()


def build_app(only: str | None = None, *, listing: bool = False) -> typer.Typer:
    """The app with every command; ``only``: with that command module's alone (``localinfer run``
    needs no other: building all of them costs ~10 ms of its way to the first token).

    ``listing``: for `localinfer --help`, which lists the commands and their summaries only: the
    commands of ``_LISTING``, which take no parameters (Typer would turn every parameter of every
    command into a Click option before it prints that list, 190 of them) and import no command module.
    """
    import typer

    app = typer.Typer(
        name="localinfer",
        help="Local, on-device LLM inference: pull GGUF models, run and chat with them, measure honestly.",
        no_args_is_help=True,
        add_completion=True,  # --install-completion, --show-completion (bash, zsh, fish, PowerShell)
        pretty_exceptions_enable=False,
        rich_markup_mode=None,  # plain Click-style help: keeps `--help` fast (no rich import)
        context_settings={"help_option_names": ["-h", "--help"]},
    )

    @app.callback()
    def _root(
        version: bool = typer.Option(
            False, "--version", "-V", help="Print the version and exit.", callback=_version_callback, is_eager=True
        ),
    ) -> None:
        """Local, on-device LLM inference."""

    if listing:
        for name, summary in _LISTING:
            app.command(name=name, short_help=summary)(_listed)
        return app
    for module_name in _COMMAND_MODULES if only is None else (only,):
        module = importlib.import_module(f"localinfer.cli.{module_name}")
        module.register(app)
    for info in app.registered_commands:
        if info.short_help is None:
            info.short_help = _summary(info.help or (info.callback.__doc__ if info.callback else None))
    return app


def _listed() -> None:
    """A listing app's command: it takes no parameters and only shows in the list."""
    raise AssertionError("a listing app only prints help")  # pragma: no cover


def _summary(doc: str | None) -> str | None:
    """A command's first clause (to its first "." or ";"), whole: Click would cut the help to the
    width left at "..." in `localinfer --help`'s list of commands; given whole, it wraps it."""
    if not doc:
        return None
    words = doc.strip().split("\n\n")[0].split()
    end = next((i for i, w in enumerate(words) if w.endswith((".", ";"))), len(words) - 1)
    return " ".join(words[: end + 1]).rstrip(";.")


def entry() -> None:
    """The console script and `python -m localinfer`: :func:`main`, then the process ends as the
    interpreter would end it - the same status, atexit handlers run, stdout and stderr flushed - but
    without tearing every module and object down one by one: Python's finalizing garbage
    collections cost a `run` ~10% of its whole time, for memory the OS takes back at once. Where
    that end could differ (another thread still running, a failing flush, ``python -i``), the
    interpreter ends it as usual."""
    try:
        main()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    _leave(code)


def exit_status(code: object) -> int:
    """What the interpreter makes of SystemExit(code): None is 0, a number itself, anything else is
    written to stderr and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    try:
        sys.stderr.write(f"{code}\n")
    except Exception:  # noqa: BLE001
        pass
    return 1


def _leave(code: object) -> None:
    import threading

    others = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if others or sys.flags.inspect or os.name != "posix":  # (Windows: C's buffers are not ours to flush)
        raise SystemExit(code)
    import atexit

    atexit._run_exitfuncs()
    if "ctypes" in sys.modules:  # native code may have written through C's stdio buffers
        try:
            import ctypes

            ctypes.CDLL(None).fflush(None)
        except (OSError, AttributeError):
            pass
    status = exit_status(code)
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # noqa: BLE001 - the interpreter's own last flush reports it (status 120)
            raise SystemExit(status) from None
    os._exit(status)


def main() -> None:
    """The command line, run in this process (a caller may go on after it: see :func:`entry`)."""
    if sys.argv[1:] in (["--version"], ["-V"]):  # answered before Typer is even imported
        sys.stdout.write(f"localinfer {__version__}\n")
        return
    try:
        if sys.argv[1:2] == ["run"]:  # with keep-alive on: run by the resident server's runner, if it can
            from localinfer.resident.command import hand_over

            status = hand_over(sys.argv)
            if status is not None:
                raise SystemExit(status)
        # before any of our dataclasses is created: their methods' code, compiled once (not at
        # package import: a handed-over run above and a library user's process stay untouched)
        from localinfer import codecache

        codecache.install()
        # `localinfer run` builds only its own command: building every one costs ~10 ms of its way
        # to the first token.
        only = "run" if sys.argv[1:2] == ["run"] else None
        # `localinfer`, `localinfer --help`: only the list of commands (not while completing, which
        # runs with no arguments too and needs every command's options)
        listing = sys.argv[1:] in ([], ["-h"], ["--help"]) and "_LOCALINFER_COMPLETE" not in os.environ
        app = build_app(only, listing=listing)
        if only is None and len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
            _check_command(sys.argv[1], [c.name or c.callback.__name__ for c in app.registered_commands if c.callback])
        app(prog_name="localinfer")
    except KeyboardInterrupt:  # before Typer took over (it handles its own): no traceback
        raise SystemExit(130) from None


def _check_command(word: str, commands: list[str]) -> None:
    """An unknown command is one line with a suggestion (Click's own error takes three)."""
    if word in commands:
        return
    from localinfer.cli.common import print_error
    from localinfer.fuzzy import did_you_mean

    print_error(f"no such command '{word}'", did_you_mean(word, commands) or "localinfer --help lists the commands")
    raise SystemExit(2)
