"""Turn what the user typed into a verified GGUF on disk: :func:`resolve_model`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localinfer.errors import ChecksumError, InvalidModelError, ModelNotFoundError
from localinfer.store.fsutil import file_lock, fsync_dir, sha256_file
from localinfer.store.manifest import Store, header_summary, now_iso
from localinfer.store.names import ModelSpec, parse_spec
from localinfer.store.types import NullProgress, ProgressSink, ResolvedModel

if TYPE_CHECKING:  # pragma: no cover
    from localinfer.gguf import GGUFInfo
    from localinfer.registry import Registry, RegistryEntry


def read_header(path: Path) -> GGUFInfo:
    """Validate a GGUF header (the other engineer's validator); InvalidModelError if it is not one."""
    from localinfer.gguf import read_gguf

    return read_gguf(path)


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
    from localinfer.store.packages import assemble_into, find_package_file

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
        entry = entry_for_files(
            name=reg.name,
            kind="store",
            source=f"package:{package}",
            files=[{"filename": filename, "sha256": expected, "size": blob.stat().st_size}],
            load=str(blob.relative_to(store.root)),
            info=info,
            chat_format=reg.chat_format,
            quant=_quant(filename, info),
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
    entry = entry_for_files(
        name=reg.name,
        kind="package",
        source=f"package:{package}",
        files=[{"filename": filename, "path": str(path), "sha256": digest, "size": path.stat().st_size}],
        load=str(path),
        info=info,
        chat_format=reg.chat_format,
        quant=_quant(filename, info),
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
    info = read_header(load)
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
    )


def read_local_file(spec: ModelSpec) -> tuple[Path, GGUFInfo]:
    """The local file a path spec names and its header: missing, a directory, or not a sound GGUF
    is refused here, before the file is used or registered."""
    path = spec.path
    assert path is not None
    if not path.exists():
        raise ModelNotFoundError(f"no such file: {spec.raw}", hint="check the path")
    if path.is_dir():
        raise InvalidModelError(f"{spec.raw} is a directory, not a GGUF file")
    return path, read_header(path)


def _resolve_path(spec: ModelSpec, store: Store) -> ResolvedModel:
    path, info = read_local_file(spec)
    return ResolvedModel(
        name=spec.raw,
        path=path,
        sha256=store.cached_digest(path.resolve()),
        source="local",
        chat_format=None,
        info=info,
    )


def _not_installed(spec: ModelSpec, why: str) -> ModelNotFoundError:
    return ModelNotFoundError(f"model {spec.name!r} is not installed{why}", hint=f"localinfer pull {spec.raw}")


def resolve_installed(spec: str | None) -> ResolvedModel | None:
    """``spec``'s model if it is installed and every file's digest is cached as verified already.

    Reads only (registry, manifest, digest cache, GGUF header): no hashing, assembling, downloading
    or writing; None when resolving would need any of those. For ``localinfer.preload``.
    """
    from localinfer.registry import load_registry

    registry = load_registry()
    parsed = parse_spec(spec if spec is not None else registry.default)
    store = Store()
    if parsed.kind == "path":
        return _resolve_path(parsed, store) if parsed.path is not None and parsed.path.is_file() else None
    entry = store.entry(parsed.name)
    if entry is None:
        return None
    for path, rec in zip(store.file_paths(entry), entry.get("files", [])):
        if store.cached_digest(path) != rec.get("sha256"):
            return None
    return resolve_entry(store, entry, registry=registry)


def resolve_model(
    spec: str | None,
    *,
    offline: bool = False,
    auto_pull: bool = True,
    progress: ProgressSink | None = None,
) -> ResolvedModel:
    """Find (and if needed fetch) the model ``spec`` names, verified, ready to load.

    ``None`` means the registry default. Paths are used in place; registry models shipped in a package
    are verified in place (or assembled once into the store); anything else comes from the store, or is
    pulled from the Hub when ``auto_pull`` and not ``offline``/``HF_HUB_OFFLINE``.
    """
    from localinfer.registry import load_registry

    registry = load_registry()
    if spec is None:
        spec = registry.default
    parsed = parse_spec(spec)
    store = Store()
    if parsed.kind == "path":
        return _resolve_path(parsed, store)

    entry = store.entry(parsed.name)
    can_fetch = parsed.is_hub or (parsed.name in registry and bool(registry.get(parsed.name).repo))
    if entry is not None:
        try:
            return resolve_entry(store, entry, registry=registry, progress=progress)
        except (ModelNotFoundError, ChecksumError):
            # A broken copy in the store is rebuilt (assembled again, or pulled again) when possible.
            from localinfer.store.packages import is_installed

            in_store = entry.get("kind") == "store"
            reg = registry.entries.get(parsed.name) if parsed.kind == "name" else None
            from_package = reg is not None and bool(reg.package) and is_installed(reg.package)
            from_hub = in_store and can_fetch and auto_pull and not hub_offline(offline)
            if not (from_package or from_hub):
                raise
    if parsed.kind == "name":
        reg = registry.get(parsed.name)  # unknown name -> ModelNotFoundError with suggestions
        from localinfer.store.packages import is_installed

        if reg.package and is_installed(reg.package):
            entry = install_from_package(store, reg, progress=progress)
            return resolve_entry(store, entry, registry=registry, progress=progress)
        if not reg.repo:
            raise ModelNotFoundError(
                f"model {reg.name!r} is shipped by the package {reg.package}, which is not installed",
                hint=f"pip install {str(reg.package).replace('_', '-')}",
            )
    if hub_offline(offline):
        raise _not_installed(parsed, " (offline: not downloading)")
    if not auto_pull:
        raise _not_installed(parsed, "")
    from localinfer.store.pull import pull_model

    entry = pull_model(spec, progress=progress)
    return resolve_entry(store, entry, registry=registry, progress=progress)
