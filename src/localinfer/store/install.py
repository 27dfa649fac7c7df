"""Verified files and installs: hashing against the manifest or registry, assembling a package's
model, and the resolved model an installed entry gives."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localinfer.errors import ChecksumError, InvalidModelError, ModelNotFoundError
from localinfer.store.fsutil import file_lock, fsync_dir, sha256_file
from localinfer.store.loadable import ensure_entry, prove_install
from localinfer.store.manifest import Store, header_summary, now_iso
from localinfer.store.names import ModelSpec
from localinfer.store.types import NullProgress, ProgressSink, ResolvedModel

if TYPE_CHECKING:  # pragma: no cover
    from localinfer.gguf import GGUFInfo
    from localinfer.store.registry import Registry, RegistryEntry


def read_header(path: Path) -> GGUFInfo:
    """Validate a GGUF header (the other engineer's validator); InvalidModelError if it is not one."""
    from localinfer.gguf import read_gguf

    return read_gguf(path)


def read_header_cached(path: Path) -> GGUFInfo:
    """:func:`read_header` of a file used in place, remembered by its identity (store.headers)."""
    from localinfer.store.headers import read_header_cached as cached

    return cached(path)


def hub_offline(offline: bool = False) -> bool:
    """``--offline`` or ``HF_HUB_OFFLINE`` (read now, not at import time)."""
    env = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return offline or env.strip().lower() in ("1", "on", "yes", "true")


def _reinstall_hint(package: str) -> str:
    return f"reinstall it: pip install --force-reinstall {package.replace('_', '-')}"


def verify_file(
    store: Store,
    path: Path,
    expected: str,
    *,
    force: bool = False,
    progress: ProgressSink | None = None,
    label: str | None = None,
) -> str:
    """Return ``path``'s sha256 after checking it equals ``expected``; the check is cached by stat key.

    ``force`` re-hashes even when the cache says the file is unchanged (``pull``, ``verify``).
    """
    digest = None if force else store.cached_digest(path)
    if digest is None:
        sink = progress or NullProgress()
        size = path.stat().st_size
        sink.start(label or f"verifying {path.name}", size)
        try:
            digest = sha256_file(path, sink.advance)
        finally:
            sink.finish()
        if digest == expected:
            store.record_digest(path, digest)
    if digest != expected:
        store.forget_digest(path)
        raise ChecksumError(f"{path} is corrupt: sha256 {digest}, expected {expected}")
    return digest


def entry_for_files(
    *,
    name: str,
    kind: str,
    source: str,
    files: list[dict[str, Any]],
    load: str,
    info: Any,
    chat_format: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "kind": kind,  # "store" (bytes in blobs/), "package" or "local" (used in place)
        "source": source,
        "files": files,
        "load": load,
        "size": sum(int(f["size"]) for f in files),
        "chat_format": chat_format,
        "header": header_summary(info),
        "added_at": now_iso(),
        "last_used": None,
    }
    entry.update({k: v for k, v in extra.items() if v is not None})
    return entry


def pinned_sha256(reg: RegistryEntry) -> str | None:
    """The sha256 a registry entry pins, lowercased; checked, as it names files in the store."""
    from localinfer.errors import UsageError
    from localinfer.store.untrusted import is_sha256, shown

    if not reg.sha256:
        return None
    pinned = reg.sha256.lower() if isinstance(reg.sha256, str) else reg.sha256
    if not is_sha256(pinned):
        raise UsageError(
            f"registry entry {reg.name!r} pins an invalid sha256 '{shown(reg.sha256)}'",
            hint="a sha256 is 64 hex digits; fix it in models.toml",
        )
    return pinned


def install_from_package(
    store: Store, reg: RegistryEntry, *, force_hash: bool = False, progress: ProgressSink | None = None
) -> dict[str, Any]:
    """Register a model shipped in a Python package: verified in place, or assembled once into the store."""
    from localinfer.store.sources.packages import assemble_into, find_package_file

    package = reg.package or ""
    filename = reg.package_file or reg.file or ""
    expected = pinned_sha256(reg)
    if reg.package_assemble:
        if not expected:
            raise InvalidModelError(f"registry entry {reg.name!r} assembles from {package} but pins no sha256")
        blob = store.blob_path(expected)
        with file_lock(store.lock_path(f"sha256-{expected}")):
            ok = False
            if blob.is_file():
                try:
                    verify_file(store, blob, expected, force=force_hash, progress=progress)
                    ok = True
                except ChecksumError:
                    blob.unlink(missing_ok=True)
            if not ok:
                tmp = store.partial_path(expected).with_suffix(".assemble")
                assemble_into(package, tmp, expected, progress)
                try:
                    read_header(tmp)
                except BaseException:
                    tmp.unlink(missing_ok=True)
                    raise
                blob.parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp, blob)
                fsync_dir(blob.parent)
                store.record_digest(blob, expected)
            info = read_header(blob)
        files = [{"filename": filename, "sha256": expected, "size": blob.stat().st_size}]
        entry = entry_for_files(
            name=reg.name,
            kind="store",
            source=f"package:{package}",
            files=files,
            load=str(blob.relative_to(store.root)),
            info=info,
            chat_format=reg.chat_format,
            quant=_quant(filename, info),
            loadable=prove_install(store, reg.name, blob, info, files),
        )
        if not store.put(entry, require=[blob]) and not force_hash:
            # an `rm` freed the assembled blob between assembling and recording: assemble it again
            return install_from_package(store, reg, force_hash=True, progress=progress)
        return entry

    path = find_package_file(package, filename)
    if path is None:
        raise InvalidModelError(
            f"package {package} is installed but does not contain {filename}", hint=_reinstall_hint(package)
        )
    path = path.resolve()
    if expected:
        try:
            digest = verify_file(store, path, expected, force=force_hash, progress=progress)
        except ChecksumError as exc:
            raise ChecksumError(f"{reg.name}: {exc}", hint=_reinstall_hint(package)) from None
    else:
        digest = store.cached_digest(path) or sha256_file(path)
        store.record_digest(path, digest)
    info = read_header(path)
    files = [{"filename": filename, "path": str(path), "sha256": digest, "size": path.stat().st_size}]
    entry = entry_for_files(
        name=reg.name,
        kind="package",
        source=f"package:{package}",
        files=files,
        load=str(path),
        info=info,
        chat_format=reg.chat_format,
        quant=_quant(filename, info),
        loadable=prove_install(store, reg.name, path, info, files),
    )
    store.put(entry)
    return entry


