"""Small, valid (or deliberately hostile) GGUF files for store tests, written from scratch."""

from __future__ import annotations

import struct
from pathlib import Path

T_UINT32, T_INT32, T_FLOAT32, T_STRING, T_ARRAY, T_UINT64 = 4, 5, 6, 8, 9, 10
GGML_F32 = 0


def _str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def _value(value: object, in_array: bool = False) -> tuple[int, bytes]:
    """(value type, bytes): str; int as uint32 (int32 if negative or in an array, as gguf-py writes
    per-layer counts and token types; uint64 if big); float as float32; a list of those as an array."""
    if isinstance(value, str):
        return T_STRING, _str(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0 or in_array:
            return T_INT32, struct.pack("<i", value)
        return (T_UINT32, struct.pack("<I", value)) if value < 1 << 32 else (T_UINT64, struct.pack("<Q", value))
    if isinstance(value, float):
        return T_FLOAT32, struct.pack("<f", value)
    if isinstance(value, list) and value:
        items = [_value(v, in_array=True) for v in value]
        return T_ARRAY, struct.pack("<IQ", items[0][0], len(items)) + b"".join(b for _, b in items)
    raise TypeError(value)


def _kv(key: str, value: object) -> bytes:
    vtype, data = _value(value)
    return _str(key) + struct.pack("<I", vtype) + data


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
    tensors: dict[str, tuple[int, ...]] | None = None,
) -> bytes:
    """A valid GGUF v3 with one F32 tensor of ``n_floats`` elements (plus ``payload`` bytes after it).

    ``tensors`` (name -> shape, ggml order) replaces that tensor with F32 tensors of those shapes;
    ``extra`` adds or overrides keys (see :func:`_value` for the types written)."""
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
    infos, data = b"", b""
    tensors = tensors or {"tok_embd.weight": (n_floats,)}
    for tname, shape in tensors.items():
        data += b"\0" * ((-len(data)) % 32)  # each tensor's data starts aligned
        infos += _str(tname) + struct.pack(f"<I{len(shape)}QIQ", len(shape), *shape, GGML_F32, len(data))
        n = 1
        for d in shape:
            n *= d
        data += struct.pack(f"<{n}f", *([0.5] * n))
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + body + infos
    pad = (-len(head)) % 32
    return head + b"\0" * pad + data + payload


def write_gguf(path: Path, **kw: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gguf_bytes(**kw))  # type: ignore[arg-type]
    return path


def write_tiny_llama(path: Path, *, n_tokens: int = 260, extra: dict[str, object] | None = None) -> Path:
    """A llama that llama.cpp really loads and runs: one block, 8 wide, 2 heads sharing 1 KV head, and
    an SPM vocabulary of 260 tokens (4 plus the 256 byte tokens), of which the first ``n_tokens`` are
    written. ``extra`` adds or overrides keys: for checks that must stop a file llama.cpp would abort on."""
    emb, vocab, ff, kv_width = 8, 260, 16, 4
    tensors: dict[str, tuple[int, ...]] = {"token_embd.weight": (emb, vocab), "output_norm.weight": (emb,)}
    tensors["output.weight"] = (emb, vocab)
    for part, shape in {
        "attn_norm": (emb,), "attn_q": (emb, emb), "attn_k": (emb, kv_width), "attn_v": (emb, kv_width),
        "attn_output": (emb, emb), "ffn_norm": (emb,), "ffn_gate": (emb, ff), "ffn_up": (emb, ff),
        "ffn_down": (ff, emb),
    }.items():  # fmt: skip
        tensors[f"blk.0.{part}.weight"] = shape
    tokens = ["<unk>", "<s>", "</s>", "a"] + [f"<0x{b:02X}>" for b in range(256)]
    keys: dict[str, object] = {
        "llama.embedding_length": emb,
        "llama.feed_forward_length": ff,
        "llama.attention.head_count": 2,
        "llama.attention.head_count_kv": 1,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.rope.dimension_count": emb // 2,
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens[:n_tokens],
        "tokenizer.ggml.scores": [0.0] * n_tokens,
        "tokenizer.ggml.token_type": ([2, 3, 3, 1] + [6] * 256)[:n_tokens],  # unknown, control, normal, byte
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        **(extra or {}),
    }
    return write_gguf(path, name="tiny llama", block_count=1, extra=keys, tensors=tensors)


def hostile_gguf_bytes(size: int = 4096) -> bytes:
    """Starts like a GGUF but claims 2^60 tensors: the validator must refuse it cheaply."""
    head = b"GGUF" + struct.pack("<IQQ", 3, 1 << 60, 0)
    return head + b"\0" * (size - len(head))
