"""A sequence's saved KV cache (``llama_state_seq_get_data``), with its V cache in either layout and type.

llama.cpp keeps the V cache one row per cell with flash attention, and transposed (one row per
embedding dimension) without it; a saved state restores only into a context of the same layout
("incompatible V transposition") and cache types. The AMX decoding twin (``engine.twin``) decodes
a deep cache without flash attention while the main context evaluates prompts with it: on this CPU
flash attention evaluates a prompt faster (pp371 +9%, pp1024 +17%) but decodes one token slower
the deeper the cache (F16 V: tg128 at depth 200: -28%). A shallow one it decodes with flash
attention and a BF16 V cache, faster still there, while the prompt side keeps F16 (pp371 -10% with
BF16). So the state is converted on the way.

The layout, as llama-cpp-python 0.3.36's llama.cpp writes it (``llama_context::state_seq_get_data``,
``llama_kv_cache::state_write``), all little-endian: ``u32 magic, i32 seq_id``; per cache (an
interleaved sliding-window model writes two, one after the other) ``u32 n_stream``; per stream
``u32 cell_count`` and, unless 0, per cell ``i32 pos, u32 n_seq_id, i32 seq_id * n_seq_id``, then
``u32 v_trans, u32 n_layer``, per layer ``i32 type, u64 row_size`` and the K rows; then per layer
``i32 type, u64 row_size`` and the V rows, or transposed ``i32 type, u32 element_size,
u32 n_embd`` and, per dimension, its values in every cell. What does not parse exactly (cells that
carry more, as M-RoPE models' do; a quantized V cache to transpose; another version's layout) is
left alone: ``with_v_layout`` returns None, and the twin then keeps the main context's layout.

The V type changes F16 <-> BF16 through ggml's own row conversions (rounded to nearest even).
F16 to BF16 drops three bits of mantissa. BF16 to F16 is exact within F16's normal range; below
it, F16's subnormals round, and a value beyond F16's largest (65,504: an F16 value within 0.15% of it
rounds there in BF16) comes back as that largest, not as infinity.
"""

from __future__ import annotations

import ctypes
import importlib
import struct

from localinfer.engine.backend import GGML_F16, GGML_FLOAT_BYTES, ggml_row_converter
from localinfer.engine.bindings import imported

_FORMAT = {2: "H", 4: "I"}  # a value of each size in GGML_FLOAT_BYTES (the types a transposed V cache can have)
_MAGIC = 0xAF143CD8  # llama_context's io_magic, first in a sequence's state
# A state this large is converted with numpy, imported for it if nothing has: its V half alone then
# takes ~40 ms more in memoryview copies than with numpy (2.4 against 0.4 ms per MB), there and back
# again at each chat turn, and numpy's import costs ~60 ms once.
NUMPY_PAYS_BYTES = 32 << 20


class _Unparsed(Exception):
    pass


def v_layout(state: bytes | bytearray) -> bool | None:
    """Whether the state's V cache is transposed; None if it holds no cell or does not parse."""
    try:
        layouts, _ = _convert(state, None)
    except (_Unparsed, struct.error):
        return None
    return layouts.pop() if len(layouts) == 1 else None


def with_v_layout(state: bytes | bytearray, transposed: bool, v_type: int | None = None) -> bytes | bytearray | None:
    """``state`` with every V cache in the wanted layout and, unless None, of ggml type ``v_type``
    (itself when it already is); None when it does not parse or a type cannot be converted."""
    if len(state) >= NUMPY_PAYS_BYTES and imported("numpy") is None:
        try:
            importlib.import_module("numpy")  # _transpose finds it
        except ImportError:
            pass
    try:
        _, converted = _convert(state, transposed, v_type)
    except (_Unparsed, struct.error):
        return None
    return converted


