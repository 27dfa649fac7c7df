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


ALIASES = {"-m": "--model", "-n": "--max-tokens"}  # the options read here, by their long name


def scan(args: list[str]) -> dict[str, str] | None:
    """The options ``run args`` gives, by long name where ``ALIASES`` has one (the last value wins, as
    in Typer); None when the command line is unusual enough to give no head start."""
    values: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg in NO_HEAD_START:
            return None
        if not arg.startswith("-") or arg == "-":
            continue  # a word of the prompt
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in FLAGS and not eq:
            continue
        if name not in VALUE_OPTIONS:
            return None
        if not eq:
            if i >= len(args):
                return None
            value = args[i]
            i += 1
        values[ALIASES.get(name, name)] = value
    return values


def max_tokens(values: dict[str, str]) -> int | None:
    """The cap ``-n/--max-tokens`` puts on the answer (None: none, or not a number Typer would take)."""
    given = values.get("--max-tokens", "").strip()
    return int(given) if given.isdecimal() else None  # not isdigit(): "²" is a digit int() refuses


def preload_run(args: list[str]) -> None:
    """Start loading the model ``localinfer run args`` will use, when that can be told from ``args``."""
    values = scan(args)
    if values is not None:
        from localinfer import preload

        preload.start(values.get("--model"), max_tokens(values))
