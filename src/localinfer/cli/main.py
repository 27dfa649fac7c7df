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
    "bench",
    "stats",
    "doctor",
)


def _version_callback(value: bool) -> None:
    import typer

    if value:
        sys.stdout.write(f"localinfer {__version__}\n")
        raise typer.Exit()


def build_app(only: str | None = None) -> typer.Typer:
    """The app with every command; ``only``: with that command module's alone (``localinfer run``
    needs no other: building all of them costs ~10 ms of its way to the first token)."""
    import typer

    app = typer.Typer(
        name="localinfer",
        help="Local, on-device LLM inference: pull GGUF models, run and chat with them, measure honestly.",
        no_args_is_help=True,
        add_completion=False,
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

    for module_name in _COMMAND_MODULES if only is None else (only,):
        module = importlib.import_module(f"localinfer.cli.{module_name}")
        module.register(app)
    return app


def main() -> None:
    """Console-script entry point."""
    # numpy is imported where it pays (engine.kvstate, a large KV cache; a full llama-cpp-python
    # import), never to compute matrices: its OpenBLAS would start a thread per core that spins for
    # ~100-200 ms looking for work, just while a prompt is evaluated. OpenBLAS reads this once; set
    # here, before any thread of ours runs (a C thread reading the environment while Python changes
    # it could crash), unless the user did.
    if "OPENBLAS_NUM_THREADS" not in os.environ:
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
    # numpy sets this one for its import and unsets it after, perhaps on one thread while llama.cpp
    # reads the environment on another. Set, numpy leaves it.
    os.environ.setdefault("OPENBLAS_MAIN_FREE", "1")
    if sys.argv[1:] in (["--version"], ["-V"]):  # answered before Typer is even imported
        sys.stdout.write(f"localinfer {__version__}\n")
        return
    try:
        only = None
        if sys.argv[1:2] == ["run"]:  # llama.cpp starts loading the weights while Typer is imported
            from localinfer.cli.prescan import preload_run

            preload_run(sys.argv[2:])
            only = "run"
        app = build_app(only)
        app(prog_name="localinfer")
    except KeyboardInterrupt:  # before Typer took over (it handles its own): no traceback
        raise SystemExit(130) from None
    finally:
        if "localinfer.preload" in sys.modules:
            sys.modules["localinfer.preload"].settle()
        if "localinfer.engine.twin" in sys.modules:  # an AMX decoding twin still loading: stop it
            sys.modules["localinfer.engine.twin"].settle()
        if "localinfer.engine.bindings" in sys.modules:  # the chat formatter still importing
            sys.modules["localinfer.engine.bindings"].settle()
        # At exit the interpreter garbage-collects everything still alive: 50-100 ms once
        # huggingface_hub or llama_cpp are loaded. The process is ending; let it just free the memory.
        import gc

        gc.freeze()
