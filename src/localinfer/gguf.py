"""A stdlib-only GGUF header validator and metadata reader.

:func:`read_gguf` runs before a file is registered or handed to llama.cpp (whose own parser has a
history of memory-safety bugs), so it treats every byte as hostile: every count, length, type and
offset is checked against the file size and against fixed limits before it is used, work is bounded
(no loop runs more often than the file has bytes for, and walking big arrays has a global budget),
and memory is bounded (big arrays are summarised, never materialised; tensor data is never read).

Layout (GGUF v2/v3, little-endian; see ggml's ``docs/gguf.md``)::

    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv x (string key | u32 value_type | value)
    n_tensors x (string name | u32 n_dims | n_dims x u64 ne | u32 ggml_type | u64 offset)
    padding to general.alignment | tensor data (offsets relative to here)

where a string is ``u64 length`` + UTF-8 bytes and an array value is ``u32 item_type`` +
``u64 length`` + items.

Anything wrong raises :class:`~localinfer.errors.InvalidModelError` whose message is
``"not a valid GGUF file: <reason>"``; a file cut short anywhere gives a reason that starts
``"unexpected end of file while reading ..."``.

Compared with ggml's own ``gguf_init_from_file`` this is stricter on purpose in a few places that
real files never touch: tensor data must lie inside the file (ggml's header parser does not look),
dimensions must be at least 1 and there must be 1 to 4 of them, keys and tensor names must be
non-empty UTF-8, bools must be 0 or 1 (as the spec says), and big-endian files are refused. It is more
lenient in two: arrays of arrays (allowed by the spec, refused by ggml) are read, two levels deep; and
tensor data need only be aligned and not overlap, where ggml wants it packed in order.
"""

from __future__ import annotations

import itertools
import mmap
import os
import stat
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from localinfer.errors import InvalidModelError, ModelNotFoundError

__all__ = [
    "GGML_TYPES",
    "LLAMA_FTYPE_NAMES",
    "ArraySummary",
    "GGUFInfo",
    "TensorInfo",
    "ggml_type_name",
    "ggml_type_size",
    "read_gguf",
    "validate_gguf",
]

# --------------------------------------------------------------------------------------------
# Limits. Real files sit far below every one of these; they exist so hostile files stay cheap.
# --------------------------------------------------------------------------------------------

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 1 << 20  # 1 MiB
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_TENSOR_NAME_BYTES = 63  # GGML_MAX_NAME is 64 including the terminating NUL
MAX_TENSOR_COUNT = 1 << 20  # the biggest real models have a few thousand
MAX_KV_COUNT = 1 << 16  # real files have tens to a few hundred
MAX_KEY_BYTES = 65535  # the spec's limit (2^16 - 1)
MAX_STRING_BYTES = 16 << 20  # one string value (chat templates are tens of KiB)
MAX_ARRAY_LENGTH = 1 << 26  # one array (the largest vocabularies are ~10^6 entries)
MAX_ARRAY_DEPTH = 2  # an array may hold arrays, which may not hold arrays
MAX_WALKED_ITEMS = 1 << 24  # strings/arrays stepped over in big arrays, whole file
MAX_NESTED_ARRAYS = 1 << 20  # arrays inside arrays, whole file (each costs a Python call)
MAX_DECODED_STRING_BYTES = 64 << 20  # strings decoded into Python str, whole file
MAX_KEPT_ITEMS = 1 << 20  # array items materialised as Python objects, whole file
SMALL_ARRAY = 64  # arrays up to this many items are kept as lists
MAX_KEPT_NUMERIC_ARRAY = 4096  # non-tokenizer numeric arrays (per-layer hyperparameters) up to this

# Metadata value types (gguf_metadata_value_type).
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL = range(8)
T_STRING, T_ARRAY, T_UINT64, T_INT64, T_FLOAT64 = range(8, 13)

