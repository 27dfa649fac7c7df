"""What a GGUF header holds, as plain data: the metadata value types, ggml's tensor type table
(block and type sizes), llama.cpp's file-type names, and the result dataclasses
(:class:`GGUFInfo`, :class:`TensorInfo`, :class:`ArraySummary`). Stdlib only, no I/O.
"""

from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "GGML_TYPES",
    "LLAMA_FTYPE_NAMES",
    "VALUE_TYPE_NAMES",
    "ArraySummary",
    "GGUFInfo",
    "TensorInfo",
    "ggml_type_name",
    "ggml_type_size",
]

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
FIXED_FORMATS = {
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
FIXED_STRUCTS = {t: struct.Struct("<" + c) for t, (c, _) in FIXED_FORMATS.items()}
NUMERIC_TYPES = frozenset(FIXED_FORMATS) - {T_BOOL}

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
