"""A first look at ``run``'s command line, before Typer is imported: which model will it load?

Only a head start (``localinfer.preload``): Typer still parses the arguments, and the engine uses
the early load only if it matches what was finally asked. Anything unusual (an option not in these
tables, ``--help``, ``--verbose``, ``--``, a missing value) means no head start.
``tests/test_preload.py`` checks the tables against ``localinfer run --help``.
"""

from __future__ import annotations

VALUE_OPTIONS = frozenset({
    "-p", "--prompt", "-m", "--model", "-s", "--system", "--temperature", "--temp", "--top-p",
    "--top-k", "--min-p", "--repeat-penalty", "--seed", "-n", "--max-tokens", "--stop", "-c",
    "--ctx-size", "-t", "--threads", "-ngl", "--gpu-layers", "-fa", "--flash-attn", "-ctk",
    "--cache-type-k", "-ctv", "--cache-type-v", "-b", "--batch-size", "--on-overflow",
})  # fmt: skip
FLAGS = frozenset({
    "--no-mmap", "--mlock", "--force", "--raw", "--offline", "--no-log", "--json", "-q", "--quiet",
})  # fmt: skip
NO_HEAD_START = frozenset({"-h", "--help", "-v", "--verbose", "--"})  # --verbose: llama.cpp's log is shown live


def run_model(args: list[str]) -> tuple[bool, str | None]:
    """(whether the model can be told, the -m/--model value or None for the default) for ``run args``."""
    model: str | None = None
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg in NO_HEAD_START:
            return False, None
        if not arg.startswith("-") or arg == "-":
            continue  # a word of the prompt
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in FLAGS and not eq:
            continue
        if name not in VALUE_OPTIONS:
            return False, None
        if not eq:
            if i >= len(args):
                return False, None
            value = args[i]
            i += 1
        if name in ("-m", "--model"):
            model = value
    return True, model


def preload_run(args: list[str]) -> None:
    """Start loading the model ``localinfer run args`` will use, when that can be told from ``args``."""
    ok, model = run_model(args)
    if ok:
        from localinfer import preload

        preload.start(model)
