"""A model's multimodal projector (its ``mmproj`` GGUF: images in), kept beside it in the manifest.

An entry's ``"mmproj"`` is one file record (``filename``, ``sha256``, ``size``, and ``path`` for a
file used in place; a store entry's is a blob). It is checked like any GGUF we read (the hostile-header
checks), must say ``general.architecture = clip`` with a vision encoder, and is verified by digest
whenever the model resolves.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from localinfer.errors import InvalidModelError, ModelNotFoundError

if TYPE_CHECKING:
    from localinfer.gguf import GGUFInfo
    from localinfer.store.manifest import Store
    from localinfer.store.types import ProgressSink


def read_projector(path: Path, shown: str | None = None) -> GGUFInfo:
    """``path``'s header, refused unless it is a sound GGUF holding a CLIP vision projector."""
    from localinfer.store.install import read_header

    shown = shown or str(path)
    if not path.exists():
        raise ModelNotFoundError(f"no such projector file: {shown}", hint="check the path")
    if not path.is_file():
        raise InvalidModelError(f"projector {shown} is not a file")
    info = read_header(path)
    if info.architecture != "clip":
        raise InvalidModelError(f"{shown} is not a projector: its general.architecture is {info.architecture!r}, not 'clip'",
                                hint="an mmproj file is named like mmproj-*.gguf beside the model")  # fmt: skip
    if info.metadata.get("clip.has_vision_encoder") is False:
        raise InvalidModelError(f"projector {shown} has no vision encoder: it takes no images")
    return info


def local_record(path: Path, progress: ProgressSink) -> dict[str, Any]:
    """The manifest record of a projector file used in place (checked, then hashed)."""
    from localinfer.store.fsutil import sha256_file

    read_projector(path)
    path = path.resolve()
    size = path.stat().st_size
    progress.start(f"hashing {path.name}", size)
    try:
        digest = sha256_file(path, progress.advance)
    finally:
        progress.finish()
    return {"filename": path.name, "path": str(path), "sha256": digest, "size": size}


def projector_path(store: Store, entry: dict[str, Any]) -> Path | None:
    rec = entry.get("mmproj")
    if not isinstance(rec, dict):
        return None
    return store.blob_path(rec["sha256"]) if entry.get("kind") == "store" else Path(rec["path"])


def verified_projector(store: Store, entry: dict[str, Any], progress: ProgressSink | None = None) -> Path | None:
    """The entry's projector, its digest checked (cheaply, through the digest cache) and its header read."""
    from localinfer.errors import ChecksumError
    from localinfer.store.install import verify_file

    path = projector_path(store, entry)
    if path is None:
        return None
    name = entry["name"]
    if not path.is_file():
        raise ModelNotFoundError(f"the projector of {name!r} is missing ({path})",
                                 hint=f"run 'localinfer pull' for {name} again, or 'localinfer rm {name}'")  # fmt: skip
    try:
        verify_file(store, path, entry["mmproj"]["sha256"], progress=progress, label=f"verifying {name}'s projector")
    except ChecksumError as exc:
        raise ChecksumError(f"{name}: {exc}", hint=f"pull {name} with its projector again") from None
    read_projector(path)
    return path


def record_problem(rec: Any) -> str | None:
    """What is wrong with an entry's ``mmproj`` record (manifest.entry_problem's check), or None."""
    from localinfer.store.untrusted import is_sha256

    if rec is None:
        return None
    if not isinstance(rec, dict) or not is_sha256(rec.get("sha256")) or not isinstance(rec.get("filename"), str):
        return "a projector without a valid sha256 or name"
    if rec.get("path") is not None and not isinstance(rec.get("path"), str):
        return "a projector with a bad path"
    return None
