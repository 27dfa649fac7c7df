"""Which model files llama.cpp has been seen to load, remembered by sha256.

The header checks (``gguf.checks``) refuse in milliseconds what they know; what they do not know
can still make llama.cpp abort the process. So a file is proven once, before it is installed or
first used in place: its chat template compiles in the sandbox, and ``engine.probe`` loads it in a
child process. Installed models carry the verdict in their manifest entry (``"loadable"``); files
used in place have theirs in ``loadable.json`` beside the manifest (sha256 -> verdict), their
sha256 taken from the digest cache (path, size, mtime, inode), so a known file is not hashed again.
A verdict holds for one llama-cpp-python version. ``LOCALINFER_PROBE=0`` turns the child off.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localinfer.errors import InvalidModelError, LocalInferError, ModelLoadError, ResourceError
from localinfer.store.fsutil import atomic_write_json, file_lock, read_json, sha256_file
from localinfer.store.manifest import Store
from localinfer.store.types import NullProgress, ProgressSink

if TYPE_CHECKING:  # pragma: no cover
    from localinfer.engine.probe import ProbeResult
    from localinfer.gguf import GGUFInfo

PROBE_ENV = "LOCALINFER_PROBE"
ENTRY_KEY = "loadable"  # the manifest entry's field: {"engine": ...}
_ABORT_HINT = (
    "llama.cpp cannot use this file (it would have ended the command); get it from another source, "
    "or convert it again with current llama.cpp tools"
)
_FILE_ERRORS = ("InvalidModelError", "ChecksumError", "TemplateRefusedError")  # refusals that are the file's


def probe_enabled() -> bool:
    return os.environ.get(PROBE_ENV, "").strip().lower() not in ("0", "off", "no", "false")


def check_template(label: str, info: GGUFInfo) -> None:
    """The file's chat template compiles in the sandbox the engine renders it in (exit 4 if not)."""
    template = info.chat_template
    if template:
        from localinfer.engine.templates import compile_template

        try:
            compile_template(template)
        except InvalidModelError as exc:
            raise InvalidModelError(f"{label}: {exc}", hint=exc.hint) from None


def prove(path: Path, info: GGUFInfo, label: str | None = None) -> dict[str, Any] | None:
    """Before an install: the template compiles and llama.cpp loads ``path`` in a child process.
    The record for the manifest entry; None when probing is off. Raises the refusal (nothing is
    installed then). ``label``: the file's name for messages (a blob's own name says nothing)."""
    label = label or path.name
    check_template(label, info)
    if not probe_enabled():
        return None
    from localinfer.engine.probe import engine_version, probe_file

    result = probe_file(path)
    if not result.ok:
        raise refusal(path, _verdict(result), label)
    return {"engine": engine_version()}


