"""Header mutants of a real GGUF: its keys and tensor infos rewritten, its tensor data copied as is.

:func:`read_layout` splits a GGUF into its key/value pairs (raw bytes per value), tensor infos and
data; :func:`write_layout` puts one back together (the data section moves with the header's
length; tensor offsets are relative to it, so they stay valid). :func:`mutant` draws one seeded
mutation of the kinds that reached llama.cpp's asserts: duplicate tokens, a tensor stored as
another type, changed shapes, numbers and strings in the keys, keys dropped or repeated, bytes of
the header flipped.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field
from pathlib import Path

T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY, T_UINT64, T_INT64, T_FLOAT64 = range(13)
_SCALAR = {T_UINT8: "<B", T_INT8: "<b", T_UINT16: "<H", T_INT16: "<h", T_UINT32: "<I", T_INT32: "<i",
           T_FLOAT32: "<f", T_BOOL: "<?", T_UINT64: "<Q", T_INT64: "<q", T_FLOAT64: "<d"}  # fmt: skip
GGML_F32, GGML_F16 = 0, 1


@dataclass
class Tensor:
    name: bytes
    shape: list[int]
    ggml_type: int
    offset: int


@dataclass
class Layout:
    version: int
    kvs: list[tuple[bytes, int, bytes]]  # key, value type, the value's raw bytes
    tensors: list[Tensor]
    data: bytes
    alignment: int = 32
    extra_infos: bytes = b""  # raw bytes appended after the tensor infos (a mutation)
    n_tensors_delta: int = 0
    n_kv_delta: int = 0
    flips: list[tuple[int, int]] = field(default_factory=list)  # (offset in the header, xor mask)

    def copy(self) -> Layout:
        """Another layout to mutate (the tensor data, never mutated in place, is shared)."""
        tensors = [Tensor(t.name, list(t.shape), t.ggml_type, t.offset) for t in self.tensors]
        return Layout(self.version, list(self.kvs), tensors, self.data, self.alignment, self.extra_infos,
                      self.n_tensors_delta, self.n_kv_delta, list(self.flips))  # fmt: skip

    def index(self, key: str) -> int:
        return next(i for i, (k, _t, _v) in enumerate(self.kvs) if k == key.encode())

    def strings(self, key: str) -> list[bytes]:
        """The items of a string array."""
        _k, vtype, raw = self.kvs[self.index(key)]
        assert vtype == T_ARRAY and struct.unpack_from("<I", raw)[0] == T_STRING
        n = struct.unpack_from("<Q", raw, 4)[0]
        out, pos = [], 12
        for _ in range(n):
            length = struct.unpack_from("<Q", raw, pos)[0]
            out.append(raw[pos + 8 : pos + 8 + length])
            pos += 8 + length
        return out

    def set_strings(self, key: str, items: list[bytes]) -> None:
        raw = struct.pack("<IQ", T_STRING, len(items)) + b"".join(_str(s) for s in items)
        self.kvs[self.index(key)] = (key.encode(), T_ARRAY, raw)

    def set_scalar(self, key: str, vtype: int, value: object) -> None:
        raw = _str(value.encode()) if vtype == T_STRING else struct.pack(_SCALAR[vtype], value)  # type: ignore[union-attr]
        entry = (key.encode(), vtype, raw)
        try:
            self.kvs[self.index(key)] = entry
        except StopIteration:
            self.kvs.append(entry)

    def tensor(self, name: str) -> Tensor:
        return next(t for t in self.tensors if t.name == name.encode())


def _str(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def _value_end(raw: bytes, pos: int, vtype: int) -> int:
    if vtype == T_STRING:
        return pos + 8 + struct.unpack_from("<Q", raw, pos)[0]
    if vtype == T_ARRAY:
        itype, n = struct.unpack_from("<IQ", raw, pos)
        pos += 12
        if itype in _SCALAR:
            return pos + n * struct.calcsize(_SCALAR[itype])
        for _ in range(n):
            pos = _value_end(raw, pos, itype)
        return pos
    return pos + struct.calcsize(_SCALAR[vtype])


def read_layout(path: Path) -> Layout:
    raw = path.read_bytes()
    assert raw[:4] == b"GGUF"
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", raw, 4)
    pos, kvs, alignment = 24, [], 32
    for _ in range(n_kv):
        klen = struct.unpack_from("<Q", raw, pos)[0]
        key = raw[pos + 8 : pos + 8 + klen]
        vtype = struct.unpack_from("<I", raw, pos + 8 + klen)[0]
        start = pos + 12 + klen
        end = _value_end(raw, start, vtype)
        kvs.append((key, vtype, raw[start:end]))
        if key == b"general.alignment":
            alignment = struct.unpack_from("<I", raw, start)[0]
        pos = end
    tensors = []
    for _ in range(n_tensors):
        nlen = struct.unpack_from("<Q", raw, pos)[0]
        name = raw[pos + 8 : pos + 8 + nlen]
        pos += 8 + nlen
        dims = struct.unpack_from("<I", raw, pos)[0]
        shape = list(struct.unpack_from(f"<{dims}Q", raw, pos + 4))
        pos += 4 + 8 * dims
        ggml_type, offset = struct.unpack_from("<IQ", raw, pos)
        pos += 12
        tensors.append(Tensor(name, shape, ggml_type, offset))
    pos += (-pos) % alignment
    return Layout(version, kvs, tensors, raw[pos:], alignment)


def header_bytes(layout: Layout) -> bytes:
    parts = [b"GGUF" + struct.pack(
        "<IQQ", layout.version, len(layout.tensors) + layout.n_tensors_delta, len(layout.kvs) + layout.n_kv_delta
    )]  # fmt: skip
    parts += [_str(k) + struct.pack("<I", t) + v for k, t, v in layout.kvs]
    for t in layout.tensors:
        parts.append(_str(t.name) + struct.pack("<I", len(t.shape)) + struct.pack(f"<{len(t.shape)}Q", *t.shape))
        parts.append(struct.pack("<IQ", t.ggml_type, t.offset))
    parts.append(layout.extra_infos)
    buf = bytearray(b"".join(parts))
    for at, mask in layout.flips:
        if at < len(buf):
            buf[at] ^= mask
    return bytes(buf) + b"\0" * ((-len(buf)) % layout.alignment)


def write_layout(layout: Layout, path: Path, *, sparse: bool = False) -> Path:
    """The file; ``sparse``: the tensor data left as a hole (zeros, nothing written), for header
    fuzzing: llama.cpp's asserts are about shapes, types and keys, not about weight values."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
        fh.write(header_bytes(layout))
        if sparse:
            fh.truncate(fh.tell() + len(layout.data))
        else:
            fh.write(layout.data)
    return path