def _quant(filename: str, info: Any) -> str | None:
    from localinfer.store.names import quant_of

    return quant_of(filename) or getattr(info, "quantization", None)


def resolve_entry(
    store: Store, entry: dict[str, Any], *, registry: Registry | None = None, progress: ProgressSink | None = None
) -> ResolvedModel:
    """Check an installed model's files (cheaply, via the digest cache) and read its header."""
    name = entry["name"]
    paths = store.file_paths(entry)
    for path, rec in zip(paths, entry.get("files", [])):
        if not path.is_file():
            raise ModelNotFoundError(
                f"the files of {name!r} are missing ({path})",
                hint=f"run 'localinfer pull {name}' to fetch them again, or 'localinfer rm {name}'",
            )
        try:
            verify_file(store, path, rec["sha256"], progress=progress, label=f"verifying {name}")
        except ChecksumError as exc:
            hint = f"run 'localinfer pull {name}' to repair it"
            if entry.get("kind") == "package":
                hint = _reinstall_hint(entry["source"].split(":", 1)[1])
            elif entry.get("kind") == "local":
                hint = f"the file changed since it was registered; run 'localinfer pull {path} --name {name}' again"
            raise ChecksumError(f"{name}: {exc}", hint=hint) from None
    load = store.load_path(entry)
    info = read_header_cached(load)
    ensure_entry(store, entry, load, info)  # installed before llama.cpp was tried on it (or by another version)
    mmproj = verified_projector(store, entry, progress)
    chat_format = entry.get("chat_format")
    if registry is not None and name in registry:
        chat_format = registry.get(name).chat_format or chat_format
    return ResolvedModel(
        name=name,
        path=load,
        sha256=entry["files"][0]["sha256"] if entry.get("files") else None,
        source=entry["source"],
        chat_format=chat_format,
        info=info,
        mmproj=mmproj,
    )


def verified_projector(store: Store, entry: dict[str, Any], progress: ProgressSink | None = None) -> Path | None:
    """The entry's projector, its digest checked (cheaply, through the digest cache) and its header read."""
    from localinfer.store.projector import projector_path, read_projector

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


def read_local_file(spec: ModelSpec) -> tuple[Path, GGUFInfo]:
    """The local file a path spec names and its header: missing, a directory, or not a sound GGUF
    is refused here, before the file is used or registered."""
    path = spec.path
    assert path is not None
    if not path.exists():
        raise ModelNotFoundError(f"no such file: {spec.raw}", hint="check the path")
    if path.is_dir():
        raise InvalidModelError(f"{spec.raw} is a directory, not a GGUF file")
    return path, read_header_cached(path)