VALUE_TYPE_NAMES = {
    T_UINT8: "uint8",
    T_INT8: "int8",
    T_UINT16: "uint16",
    T_INT16: "int16",
    T_UINT32: "uint32",
    T_INT32: "int32",
    T_FLOAT32: "float32",
    T_BOOL: "bool",
    T_STRING: "string",
    T_ARRAY: "array",
    T_UINT64: "uint64",
    T_INT64: "int64",
    T_FLOAT64: "float64",
}

# Fixed-size value types: struct format character and size.
_FIXED = {
    T_UINT8: ("B", 1),
    T_INT8: ("b", 1),
    T_UINT16: ("H", 2),
    T_INT16: ("h", 2),
    T_UINT32: ("I", 4),
    T_INT32: ("i", 4),
    T_FLOAT32: ("f", 4),
    T_BOOL: ("B", 1),
    T_UINT64: ("Q", 8),
    T_INT64: ("q", 8),
    T_FLOAT64: ("d", 8),
}
_FIXED_STRUCTS = {t: struct.Struct("<" + c) for t, (c, _) in _FIXED.items()}
_NUMERIC_TYPES = frozenset(_FIXED) - {T_BOOL}

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HEADER = struct.Struct("<4sIQQ")  # magic, version, n_tensors, n_kv
_ARRAY_HEAD = struct.Struct("<IQ")  # item type, length

# Smallest possible encodings, for "count x minimum size <= bytes left" checks.
_MIN_KV_BYTES = 8 + 1 + 4 + 1  # key length, 1-byte key, value type, 1-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8  # name length, 1-byte name, n_dims, ne0, type, offset
_MIN_STRING_BYTES = 8
_MIN_ARRAY_BYTES = 4 + 8

# --------------------------------------------------------------------------------------------
# ggml tensor types: id -> (name, elements per block, bytes per block). From ggml.h's enum
# ggml_type and the block layouts in ggml-common.h; removed types (4, 5, 31-33, 36-38) are absent.
# --------------------------------------------------------------------------------------------

_QK_K = 256
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 36),
    10: ("Q2_K", _QK_K, 84),
    11: ("Q3_K", _QK_K, 110),
    12: ("Q4_K", _QK_K, 144),
    13: ("Q5_K", _QK_K, 176),
    14: ("Q6_K", _QK_K, 210),
    15: ("Q8_K", _QK_K, 292),
    16: ("IQ2_XXS", _QK_K, 66),
    17: ("IQ2_XS", _QK_K, 74),
    18: ("IQ3_XXS", _QK_K, 98),
    19: ("IQ1_S", _QK_K, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", _QK_K, 110),
    22: ("IQ2_S", _QK_K, 82),
    23: ("IQ4_XS", _QK_K, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", _QK_K, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", _QK_K, 54),
    35: ("TQ2_0", _QK_K, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
    42: ("Q2_0", 64, 18),
}
_GGML_TYPE_BY_NAME = {name: type_id for type_id, (name, _, _) in GGML_TYPES.items()}

# llama.cpp's enum llama_ftype (general.file_type) -> the name llama-quantize uses.
LLAMA_FTYPE_NAMES: dict[int, str] = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    4: "Q4_1_SOME_F16",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    33: "Q4_0_4_4",
    34: "Q4_0_4_8",
    35: "Q4_0_8_8",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4_MOE",
    39: "NVFP4",
    40: "Q1_0",
    41: "Q2_0",
}


def ggml_type_size(ggml_type: int | str) -> tuple[int, int]:
    """``(block_size, type_size)`` of a ggml type: elements per block and bytes per block.

    Takes the numeric id (``12``) or the name (``"Q4_K"``, any case). Raises ``ValueError`` for a
    type ggml does not (or no longer) define.
    """
    type_id = _resolve_type(ggml_type)
    _, block_size, type_size = GGML_TYPES[type_id]
    return block_size, type_size


