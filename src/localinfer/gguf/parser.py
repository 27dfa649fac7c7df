"""The GGUF header parser: a stdlib-only validator and metadata reader.

:func:`parse_buffer` runs (via :func:`localinfer.gguf.read_gguf`) before a file is registered or
handed to llama.cpp (whose own parser has a history of memory-safety bugs), so it treats every byte
as hostile: every count, length, type and offset is checked against the file size and against fixed
limits before it is used, work is bounded (no loop runs more often than the file has bytes for, and
walking big arrays has a global budget), and memory is bounded (big arrays are summarised, never
materialised; tensor data is never read). The fixed limits: ``bounds.py``.

Layout (GGUF v2/v3, little-endian; see ggml's ``docs/gguf.md``)::

    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv x (string key | u32 value_type | value)
    n_tensors x (string name | u32 n_dims | n_dims x u64 ne | u32 ggml_type | u64 offset)
    padding to general.alignment | tensor data (offsets relative to here)

where a string is ``u64 length`` + UTF-8 bytes and an array value is ``u32 item_type`` +
``u64 length`` + items.

Anything wrong raises :class:`~localinfer.errors.InvalidModelError` whose message is
``"not a valid GGUF file: <reason>"``; a file cut short anywhere gives a reason that starts
``"unexpected end of file while reading ..."``. It checks the format only: the values llama.cpp
asserts on (block and head counts, ...) are :mod:`localinfer.gguf.checks`' business.

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
import struct
from pathlib import Path
from typing import cast

from localinfer.errors import InvalidModelError
from localinfer.gguf.bounds import (  # the limits; tests read them here too
    GGUF_MAGIC, SUPPORTED_VERSIONS, DEFAULT_ALIGNMENT, MAX_ALIGNMENT, MAX_DIMS, MAX_TENSOR_NAME_BYTES,
    MAX_TENSOR_COUNT, MAX_KV_COUNT, MAX_KEY_BYTES, MAX_STRING_BYTES, MAX_ARRAY_LENGTH, MAX_ARRAY_DEPTH,
    MAX_WALKED_ITEMS, MAX_NESTED_ARRAYS, MAX_DECODED_STRING_BYTES, MAX_KEPT_ITEMS, SMALL_ARRAY,
    MAX_KEPT_NUMERIC_ARRAY, MIN_KV_BYTES, MIN_TENSOR_INFO_BYTES, MIN_STRING_BYTES, MIN_ARRAY_BYTES,
)
from localinfer.gguf.types import (
    FIXED_FORMATS,
    FIXED_STRUCTS,
    GGML_TYPES,
    NUMERIC_TYPES,
    T_ARRAY,
    T_BOOL,
    T_STRING,
    T_UINT32,
    VALUE_TYPE_NAMES,
    ArraySummary,
    GGUFInfo,
    TensorInfo,
)

__all__ = ["parse_buffer"]

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_ARRAY_HEAD = struct.Struct("<IQ")  # item type, length

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

    def name(self, what: str, limit: int, if_empty: str) -> str:
        """A key or tensor name: non-empty, strict UTF-8 (llama.cpp looks them up by exact bytes)."""
        raw = self.raw_string(what, limit)
        if not raw:
            raise _invalid(if_empty)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _invalid(f"{what} is not valid UTF-8") from None

    # -- header ----------------------------------------------------------------------------

    def header(self) -> tuple[int, int, int]:
        if self.size == 0:
            raise _eof("the magic", "the file is empty")
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
        need = n_kv * MIN_KV_BYTES + n_tensors * MIN_TENSOR_INFO_BYTES
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
            key = self.name(f"key #{i}", MAX_KEY_BYTES, f"key #{i} is empty")
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
        fmt = FIXED_STRUCTS[vtype]
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
        if itype in FIXED_FORMATS:
            item_size = FIXED_FORMATS[itype][1]
        else:
            item_size = MIN_STRING_BYTES if itype == T_STRING else MIN_ARRAY_BYTES
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
                    itype in NUMERIC_TYPES
                    and n <= MAX_KEPT_NUMERIC_ARRAY
                    and not key.startswith("tokenizer.")
                )
            )
        )
        if keep:
            self.kept += n

        if itype in FIXED_FORMATS:
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
            return list(struct.unpack_from(f"<{n}{FIXED_FORMATS[itype][0]}", self.buf, start))

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
            name = self.name(f"the name of tensor #{i}", MAX_TENSOR_NAME_BYTES, f"tensor #{i} has an empty name")
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


def parse_buffer(buf: mmap.mmap | bytes, size: int, path: Path) -> GGUFInfo:
    """Validate the header in the first ``size`` bytes of ``buf`` (the file at ``path``) and return
    what it says; :class:`InvalidModelError` (``"not a valid GGUF file: <reason>"``) if it is not sound."""
    p = _Parser(buf, size)
    version, n_tensors, n_kv = p.header()
    metadata, types = p.metadata(n_kv)

    alignment = DEFAULT_ALIGNMENT
    if "general.alignment" in metadata:
        if types["general.alignment"] != T_UINT32:
            raise _invalid(
                f"general.alignment must be a uint32, not {VALUE_TYPE_NAMES[types['general.alignment']]}"
            )
        alignment = cast(int, metadata["general.alignment"])  # a uint32, as its type tag said
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
