"""Our exception types and the one table that maps them to messages and exit codes.

Every failure a user can cause or meet is one of these; the CLI prints ``str(exc)`` on one line
(plus ``exc.hint`` when set) and exits with the code from :data:`EXIT_CODES`.
"""

from __future__ import annotations

import enum
from typing import Any


class ExitCode(enum.IntEnum):
    """Documented exit codes (docs/run.md, "Exit codes")."""

    OK = 0
    RUNTIME = 1  # the model failed while loading or generating, or an unexpected internal error
    USAGE = 2  # bad option, bad value, bad input (same code Typer/Click use for usage errors)
    NOT_FOUND = 3  # model name or file not found (not in registry, store or on disk)
    BAD_MODEL = 4  # a file that is not a valid GGUF, or whose checksum does not match
    NETWORK = 5  # download failed: hub unreachable, gated repo, transfer broken
    RESOURCES = 6  # not enough memory or disk, or the context window is too small
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)


class LocalInferError(Exception):
    """Base of every error we expect; ``hint`` says what to do about it."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class UsageError(LocalInferError):
    """The user asked for something that does not make sense (bad value, missing prompt)."""


class ModelNotFoundError(LocalInferError):
    """A model name that resolves to nothing, or a path that does not exist."""


class InvalidModelError(LocalInferError):
    """A file that is not a valid GGUF, or that is unreadable."""


class ChecksumError(InvalidModelError):
    """The bytes on disk are not the bytes the source promised."""


class NetworkError(LocalInferError):
    """Downloading failed (unreachable hub, broken transfer, gated repository)."""


class ContextOverflowError(LocalInferError):
    """Prompt plus requested tokens do not fit in the context window."""

    def __init__(self, message: str, hint: str | None = None, *, prompt_tokens: int | None = None) -> None:
        super().__init__(message, hint)
        self.prompt_tokens = prompt_tokens  # the prompt's length, where it was counted


def line_error(exc: BaseException) -> str:
    """A batch line's ``error``: the message, and a context overflow's hint (what to change differs
    from line to line), the same whichever backend ran the line."""
    hint = exc.hint if isinstance(exc, ContextOverflowError) else None
    return str(exc) + (f" ({hint})" if hint else "")


class ResourceError(LocalInferError):
    """Not enough memory or disk for what was asked."""


class ModelLoadError(LocalInferError):
    """llama.cpp refused to load the model or create the context."""


class GenerationError(LocalInferError):
    """llama.cpp failed in the middle of evaluating or sampling."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during an answer, carrying what was answered so far: ``partial``, an Answer (from a
    server's client, its Received until the backend makes it an Answer), or None when nothing came.
    A KeyboardInterrupt, so everything that stops on Ctrl-C stops on it."""

    def __init__(self, partial: Any = None) -> None:  # answer.Answer | answer.Received | None (errors imports nothing)
        super().__init__()
        self.partial = partial


# One table, subclasses before their bases (the first isinstance match wins).
EXIT_CODES: tuple[tuple[type[BaseException], ExitCode], ...] = (
    (ChecksumError, ExitCode.BAD_MODEL),
    (InvalidModelError, ExitCode.BAD_MODEL),
    (ModelNotFoundError, ExitCode.NOT_FOUND),
    (UsageError, ExitCode.USAGE),
    (NetworkError, ExitCode.NETWORK),
    (ContextOverflowError, ExitCode.RESOURCES),
    (ResourceError, ExitCode.RESOURCES),
    (ModelLoadError, ExitCode.RUNTIME),
    (GenerationError, ExitCode.RUNTIME),
    (LocalInferError, ExitCode.RUNTIME),
    (Interrupted, ExitCode.INTERRUPTED),
    (KeyboardInterrupt, ExitCode.INTERRUPTED),
)


def exit_code_for(exc: BaseException) -> ExitCode:
    """The exit code of an exception; anything unexpected is a runtime error."""
    for kind, code in EXIT_CODES:
        if isinstance(exc, kind):
            return code
    return ExitCode.RUNTIME