def ggml_type_name(ggml_type: int | str) -> str:
    """The upper-case name of a ggml type id (``12`` -> ``"Q4_K"``); ``ValueError`` if unknown."""
    return GGML_TYPES[_resolve_type(ggml_type)][0]


def _resolve_type(ggml_type: int | str) -> int:
    if isinstance(ggml_type, str):
        type_id = _GGML_TYPE_BY_NAME.get(ggml_type.upper())
        if type_id is None:
            raise ValueError(f"unknown ggml type {ggml_type!r}")
        return type_id
    if isinstance(ggml_type, bool) or not isinstance(ggml_type, int) or ggml_type not in GGML_TYPES:
        raise ValueError(f"unknown ggml type {ggml_type!r}")
    return ggml_type


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArraySummary:
    """Stands in for a metadata array too big to keep (e.g. a tokenizer's vocabulary)."""

    item_type: str  # a VALUE_TYPE_NAMES value: "string", "int32", "float32", "array", ...
    length: int


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's header entry. ``offset`` is absolute: bytes from the start of the file."""

    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the row length (ne0)
    ggml_type: int
    type_name: str
    offset: int
    n_bytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class GGUFInfo:
    """What :func:`read_gguf` found in a valid file's header."""

    path: Path
    file_size: int
    version: int
    alignment: int
    data_offset: int  # where tensor data starts (tensor offsets in the file are relative to this)
    metadata: dict[str, object]
    tensors: tuple[TensorInfo, ...]

    # -- metadata lookups ------------------------------------------------------------------

    def _str(self, key: str) -> str | None:
        value = self.metadata.get(key)
        return value if isinstance(value, str) else None

    def _int(self, key: str) -> int | None:
        value = self.metadata.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def _arch_key(self, suffix: str) -> str | None:
        arch = self.architecture
        return f"{arch}.{suffix}" if arch else None

    def _arch_int(self, suffix: str) -> int | None:
        key = self._arch_key(suffix)
        return self._int(key) if key else None

    def _arch_raw(self, suffix: str) -> object | None:
        key = self._arch_key(suffix)
        return self.metadata.get(key) if key else None

    @property
    def architecture(self) -> str | None:
        return self._str("general.architecture")

    @property
    def vocab_size(self) -> int | None:
        """The tokenizer's token count (its list, kept or summarised), or None without one."""
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        if isinstance(tokens, ArraySummary):
            return tokens.length
        return len(tokens) if isinstance(tokens, list) else None

    @property
    def name(self) -> str | None:
        return self._str("general.name")

    @property
    def license(self) -> str | None:
        return self._str("general.license")

    @property
    def chat_template(self) -> str | None:
        return self._str("tokenizer.chat_template")

    @property
    def context_length(self) -> int | None:
        return self._arch_int("context_length")

    @property
    def block_count(self) -> int | None:
        return self._arch_int("block_count")

    @property
    def embedding_length(self) -> int | None:
        return self._arch_int("embedding_length")

    @property
    def head_count(self) -> object | None:
        """An int, or a per-layer list / :class:`ArraySummary` for models that vary it."""
        return self._arch_raw("attention.head_count")

    @property
    def head_count_kv(self) -> object | None:
        """An int, or a per-layer list / :class:`ArraySummary` for models that vary it."""
        return self._arch_raw("attention.head_count_kv")

    @property
    def sliding_window(self) -> int | None:
        return self._arch_int("attention.sliding_window")

    @property
    def split_count(self) -> int | None:
        return self._int("split.count")

    @property
    def split_no(self) -> int | None:
        return self._int("split.no")

    @property
    def file_type(self) -> str | None:
        """``general.file_type`` as llama.cpp names it (``"Q4_K_M"``), None if absent or unknown."""
        ftype = self._int("general.file_type")
        return LLAMA_FTYPE_NAMES.get(ftype) if ftype is not None else None

    @property
    def quantization(self) -> str | None:
        """:attr:`file_type` when known, else the tensor type holding the most bytes."""
        if self.file_type is not None:
            return self.file_type
        if not self.tensors:
            return None
        by_bytes: Counter[str] = Counter()
        for t in self.tensors:
            by_bytes[t.type_name] += t.n_bytes
        return by_bytes.most_common(1)[0][0]

    @property
    def parameter_count(self) -> int:
        """Total number of elements over all tensors in this file."""
        return sum(t.n_elements for t in self.tensors)


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


