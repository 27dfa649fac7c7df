"""A model's multimodal projector (its ``mmproj`` GGUF: images in), kept beside it in the manifest.

An entry's ``"mmproj"`` is one file record (``filename``, ``sha256``, ``size``, and ``path`` for a
file used in place; a store entry's is a blob). It is checked like any GGUF we read (the hostile-header
checks), must say ``general.architecture = clip`` with a vision encoder, and is verified by digest
whenever the model resolves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localinfer.errors import InvalidModelError, ModelNotFoundError

if TYPE_CHECKING:
    from localinfer.gguf import GGUFInfo
    from localinfer.store.manifest import Store
    from localinfer.store.types import ProgressSink


def read_projector(path: Path, shown: str | None = None) -> GGUFInfo:
    """``path``'s header, refused unless it is a sound GGUF holding a CLIP vision projector."""
    from localinfer.gguf import read_gguf

    shown = shown or str(path)
    if not path.exists():
        raise ModelNotFoundError(f"no such projector file: {shown}", hint="check the path")
    if not path.is_file():
        raise InvalidModelError(f"projector {shown} is not a file")
    info = read_gguf(path)
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


def pick_projector(files: list[str], model_file: str) -> str | None:
    """The repo's ``mmproj*.gguf`` that goes with ``model_file``: the one of its quantization, else the
    widest float (F16, BF16, F32), else the first by name; None where the repo has none."""
    from localinfer.store.names import quant_of

    found = sorted(f for f in files if f.rsplit("/", 1)[-1].lower().startswith("mmproj") and f.lower().endswith(".gguf"))
    if not found:
        return None
    by_quant = {(quant_of(f) or "").upper(): f for f in found}
    for q in ((quant_of(model_file) or "").upper(), "F16", "BF16", "F32"):
        if q and q in by_quant:
            return by_quant[q]
    return found[0]


SKIP = "none"  # `pull --mmproj none` / `--no-mmproj`: the model alone, text only


@dataclass(frozen=True)
class HubProjector:
    """The projector a Hub pull fetches beside the model, known before any byte is downloaded."""

    name: str
    meta: Any  # hub.FileMeta
    size: int | None
    sha256: str


def plan_hub_projector(repo: str, commit: str, listing: Any, model_file: str, choice: str | None,
                       progress: ProgressSink) -> HubProjector | None:  # fmt: skip
    """Which projector a Hub pull takes: ``choice`` None (the default) is "auto" in a repo that lists
    mmproj files and nothing in one that lists none (a text model pulls as before); "auto":
    :func:`pick_projector`; :data:`SKIP`: none; else a file in the repo. Checked (named, digest known)
    before the model is downloaded, so a bad choice costs no transfer."""
    from localinfer.store.sources import hub

    found = sorted(f for f in listing.files if f.rsplit("/", 1)[-1].lower().startswith("mmproj"))
    if choice is None:
        choice = "auto" if found else SKIP
    if choice.lower() == SKIP:
        return None
    name = pick_projector(list(listing.files), model_file) if choice == "auto" else choice
    if name is None:
        progress.note(f"{repo} holds no mmproj file: the model takes text only")
        return None
    if name not in listing.files:
        raise ModelNotFoundError(f"projector not found in {repo}: {name}",
                                 hint=f"projectors there: {', '.join(found) or 'none'}; --no-mmproj pulls the model alone")  # fmt: skip
    remote = listing.files[name]
    meta = hub.file_metadata(repo, commit, name)
    sha = remote.sha256 or hub.etag_sha256(meta.etag)
    if not sha:
        raise InvalidModelError(f"the Hub gives no sha256 for {repo}/{name}, so it cannot be verified; not downloading it")
    return HubProjector(name, meta, remote.size if remote.size is not None else meta.size, sha)


def attach_hub_projector(store: Store, entry: dict[str, Any], files: list[dict[str, Any]], *, repo: str,
                         plan: HubProjector, progress: ProgressSink, fetch: Any) -> list[Path]:  # fmt: skip
    """Fetch (verified, resuming) the projector ``plan`` names and record it in ``entry`` (store.pull's
    Hub path); the blobs the entry now needs too. ``fetch``: store.pull's fetch of one verified blob.
    Until it is recorded, nothing is installed. A transfer cut (or Ctrl-C) leaves the model's verified
    blobs unlisted for the next pull to take again, and the projector's bytes in ``partial/`` to
    resume (as a split model's shards); a refused projector takes the model's blobs no entry uses with
    it (an installed entry, on a re-pull, keeps its own)."""
    from localinfer.errors import LocalInferError, NetworkError
    from localinfer.store.blobs import gc_blobs

    try:
        blob, _info = fetch(store, repo=repo, filename=plan.name, meta=plan.meta, size=plan.size, sha256=plan.sha256,
                            progress=progress)  # fmt: skip
        read_projector(blob, f"{repo}/{plan.name}")
    except NetworkError:
        raise
    except LocalInferError:
        gc_blobs(store, [rec["sha256"] for rec in files] + [plan.sha256])
        raise
    entry["mmproj"] = {"filename": plan.name, "sha256": plan.sha256, "size": blob.stat().st_size}
    return [blob]