def proven(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    """The entry's verdict if it holds for this llama.cpp."""
    from localinfer.engine.probe import engine_version

    record = (entry or {}).get(ENTRY_KEY)
    return record if isinstance(record, dict) and record.get("engine") == engine_version() else None


def prove_install(store: Store, name: str, path: Path, info: GGUFInfo, files: list[dict[str, Any]]) -> dict[str, Any] | None:
    """:func:`prove` for a new entry of ``name``, reusing the installed entry's verdict when it is
    for the same files (a pull again, a package verified again)."""
    old = store.entry(name)
    same = old is not None and [f.get("sha256") for f in old.get("files", [])] == [f["sha256"] for f in files]
    record = proven(old) if same else None
    label = str(files[0].get("filename") or path.name).rsplit("/", 1)[-1]
    if record is not None:
        check_template(label, info)
        return record
    return prove(path, info, label)


def ensure_entry(store: Store, entry: dict[str, Any], path: Path, info: GGUFInfo) -> None:
    """An installed model without a verdict for this llama.cpp (installed before, or by another
    version) is proven now, and the verdict written into its entry."""
    if not probe_enabled() or proven(entry) is not None:
        return
    files = entry.get("files") or [{}]
    record = prove(path, info, str(files[0].get("filename") or path.name).rsplit("/", 1)[-1])
    name = entry["name"]
    with store.edit() as models:
        if name in models and models[name].get("files") == entry.get("files"):
            models[name][ENTRY_KEY] = record


def ensure_in_place(store: Store, path: Path, info: GGUFInfo, progress: ProgressSink | None = None) -> str | None:
    """A file used where it is: proven (:func:`prove`'s two checks) unless ``loadable.json`` remembers
    it, as an installed model is (:func:`ensure_entry`); its sha256 (None when probing is off and it
    was never hashed). A remembered verdict is for these bytes, whose template compiled before it
    was probed: a run needs no jinja2 for that (--raw none at all; a chat compiles it to render)."""
    if not probe_enabled():
        check_template(path.name, info)
        return store.cached_digest(path)
    shards = _shards(path, info)
    digests = [_digest(store, p, progress) for p in shards]
    if len(digests) == 1:
        key = digests[0]
    else:
        import hashlib

        key = hashlib.sha256(" ".join(digests).encode()).hexdigest()
    from localinfer.engine.probe import engine_version, probe_file

    engine = engine_version()
    verdict = _read_verdicts(store).get(key)
    if not (isinstance(verdict, dict) and verdict.get("engine") == engine and _lasting(verdict)):
        check_template(path.name, info)
        verdict = _verdict(probe_file(path))
        if _lasting(verdict):
            _remember(store, key, {**verdict, "engine": engine})
    if verdict["kind"] != "ok":
        raise refusal(path, verdict)
    return digests[0]


def refusal(path: Path, verdict: dict[str, Any], label: str | None = None) -> LocalInferError:
    """The error a failed probe is: an abort or a bad file exit 4, memory 6, the rest 1."""
    label = label or path.name
    kind, hint = verdict.get("kind"), verdict.get("hint")
    message = str(verdict.get("message") or "").replace(path.name, label)
    if kind == "aborted":
        return InvalidModelError(f"{label}: llama.cpp aborted loading this file: {message}", hint=_ABORT_HINT)
    if kind == "refused":
        error = verdict.get("error")
        cls = ResourceError if error == "ResourceError" else ModelLoadError if error == "ModelLoadError" else InvalidModelError
        return cls(message, hint=hint if isinstance(hint, str) else None)
    return ModelLoadError(
        f"{label}: could not test-load it in a child process: {message}",
        hint=f"run the command again; {PROBE_ENV}=0 skips this test (a file that crashes llama.cpp then ends the command)",
    )


def _lasting(verdict: dict[str, Any]) -> bool:
    """A verdict about the file itself (not memory this time, nor a child that could not run)."""
    kind = verdict.get("kind")
    return kind in ("ok", "aborted") or (kind == "refused" and verdict.get("error") in _FILE_ERRORS)


def _verdict(result: ProbeResult) -> dict[str, Any]:
    return {"kind": result.kind, "message": result.message, "error": result.error, "hint": result.hint}


def _shards(path: Path, info: GGUFInfo) -> list[Path]:
    if info.split_count and info.split_count > 1:
        from localinfer.store.names import split_names

        return [path.with_name(n) for n in split_names(path.name)]
    return [path]


def _digest(store: Store, path: Path, progress: ProgressSink | None) -> str:
    """``path``'s sha256: from the digest cache while its size, mtime and inode are unchanged, else
    hashed once (and cached)."""
    digest = store.cached_digest(path)
    if digest is None:
        sink = progress or NullProgress()
        sink.start(f"hashing {path.name} (once)", path.stat().st_size)
        try:
            digest = sha256_file(path, sink.advance)
        finally:
            sink.finish()
        try:
            store.record_digest(path, digest)
        except OSError:  # a store we cannot write: hashed again next time, still correct
            pass
    return digest


def _verdicts_path(store: Store) -> Path:
    return store.root / "loadable.json"


def _read_verdicts(store: Store) -> dict[str, Any]:
    try:
        data = read_json(_verdicts_path(store), {})
    except (ValueError, UnicodeDecodeError, OSError):
        return {}  # only a cache: an unreadable one is empty
    return data if isinstance(data, dict) else {}


def _remember(store: Store, key: str, verdict: dict[str, Any]) -> None:
    try:
        with file_lock(store.lock_path("loadable")):
            data = _read_verdicts(store)
            data[key] = verdict
            atomic_write_json(_verdicts_path(store), data)
    except OSError:
        pass
