"""Split a real GGUF into llama.cpp's multi-file layout, as `llama-gguf-split --split` writes it.

Shard i is a complete GGUF: the first carries every key of the original plus ``split.no``,
``split.count`` and ``split.tensors.count``; the others carry only those three keys. Each shard holds
a contiguous run of the original's tensors (data copied byte for byte, offsets relative to the
shard's own data section), so llama.cpp loads the shards as the original model.
"""

from __future__ import annotations

import struct
from pathlib import Path

from localinfer.gguf import read_gguf

T_UINT16, T_INT32 = 2, 5


def _str(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, vtype: int, value: int) -> bytes:
    fmt = {T_UINT16: "<H", T_INT32: "<i"}[vtype]
    return _str(key.encode()) + struct.pack("<I", vtype) + struct.pack(fmt, value)


def split_gguf(src: Path, out_dir: Path, stem: str, n_split: int = 2) -> list[Path]:
    """Write ``{stem}-0000{i}-of-0000{n}.gguf`` shards of ``src`` into ``out_dir``; their paths."""
    info = read_gguf(src)
    raw = src.read_bytes()
    tensors = list(info.tensors)  # in header order
    first = tensors[0].name.encode()
    infos_start = raw.rfind(_str(first), 24, info.data_offset)  # the tensor infos follow the keys
    assert infos_start > 24, "tensor infos not found"
    n_kv = struct.unpack_from("<Q", raw, 16)[0]
    kv_bytes = raw[24:infos_start]
    align = info.alignment
    per = -(-len(tensors) // n_split)
    split_keys = lambda i: (  # noqa: E731
        _kv("split.no", T_UINT16, i) + _kv("split.count", T_UINT16, n_split) + _kv("split.tensors.count", T_INT32, len(tensors))
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n_split):
        part = tensors[i * per : (i + 1) * per]
        keys = (kv_bytes + split_keys(i), n_kv + 3) if i == 0 else (split_keys(i), 3)
        if i and align != 32:
            keys = (keys[0] + _str(b"general.alignment") + struct.pack("<II", 4, align), keys[1] + 1)
        infos, data, offset = b"", bytearray(), 0
        for t in part:
            dims = len(t.shape)
            infos += _str(t.name.encode()) + struct.pack("<I", dims) + struct.pack(f"<{dims}Q", *t.shape)
            infos += struct.pack("<IQ", t.ggml_type, offset)
            data += raw[t.offset : t.offset + t.n_bytes]
            pad = (-len(data)) % align
            data += b"\0" * pad
            offset = len(data)
        head = b"GGUF" + struct.pack("<IQQ", info.version, len(part), keys[1]) + keys[0] + infos
        head += b"\0" * ((-len(head)) % align)
        path = out_dir / f"{stem}-{i + 1:05d}-of-{n_split:05d}.gguf"
        path.write_bytes(head + bytes(data))
        paths.append(path)
    return paths
