"""Parsed GGUF headers, remembered by file identity: a model used before starts without walking its
header again (a vocabulary of 49k strings and as many merges is read one length at a time, ~10 ms
of a whole `run -n 16`'s CPU time for SmolLM2-135M).

A record holds for the file as it was (size, mtime, ctime, inode, device: ``paths.file_identity``,
the digest cache's trust) and for this version of localinfer (the parser or its checks may change);
its hyperparameter checks run again on every read, which costs nothing. An unreadable or stale
cache is just a miss. At most ``MAX_ENTRIES`` files are kept, the oldest dropped first.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from localinfer import __version__
from localinfer.gguf.types import ArraySummary, GGUFInfo, TensorInfo

MAX_ENTRIES = 32
_FILE = "gguf-headers.json"


def read_header_cached(path: Path) -> GGUFInfo:
    """:func:`localinfer.gguf.read_gguf` of ``path``, from the cache where it holds for the file."""
    from localinfer.gguf.checks import check_hyperparameters, read_gguf
    from localinfer.paths import file_identity

    key = _key(file_identity(path))
    cache = _load()
    if key is not None:
        hit = cache.get(str(path))
        if isinstance(hit, dict) and hit.get("key") == key:
            info = _decode(path, hit.get("info"))
            if info is not None:
                return check_hyperparameters(info)
    info = read_gguf(path)
    if key is not None and key == _key(file_identity(path)):  # unchanged while it was read
        _store(cache, str(path), {"key": key, "info": _encode(info)})
    return info


def _key(identity: tuple[int, ...] | None) -> list[Any] | None:
    return None if identity is None else [__version__, *identity]


def _cache_path() -> Path:
    from localinfer.paths import models_dir

    return models_dir() / _FILE


def _load() -> dict[str, Any]:
    try:
        with open(_cache_path(), encoding="utf-8") as fh:
            cache = json.load(fh)
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}


def _store(cache: dict[str, Any], name: str, record: dict[str, Any]) -> None:
    from localinfer.store.fsutil import atomic_write_json

    cache.pop(name, None)
    kept = [(p, r) for p, r in cache.items() if os.path.exists(p)][-(MAX_ENTRIES - 1):]
    try:
        atomic_write_json(_cache_path(), {**dict(kept), name: record}, sort_keys=False)  # oldest first
    except OSError:
        pass  # only a cache


def _value(v: object) -> object:
    if isinstance(v, ArraySummary):
        return {"array": v.item_type, "length": v.length}  # the only object a header value can be
    if isinstance(v, list):
        return [_value(x) for x in v]
    return v


def _unvalue(v: object) -> object:
    if isinstance(v, dict):
        return ArraySummary(v["array"], v["length"])
    if isinstance(v, list):
        return [_unvalue(x) for x in v]
    return v


def _encode(info: GGUFInfo) -> dict[str, Any]:
    return {
        "file_size": info.file_size, "version": info.version, "alignment": info.alignment,
        "data_offset": info.data_offset, "metadata": {k: _value(v) for k, v in info.metadata.items()},
        "tensors": [[t.name, list(t.shape), t.ggml_type, t.type_name, t.offset, t.n_bytes] for t in info.tensors],
    }  # fmt: skip


def _decode(path: Path, data: object) -> GGUFInfo | None:
    """The header a record holds; None for a record this code cannot read (then the file is parsed)."""
    try:
        assert isinstance(data, dict)
        return GGUFInfo(
            path=path, file_size=data["file_size"], version=data["version"], alignment=data["alignment"],
            data_offset=data["data_offset"], metadata={k: _unvalue(v) for k, v in data["metadata"].items()},
            tensors=tuple(TensorInfo(n, tuple(s), g, tn, o, b) for n, s, g, tn, o, b in data["tensors"]),
        )  # fmt: skip
    except (AssertionError, KeyError, TypeError, ValueError, AttributeError):
        return None
