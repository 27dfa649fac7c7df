"""Inspect and manage installed models: list, show, rm, verify. Plain values in, plain values out."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localinfer.errors import ChecksumError, ModelNotFoundError
from localinfer.store.manifest import Store
from localinfer.store.types import NullProgress, ProgressSink


def _row(store: Store, entry: dict[str, Any]) -> dict[str, Any]:
    header = entry.get("header") or {}
    return {
        "name": entry["name"],
        "size": entry.get("size"),
        "quant": entry.get("quant") or header.get("quantization"),
        "parameters": header.get("parameter_count"),
        "architecture": header.get("architecture"),
        "context_length": header.get("context_length"),
        "source": entry.get("source"),
        "kind": entry.get("kind"),
        "last_used": entry.get("last_used"),
        "added_at": entry.get("added_at"),
        "path": str(store.load_path(entry)),
        "sha256": entry["files"][0]["sha256"] if entry.get("files") else None,
        "vision": bool(entry.get("mmproj")),
    }


def list_models() -> dict[str, Any]:
    """Installed models (complete and verified only: that is all the manifest ever holds) and disk use."""
    store = Store()
    entries = store.entries()
    rows = [_row(store, e) for _n, e in sorted(entries.items())]
    blobs: dict[str, int] = {}
    in_place: dict[str, int] = {}
    for e in entries.values():
        for rec, path in zip(e.get("files", []), store.file_paths(e)):
            (blobs if e.get("kind") == "store" else in_place)[str(path)] = int(rec.get("size") or 0)
    return {"models": rows, "store_bytes": sum(blobs.values()), "in_place_bytes": sum(in_place.values())}


def available_models() -> list[dict[str, Any]]:
    """Every registry name, whether it is installed (or shipped by an installed package, usable at
    once), and its download size: exact where the file is here, else estimated from the name."""
    from localinfer.store.registry import load_registry
    from localinfer.store.sources.packages import find_package_file, is_installed

    registry = load_registry()
    installed = Store().entries()
    out = []
    for name, reg in sorted(registry.entries.items()):
        shipped = bool(reg.package) and is_installed(reg.package)
        entry = installed.get(name)
        size: int | None = int(entry["size"]) if entry and entry.get("size") else reg.size
        if size is None and shipped and reg.package_file and not reg.package_assemble:
            found = find_package_file(reg.package, reg.package_file)
            size = found.stat().st_size if found else None
        out.append(
            {
                "name": name,
                "description": reg.description,
                "installed": entry is not None,
                "shipped": shipped,
                "source": f"package:{reg.package}" if shipped else (f"hf://{reg.repo}/{reg.file}" if reg.repo else None),
                "default": name == registry.default,
                "size": size,
                "estimated_size": estimated_size(name, reg.file) if size is None else None,
            }
        )
    return out


# Bits per weight of llama.cpp's quantizations, whole file (weights, norms, embeddings): from its
# quantize tool's table, rounded up a little for the unquantized tensors.
_BPW = {"q4_0": 4.6, "q4_1": 5.1, "q4_k_m": 4.9, "q4_k_s": 4.6, "q5_k_m": 5.7, "q6_k": 6.6, "q8_0": 8.5, "f16": 16.0}


def estimated_size(name: str, filename: str | None) -> int | None:
    """A download's size from the parameters in the name (``qwen2.5:7b``) and the file's quantization."""
    import re

    m = re.search(r":(\d+(?:\.\d+)?)([mb])$", name)
    q = re.search(r"(q\d_k_[ms]|q\d_[01k]|q8_0|f16)", (filename or "").lower())
    if not m or not q or q.group(1) not in _BPW:
        return None
    params = float(m.group(1)) * (1e6 if m.group(2) == "m" else 1e9)
    return int(params * _BPW[q.group(1)] / 8)


def show_model(spec: str) -> dict[str, Any]:
    """Everything we know about one model: header facts, files, digests, where it came from."""
    from localinfer.store.names import parse_spec
    from localinfer.store.resolve import resolve_model

    resolved = resolve_model(spec, auto_pull=False)  # never downloads: not installed is exit 3
    info = resolved.info
    store = Store()
    entry = store.entry(resolved.name) if parse_spec(spec).kind != "path" else None
    header = (entry or {}).get("header") or {}
    template = info.chat_template
    out: dict[str, Any] = {
        "name": resolved.name,
        "architecture": info.architecture,
        "model_name": info.name,
        "parameters": header.get("parameter_count") or info.parameter_count,
        "quantization": info.quantization,
        "context_length": info.context_length,
        "layers": info.block_count,
        "chat_template": template,  # the whole template (the text view shows its head)
        "chat_template_head": "\n".join(template.splitlines()[:5]) if template else None,
        "chat_format": resolved.chat_format,
        "license": info.license,
        "path": str(resolved.path),
        "sha256": resolved.sha256,
        "size": (entry or {}).get("size") or info.file_size,
        "source": resolved.source,
        "gguf_version": info.version,
        "split_count": info.split_count,
        "files": [
            {"filename": f.get("filename"), "sha256": f.get("sha256"), "size": f.get("size"), "path": str(p)}
            for f, p in zip((entry or {}).get("files", []), store.file_paths(entry) if entry else [])
        ],
        "last_used": (entry or {}).get("last_used"),
        "added_at": (entry or {}).get("added_at"),
        "vision": resolved.mmproj is not None,
        "projector": str(resolved.mmproj) if resolved.mmproj is not None else None,
    }
    return out


@dataclass
class Removal:
    name: str
    freed_bytes: int
    kept: list[str] = field(default_factory=list)  # files left in place (package / local registrations)


def remove_model(name: str) -> Removal:
    """Forget ``name``; delete its blobs unless another model uses them. In-place files are never deleted."""
    from localinfer.store.blobs import gc_blobs

    store = Store()
    with store.edit() as models:
        entry = models.pop(name, None)
        if entry is None and store.unreadable.pop(name, None) is not None:
            return Removal(name=name, freed_bytes=0)  # an entry we could not understand: only forgotten
        if entry is None:
            raise ModelNotFoundError(f"model {name!r} is not installed", hint="see 'localinfer list'")
    if entry.get("kind") == "store":
        mmproj = [entry["mmproj"]["sha256"]] if entry.get("mmproj") else []
        freed = gc_blobs(store, [rec["sha256"] for rec in entry.get("files", [])] + mmproj)
        return Removal(name=name, freed_bytes=freed)
    from localinfer.store.projector import projector_path

    kept = [*store.file_paths(entry), *filter(None, [projector_path(store, entry)])]
    return Removal(name=name, freed_bytes=0, kept=[str(p) for p in kept])


@dataclass
class Verification:
    name: str
    ok: bool
    problems: list[str] = field(default_factory=list)


def verify_models(name: str | None = None, progress: ProgressSink | None = None) -> list[Verification]:
    """Re-hash every file of one (or every) installed model against its recorded sha256."""
    from localinfer.store.install import verify_file

    store = Store()
    entries = store.entries()
    if name is not None:
        if name not in entries:
            raise ModelNotFoundError(f"model {name!r} is not installed", hint="see 'localinfer list'")
        entries = {name: entries[name]}
    sink = progress or NullProgress()
    results = []
    for n, entry in sorted(entries.items()):
        problems = []
        for rec, path in zip(entry.get("files", []), store.file_paths(entry)):
            if not Path(path).is_file():
                problems.append(f"missing file {path}")
                continue
            try:
                verify_file(store, Path(path), rec["sha256"], force=True, progress=sink, label=f"verifying {n}")
            except ChecksumError as exc:
                problems.append(str(exc))
        results.append(Verification(name=n, ok=not problems, problems=problems))
    return results


def relative_time(iso: str | None, now: _dt.datetime | None = None) -> str:
    if not iso:
        return "never"
    try:
        then = _dt.datetime.fromisoformat(iso)
    except ValueError:
        return iso
    now = now or _dt.datetime.now(_dt.timezone.utc)
    secs = (now - then).total_seconds()
    if secs < 60:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{int(secs // size)}{unit} ago"
    return iso  # pragma: no cover
