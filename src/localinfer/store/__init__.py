"""The model store: resolve names and paths to verified GGUF files, pull from the Hub, manage installs.

Nothing heavy is imported here: ``huggingface_hub`` is imported only inside the functions that talk to
the Hub.
"""

from __future__ import annotations

from localinfer.store.resolve import resolve_model
from localinfer.store.types import NullProgress, ProgressSink, ResolvedModel


def touch(name: str) -> None:
    """Record that the installed model ``name`` was just used (``list``'s "last used"); cheap, silent."""
    from localinfer.errors import LocalInferError
    from localinfer.store.manifest import Store

    try:
        Store().touch(name)
    except (OSError, LocalInferError):  # an unreadable manifest is reported by the commands that need it
        pass


__all__ = ["NullProgress", "ProgressSink", "ResolvedModel", "resolve_model", "touch"]