def _convert(state: bytes | bytearray, transposed: bool | None, v_type: int | None = None) -> tuple[set[bool], bytes | bytearray]:
    """The layouts found, and the state with each V layer in the ``transposed`` layout (None: as it
    is) and of type ``v_type`` (None: as it is). Raises ``_Unparsed`` unless the whole state parses
    exactly (and each type that must change can)."""
    view = memoryview(state)
    end = len(view)
    off = 0
    pieces: list[bytes | bytearray | memoryview] = []
    kept_from = 0  # start of the stretch copied as it is
    layouts: set[bool] = set()

    def take(fmt: str) -> tuple:
        nonlocal off
        values = struct.unpack_from(fmt, view, off)
        off += struct.calcsize(fmt)
        return values

    def skip(n: int) -> memoryview:
        nonlocal off
        if n < 0 or off + n > end:
            raise _Unparsed
        piece = view[off : off + n]
        off += n
        return piece

    if take("<I")[0] != _MAGIC:
        raise _Unparsed
    take("<i")  # the sequence's id
    while off < end:  # one cache after the other
        (n_stream,) = take("<I")
        if not 0 < n_stream <= 256:
            raise _Unparsed
        for _ in range(n_stream):
            (cells,) = take("<I")
            if cells == 0:
                continue
            for _ in range(cells):
                _pos, n_seq = take("<iI")
                if n_seq > 256:
                    raise _Unparsed
                skip(4 * n_seq)
            trans, n_layer = take("<II")
            if trans not in (0, 1) or not 0 < n_layer <= 4096:
                raise _Unparsed
            trans = bool(trans)
            layouts.add(trans)
            relayout = transposed is not None and transposed != trans
            if relayout:  # the flag, then the layers below
                pieces.append(view[kept_from : off - 8])
                pieces.append(struct.pack("<II", int(transposed), n_layer))
                kept_from = off
            for _ in range(n_layer):  # K: rows
                _type, row = take("<iQ")
                skip(cells * row)
            for _ in range(n_layer):  # V
                layer_start = off
                if trans:
                    old_type, element, n_embd = take("<iII")
                else:
                    old_type, row = take("<iQ")
                    element = GGML_FLOAT_BYTES.get(old_type, 0)
                    if not relayout and v_type in (None, old_type):
                        skip(cells * row)  # rows need no element size: any type
                        continue
                    if element == 0 or row % element:
                        raise _Unparsed
                    n_embd = row // element
                if GGML_FLOAT_BYTES.get(old_type) != element:
                    raise _Unparsed
                data = skip(cells * n_embd * element)
                new_type = old_type if v_type is None else v_type
                if not relayout and new_type == old_type:
                    continue
                pieces.append(view[kept_from:layer_start])
                if new_type != old_type:
                    data = _retype(data, old_type, new_type)
                if transposed if relayout else trans:
                    pieces.append(struct.pack("<iII", new_type, element, n_embd))
                else:
                    pieces.append(struct.pack("<iQ", new_type, n_embd * element))
                if relayout:  # rows (cells x n_embd) <-> transposed (n_embd x cells)
                    rows, cols = (cells, n_embd) if transposed else (n_embd, cells)
                    pieces.append(_transpose(memoryview(data), rows, cols, element))
                else:
                    pieces.append(data)
                kept_from = off
    if off != end:
        raise _Unparsed
    if kept_from == 0:
        return layouts, state
    pieces.append(view[kept_from:end])
    return layouts, bytearray().join(pieces)  # a bytearray: restore_sequence reads it in place


def _transpose(data: memoryview, rows: int, cols: int, element: int) -> bytes:
    """A ``rows`` x ``cols`` matrix of ``element``-byte values, row-major, transposed: with numpy
    where it is imported (``with_v_layout`` imports it for a large state), otherwise in strided
    memoryview copies (SmolLM2's V cache at 1,501 cells: ~41 ms, with numpy ~7)."""
    np = imported("numpy")  # not one still being imported (bindings.chat_format_ahead)
    if np is not None:
        matrix = np.frombuffer(data, dtype=np.uint16 if element == 2 else np.uint32).reshape(rows, cols)
        return matrix.T.tobytes()
    fmt = _FORMAT[element]
    src = data.cast(fmt)
    out = bytearray(len(data))
    dst = memoryview(out).cast(fmt)
    if cols <= rows:  # one strided copy per column, or per row: whichever is fewer
        for c in range(cols):
            dst[c * rows : (c + 1) * rows] = src[c::cols]
    else:
        for r in range(rows):
            dst[r::rows] = src[r * cols : (r + 1) * cols]
    return bytes(out)


def _retype(data: memoryview, old_type: int, new_type: int) -> bytearray:
    """V values converted from one ggml type to another of the same element size (F16 <-> BF16) by
    ggml's own row functions; ``_Unparsed`` for any other pair."""
    if GGML_FLOAT_BYTES.get(old_type) != 2 or GGML_FLOAT_BYTES.get(new_type) != 2:
        raise _Unparsed
    convert = ggml_row_converter(old_type, new_type)
    if convert is None:
        raise _Unparsed
    count = len(data) // 2
    array = ctypes.c_uint16 * count
    src = array.from_buffer_copy(data) if data.readonly else array.from_buffer(data)  # read in place where it can
    out = bytearray(len(data))
    convert(ctypes.addressof(src), ctypes.addressof((ctypes.c_uint16 * count).from_buffer(out)), count)
    if new_type == GGML_F16:
        _finite_stays_finite(out, src)
    return out


def _finite_stays_finite(out: bytearray, src) -> None:  # noqa: ANN001 - a ctypes uint16 array
    """F16 values that came out infinite from a finite BF16 one (one rounded past F16's largest,
    65,504) become that largest instead: an infinity in the cache would turn attention into NaN.
    Two scans at C speed where (as ever in practice) there is none."""
    for pattern, largest in ((b"\x00\x7c", b"\xff\x7b"), (b"\x00\xfc", b"\xff\xfb")):  # +inf, -inf
        at = out.find(pattern)
        while at >= 0:
            if at % 2 == 0 and src[at // 2] & 0x7FFF != 0x7F80:  # not an infinity already
                out[at : at + 2] = largest
            at = out.find(pattern, at + 1)