_DAMAGED_HINT = (
    "the file may be incomplete or damaged (an interrupted download?); "
    "download it again, or check that it is a GGUF model"
)
_FORMAT_HINT = "convert or download the model again with current llama.cpp tools (GGUF v3, little-endian)"


def _invalid(reason: str, hint: str = _DAMAGED_HINT) -> InvalidModelError:
    return InvalidModelError(f"not a valid GGUF file: {reason}", hint=hint)


def _eof(what: str, detail: str = "") -> InvalidModelError:
    return _invalid(f"unexpected end of file while reading {what}" + (f": {detail}" if detail else ""))


class _Parser:
    """One pass over the header. ``buf`` is an mmap (or bytes in tests) of ``size`` bytes."""

    def __init__(self, buf: mmap.mmap | bytes, size: int) -> None:
        self.buf = buf
        self.size = size
        self.pos = 0
        self.walked = 0  # items stepped over inside big arrays
        self.decoded = 0  # string bytes decoded
        self.kept = 0  # array items materialised
        self.nested = 0  # arrays inside arrays

    # -- primitives ------------------------------------------------------------------------

    def need(self, n: int, what: str) -> None:
        left = self.size - self.pos
        if n > left:
            raise _eof(what, f"needs {n} bytes, only {left} left")

    def u32(self, what: str) -> int:
        self.need(4, what)
        (value,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return value

    def u64(self, what: str) -> int:
        self.need(8, what)
        (value,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return value

    def raw_string(self, what: str, limit: int) -> bytes:
        n = self.u64(f"the length of {what}")
        if n > limit:
            raise _invalid(f"{what} is {n} bytes long, over the limit of {limit}")
        left = self.size - self.pos
        if n > left:
            raise _eof(what, f"a string of {n} bytes, only {left} left")
        start = self.pos
        self.pos = start + n
        return self.buf[start : start + n]

    def text(self, what: str, limit: int = MAX_STRING_BYTES) -> str:
        data = self.raw_string(what, limit)
        self.decoded += len(data)
        if self.decoded > MAX_DECODED_STRING_BYTES:
            raise _invalid(f"metadata strings add up to more than {MAX_DECODED_STRING_BYTES} bytes")
        return data.decode("utf-8", errors="replace")

    # -- header ----------------------------------------------------------------------------

    def header(self) -> tuple[int, int, int]:
        head = bytes(self.buf[:4])
        if head != GGUF_MAGIC[: len(head)]:
            raise _invalid(f"bad magic {head!r} (a GGUF file starts with b'GGUF')")
        if self.size < 4:
            raise _eof("the magic", f"the file has only {self.size} bytes")
        self.pos = 4
        version = self.u32("the version")
        if version not in SUPPORTED_VERSIONS:
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            if swapped in (1, 2, 3):
                raise _invalid(f"big-endian GGUF (version {swapped}) is not supported", _FORMAT_HINT)
            if version == 1:
                raise _invalid(
                    "GGUF version 1 is too old and no longer supported (need version 2 or 3)", _FORMAT_HINT
                )
            raise _invalid(f"unsupported GGUF version {version} (supported: 2 and 3)", _FORMAT_HINT)
        n_tensors = self.u64("the tensor count")
        n_kv = self.u64("the metadata key-value count")
        if n_tensors > MAX_TENSOR_COUNT:
            raise _invalid(f"tensor count {n_tensors} is over the limit of {MAX_TENSOR_COUNT}")
        if n_kv > MAX_KV_COUNT:
            raise _invalid(f"metadata key-value count {n_kv} is over the limit of {MAX_KV_COUNT}")
        need = n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES
        left = self.size - self.pos
        if need > left:
            raise _eof(
                "the metadata",
                f"{n_kv} key-value pairs and a tensor count of {n_tensors} need at least {need} bytes, "
                f"only {left} left",
            )
        return version, n_tensors, n_kv

    # -- metadata --------------------------------------------------------------------------

    def metadata(self, n_kv: int) -> tuple[dict[str, object], dict[str, int]]:
        metadata: dict[str, object] = {}
        types: dict[str, int] = {}
        for i in range(n_kv):
            raw = self.raw_string(f"key #{i}", MAX_KEY_BYTES)
            if not raw:
                raise _invalid(f"key #{i} is empty")
            try:
                key = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise _invalid(f"key #{i} is not valid UTF-8") from None
            if key in metadata:
                raise _invalid(f"duplicate key {key!r}")
            vtype = self.u32(f"the value type of key {key!r}")
            if vtype not in VALUE_TYPE_NAMES:
                raise _invalid(f"key {key!r} has invalid value type {vtype}")
            metadata[key] = self.value(vtype, key, 0)
            types[key] = vtype
        return metadata, types

    def value(self, vtype: int, key: str, depth: int) -> object:
        if vtype == T_STRING:
            return self.text(f"the value of key {key!r}")
        if vtype == T_ARRAY:
            return self.array(key, depth + 1, keep_allowed=True)
        fmt = _FIXED_STRUCTS[vtype]
        self.need(fmt.size, f"the value of key {key!r}")
        (value,) = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        if vtype == T_BOOL:
            if value > 1:
                raise _invalid(f"key {key!r} has invalid bool value {value}")
            return bool(value)
        return value

    def array(self, key: str, depth: int, keep_allowed: bool) -> object:
        what = f"the array value of key {key!r}"
        self.need(_ARRAY_HEAD.size, f"the item type and length of {what}")
        itype, n = _ARRAY_HEAD.unpack_from(self.buf, self.pos)
        self.pos += _ARRAY_HEAD.size
        if itype not in VALUE_TYPE_NAMES:
            raise _invalid(f"key {key!r} is an array with invalid item type {itype}")
        if itype == T_ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise _invalid(f"key {key!r} has arrays nested more than {MAX_ARRAY_DEPTH} deep")
            self.nested += n
            if self.nested > MAX_NESTED_ARRAYS:
                raise _invalid(f"metadata holds more than {MAX_NESTED_ARRAYS} arrays inside arrays")
        if n > MAX_ARRAY_LENGTH:
            raise _invalid(f"key {key!r} is an array of {n} items, over the limit of {MAX_ARRAY_LENGTH}")
        if itype in _FIXED:
            item_size = _FIXED[itype][1]
        else:
            item_size = _MIN_STRING_BYTES if itype == T_STRING else _MIN_ARRAY_BYTES
        left = self.size - self.pos
        if n * item_size > left:
            raise _eof(
                what,
                f"{n} {VALUE_TYPE_NAMES[itype]} items need at least {n * item_size} bytes, only {left} left",
            )
        keep = (
            keep_allowed
            and self.kept + n <= MAX_KEPT_ITEMS
            and (
                n <= SMALL_ARRAY
                or (
                    itype in _NUMERIC_TYPES
                    and n <= MAX_KEPT_NUMERIC_ARRAY
                    and not key.startswith("tokenizer.")
                )
            )
        )
        if keep:
            self.kept += n

        if itype in _FIXED:
            start = self.pos
            self.pos = start + n * item_size
            if itype == T_BOOL:
                for chunk_start in range(start, self.pos, 1 << 20):  # bounded copies
                    chunk = self.buf[chunk_start : min(chunk_start + (1 << 20), self.pos)]
                    if chunk.translate(None, b"\x00\x01"):
                        raise _invalid(f"key {key!r} is a bool array with a value other than 0 or 1")
                return [b == 1 for b in self.buf[start : self.pos]] if keep else ArraySummary("bool", n)
            if not keep:
                return ArraySummary(VALUE_TYPE_NAMES[itype], n)
            return list(struct.unpack_from(f"<{n}{_FIXED[itype][0]}", self.buf, start))

        if keep:
            if itype == T_STRING:
                return [self.text(f"item {j} of {what}") for j in range(n)]
            return [self.array(key, depth + 1, keep_allowed=True) for _ in range(n)]

        self.walked += n
        if self.walked > MAX_WALKED_ITEMS:
            raise _invalid(f"metadata arrays hold more than {MAX_WALKED_ITEMS} strings or arrays in all")
        if itype == T_STRING:
            self.skip_strings(n, what)
        else:
            for _ in range(n):
                self.array(key, depth + 1, keep_allowed=False)
        return ArraySummary(VALUE_TYPE_NAMES[itype], n)

    def skip_strings(self, n: int, what: str) -> None:
        """Step over ``n`` strings by their lengths alone: the hot loop for vocabularies."""
        buf, pos, unpack = self.buf, self.pos, _U64.unpack_from
        try:
            for _ in range(n):
                pos += 8 + unpack(buf, pos)[0]
        except (struct.error, OverflowError):
            # A length field runs past the end, or a previous length jumped past it.
            raise _eof(
                f"the strings of {what}", f"the strings run past the end of the file ({self.size} bytes)"
            ) from None
        if pos > self.size:
            raise _eof(
                f"the strings of {what}", f"the strings run past the end of the file ({self.size} bytes)"
            )
        self.pos = pos

    # -- tensor infos ----------------------------------------------------------------------

    def tensor_infos(
        self, n_tensors: int, alignment: int
    ) -> list[tuple[str, tuple[int, ...], int, int, int]]:
        infos = []
        seen: set[str] = set()
        for i in range(n_tensors):
            raw = self.raw_string(f"the name of tensor #{i}", MAX_TENSOR_NAME_BYTES)
            if not raw:
                raise _invalid(f"tensor #{i} has an empty name")
            try:
                name = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise _invalid(f"the name of tensor #{i} is not valid UTF-8") from None
            if name in seen:
                raise _invalid(f"duplicate tensor name {name!r}")
            seen.add(name)
            n_dims = self.u32(f"the number of dimensions of tensor {name!r}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise _invalid(f"tensor {name!r} has {n_dims} dimensions (must be 1 to {MAX_DIMS})")
            self.need(8 * n_dims, f"the shape of tensor {name!r}")
            shape = struct.unpack_from(f"<{n_dims}Q", self.buf, self.pos)
            self.pos += 8 * n_dims
            n_elements = 1
            for j, d in enumerate(shape):
                if d < 1:
                    raise _invalid(f"tensor {name!r} has dimension {j} of size {d} (must be at least 1)")
                n_elements *= d
            if n_elements >= 1 << 63:  # ggml counts elements in an int64
                raise _invalid(f"tensor {name!r} of shape {list(shape)} has too many elements")
            type_id = self.u32(f"the type of tensor {name!r}")
            if type_id not in GGML_TYPES:
                raise _invalid(f"tensor {name!r} has unknown ggml type {type_id}")
            type_name, block_size, type_size = GGML_TYPES[type_id]
            if shape[0] % block_size:
                raise _invalid(
                    f"tensor {name!r} has rows of {shape[0]} elements, "
                    f"not a multiple of the {type_name} block size {block_size}"
                )
            offset = self.u64(f"the data offset of tensor {name!r}")
            if offset % alignment:
                raise _invalid(
                    f"tensor {name!r} data offset {offset} is not a multiple of the alignment {alignment}"
                )
            n_bytes = n_elements // block_size * type_size
            infos.append((name, shape, type_id, offset, n_bytes))
        return infos


def _parse(buf: mmap.mmap | bytes, size: int, path: Path) -> GGUFInfo:
    p = _Parser(buf, size)
    version, n_tensors, n_kv = p.header()
    metadata, types = p.metadata(n_kv)

    alignment = DEFAULT_ALIGNMENT
    if "general.alignment" in metadata:
        if types["general.alignment"] != T_UINT32:
            raise _invalid(
                f"general.alignment must be a uint32, not {VALUE_TYPE_NAMES[types['general.alignment']]}"
            )
        alignment = metadata["general.alignment"]  # type: ignore[assignment]
        if not 1 <= alignment <= MAX_ALIGNMENT or alignment & (alignment - 1):
            raise _invalid(f"general.alignment {alignment} is not a power of two from 1 to {MAX_ALIGNMENT}")

    infos = p.tensor_infos(n_tensors, alignment)
    header_end = p.pos
    data_offset = -(-header_end // alignment) * alignment
    if infos and data_offset > size:
        raise _eof(
            "the padding before the tensor data",
            f"the tensor data would start at byte {data_offset}, the file has {size} bytes",
        )
    if not infos and data_offset > size:
        data_offset = header_end  # a tensor-less file (e.g. vocab only) need not be padded

    tensors = []
    for name, shape, type_id, rel_offset, n_bytes in infos:
        start = data_offset + rel_offset
        end = start + n_bytes
        if end > size:
            raise _eof(f"the data of tensor {name!r}", f"it ends at byte {end}, the file has {size} bytes")
        tensors.append(TensorInfo(name, tuple(shape), type_id, GGML_TYPES[type_id][0], start, n_bytes))

    by_offset = sorted(tensors, key=lambda t: (t.offset, t.offset + t.n_bytes))
    for before, after in itertools.pairwise(by_offset):
        if after.offset < before.offset + before.n_bytes:
            raise _invalid(f"the data of tensor {after.name!r} overlaps the data of tensor {before.name!r}")

    return GGUFInfo(
        path=path,
        file_size=size,
        version=version,
        alignment=alignment,
        data_offset=data_offset,
        metadata=metadata,
        tensors=tuple(tensors),
    )


def read_gguf(path: str | os.PathLike[str]) -> GGUFInfo:
    """Validate a GGUF file's header and return what it says, without reading tensor data.

    Raises :class:`ModelNotFoundError` if ``path`` does not exist, and :class:`InvalidModelError`
    (``"not a valid GGUF file: <reason>"``) for anything wrong with the bytes, or
    (``"cannot read <path>: <error>"``) when the file cannot be opened or read.
    """
    path = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
    # O_NONBLOCK so that a FIFO swapped in for the file cannot hang open(); it does nothing for
    # regular files, which are all we go on to read.
    flags |= getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except (FileNotFoundError, NotADirectoryError, ValueError):  # ValueError: a NUL in the path
        raise ModelNotFoundError(f"model file not found: {path}", hint="check the path") from None
    except OSError as exc:
        raise InvalidModelError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        try:
            st = os.fstat(fd)
        except OSError as exc:
            raise InvalidModelError(f"cannot read {path}: {exc.strerror or exc}") from exc
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise InvalidModelError(f"cannot read {path}: it is {kind}")
        size = st.st_size
        if size == 0:
            raise _eof("the magic", "the file is empty")
        try:
            buf = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise InvalidModelError(f"cannot read {path}: {exc}") from exc
        try:
            return _parse(buf, size, path)
        except OSError as exc:  # an I/O error surfacing through the mapping
            raise InvalidModelError(f"cannot read {path}: {exc.strerror or exc}") from exc
        finally:
            buf.close()
    finally:
        os.close(fd)


def validate_gguf(path: str | os.PathLike[str]) -> GGUFInfo:
    """Same as :func:`read_gguf`: validate and return the header (the name reads better at call sites
    that only care that the file is sound)."""
    return read_gguf(path)