def duplicate_token(layout: Layout, index: int = 1000, of: int = 999) -> Layout:
    """Token ``index`` spelled as token ``of``: llama-vocab asserts id_to_token.size() == token_to_id.size()."""
    tokens = layout.strings("tokenizer.ggml.tokens")
    tokens[index] = tokens[of]
    layout.set_strings("tokenizer.ggml.tokens", tokens)
    return layout


def tensor_bytes(layout: Layout, t: Tensor) -> bytes:
    from localinfer.gguf.types import ggml_type_size

    block, size = ggml_type_size(t.ggml_type)
    n = 1
    for d in t.shape:
        n *= d
    return layout.data[t.offset : t.offset + n // block * size]


def replace_tensor_data(layout: Layout, new: dict[bytes, tuple[int, bytes]]) -> Layout:
    """Tensors of ``new`` (name -> (type, bytes)) stored anew; every offset recomputed, aligned."""
    chunks, offset = [], 0
    for t in layout.tensors:
        ggml_type, data = new.get(t.name, (t.ggml_type, tensor_bytes(layout, t)))
        t.ggml_type, t.offset = ggml_type, offset
        pad = (-len(data)) % layout.alignment
        chunks.append(data + b"\0" * pad)
        offset += len(data) + pad
    layout.data = b"".join(chunks)
    return layout


def norm_as_f16(layout: Layout, name: str = "blk.0.attn_norm.weight") -> Layout:
    """A norm weight stored as F16 (converted, offsets redone): a sound file by every header rule,
    on which ggml-cpu's binary_op aborts ("unsupported types") at the first decode."""
    t = layout.tensor(name)
    assert t.ggml_type == GGML_F32
    raw = tensor_bytes(layout, t)
    values = struct.unpack(f"<{len(raw) // 4}f", raw)
    return replace_tensor_data(layout, {t.name: (GGML_F16, struct.pack(f"<{len(values)}e", *values))})


# ---- seeded random mutants -------------------------------------------------------------------

_NUMBERS = (0, 1, 2, 3, 7, 8, 255, 256, 1023, 1024, 4096, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**40)
_FLOATS = (0.0, -1.0, 1e-30, 1e30, float("inf"), float("nan"), 0.5, 1e6)
_TYPES = (0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 24, 28, 29, 30, 39, 40, 1000)


def mutant(base: Layout, rng: random.Random) -> tuple[Layout, str]:
    """One random mutation of a copy of ``base``, and what it was."""
    layout = base.copy()
    kind = rng.choice(("token", "tensor_type", "shape", "number", "string", "drop", "repeat", "flip", "token_type"))
    if kind == "token":
        tokens = layout.strings("tokenizer.ggml.tokens")
        i, j = rng.randrange(len(tokens)), rng.randrange(len(tokens))
        how = rng.choice(("duplicate", "empty", "drop_last", "long"))
        if how == "duplicate":
            tokens[i] = tokens[j]
        elif how == "empty":
            tokens[i] = b""
        elif how == "drop_last":
            del tokens[rng.randrange(1, 64) * -1 :]
        else:
            tokens[i] = tokens[i] * rng.choice((100, 1000))
        layout.set_strings("tokenizer.ggml.tokens", tokens)
        return layout, f"token {how} {i} {j}"
    if kind == "tensor_type":
        t = rng.choice(layout.tensors)
        t.ggml_type = rng.choice(_TYPES)
        return layout, f"tensor_type {t.name.decode()} -> {t.ggml_type}"
    if kind == "shape":
        t = rng.choice(layout.tensors)
        d = rng.randrange(len(t.shape))
        t.shape[d] = rng.choice((0, 1, t.shape[d] // 2, t.shape[d] + 1, t.shape[d] * 2))
        return layout, f"shape {t.name.decode()}[{d}] -> {t.shape[d]}"
    numeric = [i for i, (_k, t, _v) in enumerate(layout.kvs) if t in _SCALAR]
    if kind == "number" and numeric:
        i = rng.choice(numeric)
        key, vtype, _raw = layout.kvs[i]
        if vtype in (T_FLOAT32, T_FLOAT64):
            value: object = rng.choice(_FLOATS)
        elif vtype == T_BOOL:
            value = rng.random() < 0.5
        else:
            value = rng.choice(_NUMBERS)
            lo, hi = {"<B": (0, 255), "<b": (-128, 127), "<H": (0, 65535), "<h": (-32768, 32767), "<I": (0, 2**32 - 1),
                      "<i": (-(2**31), 2**31 - 1), "<Q": (0, 2**64 - 1), "<q": (-(2**63), 2**63 - 1)}[_SCALAR[vtype]]  # fmt: skip
            value = min(max(int(value), lo), hi)
        layout.kvs[i] = (key, vtype, struct.pack(_SCALAR[vtype], value))
        return layout, f"number {key.decode()} -> {value}"
    strings = [i for i, (_k, t, _v) in enumerate(layout.kvs) if t == T_STRING]
    if kind == "string" and strings:
        i = rng.choice(strings)
        key = layout.kvs[i][0]
        value_b = rng.choice((b"", b"x", b"llama", b"gpt2", b"bert", b"\xff\xfe", b"{% for %}", b"{{ 1/0 }}"))
        layout.kvs[i] = (key, T_STRING, _str(value_b))
        return layout, f"string {key.decode()} -> {value_b!r}"
    if kind == "drop":
        i = rng.randrange(len(layout.kvs))
        key = layout.kvs.pop(i)[0]
        return layout, f"drop {key.decode()}"
    if kind == "repeat":
        i = rng.randrange(len(layout.kvs))
        layout.kvs.append(layout.kvs[i])
        return layout, f"repeat {layout.kvs[i][0].decode()}"
    if kind == "token_type":
        i = layout.index("tokenizer.ggml.token_type")
        key, vtype, raw = layout.kvs[i]
        n = struct.unpack_from("<Q", raw, 4)[0]
        j = rng.randrange(n)
        buf = bytearray(raw)
        struct.pack_into("<i", buf, 12 + 4 * j, rng.choice((0, 1, 2, 3, 4, 5, 6, 7, -1, 1000)))
        layout.kvs[i] = (key, vtype, bytes(buf))
        return layout, f"token_type {j}"
    n_flips = rng.randrange(1, 4)
    head_len = len(header_bytes(layout))
    layout.flips = [(rng.randrange(24, head_len), 1 << rng.randrange(8)) for _ in range(n_flips)]
    return layout, f"flip {layout.flips}"
