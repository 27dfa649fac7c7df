"""Small, valid (or deliberately hostile) GGUF files for store tests, written from scratch."""

from __future__ import annotations

import struct
from pathlib import Path

T_UINT32, T_STRING, T_UINT64 = 4, 8, 10
GGML_F32 = 0


def _str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, value: object) -> bytes:
    if isinstance(value, str):
        return _str(key) + struct.pack("<I", T_STRING) + _str(value)
    if isinstance(value, int):
        return _str(key) + struct.pack("<I", T_UINT32) + struct.pack("<I", value)
    raise TypeError(value)


def gguf_bytes(
    *,
    arch: str = "llama",
    name: str = "synthetic",
    context_length: int = 2048,
    block_count: int = 2,
    n_floats: int = 64,
    extra: dict[str, object] | None = None,
    chat_template: str | None = None,
    split: tuple[int, int] | None = None,
    payload: bytes = b"",
) -> bytes:
    """A valid GGUF v3 with one F32 tensor of ``n_floats`` elements (plus ``payload`` bytes after it)."""
    kvs = {
        "general.architecture": arch,
        "general.name": name,
        f"{arch}.context_length": context_length,
        f"{arch}.block_count": block_count,
        "general.license": "apache-2.0",
    }
    if chat_template:
        kvs["tokenizer.chat_template"] = chat_template
    if split:
        kvs["split.no"] = split[0]
        kvs["split.count"] = split[1]
    kvs.update(extra or {})
    body = b"".join(_kv(k, v) for k, v in kvs.items())
    tensor = _str("tok_embd.weight") + struct.pack("<I", 1) + struct.pack("<Q", n_floats) + struct.pack("<I", GGML_F32)
    tensor += struct.pack("<Q", 0)
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, len(kvs)) + body + tensor
    pad = (-len(head)) % 32
    data = struct.pack(f"<{n_floats}f", *([0.5] * n_floats))
    return head + b"\0" * pad + data + payload


def write_gguf(path: Path, **kw: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gguf_bytes(**kw))  # type: ignore[arg-type]
    return path


def hostile_gguf_bytes(size: int = 4096) -> bytes:
    """Starts like a GGUF but claims 2^60 tensors: the validator must refuse it cheaply."""
    head = b"GGUF" + struct.pack("<IQQ", 3, 1 << 60, 0)
    return head + b"\0" * (size - len(head))
