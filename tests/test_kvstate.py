"""engine.kvstate: a saved sequence's V cache converted between llama.cpp's two layouts (flash
attention on: one row per cell; off: transposed), on real models and real contexts."""

from __future__ import annotations

import struct

import pytest
from conftest import needs_amx_twin, run_python

from localinfer.engine.types import LoadOptions


def _second_context(model, flash_attn: bool):  # noqa: ANN001, ANN202
    from localinfer.engine import twin
    from localinfer.engine.backend import llama_cpp

    settings = twin.decode_settings(model._params[1], model.n_ctx, flash_attn)
    ctx = llama_cpp.llama_init_from_model(model._model, settings)
    assert ctx
    return ctx


@pytest.mark.parametrize("which", ["smollm2", "gemma"])  # a plain cache; an interleaved sliding-window pair
def test_a_cache_converted_to_the_other_layout_restores_exactly_and_converts_back(which, smollm2_path, gemma_path):
    from localinfer.engine import kvstate, twin
    from localinfer.engine.backend import llama_cpp
    from localinfer.engine.llama import Model

    with Model(smollm2_path if which == "smollm2" else gemma_path, LoadOptions(n_ctx=1024, n_threads=2, flash_attn="on")) as m:
        m._decode(m.tokenize("The history of computing is a story of abstraction. " * 20))
        rows = twin.sequence_state(m._ctx_prompt)
        assert kvstate.v_layout(rows) is False  # flash attention: one row per cell
        assert kvstate.with_v_layout(rows, False) is rows  # already so: untouched
        transposed = kvstate.with_v_layout(rows, True)
        assert kvstate.v_layout(transposed) is True and len(transposed) == len(rows) and transposed != rows
        other = _second_context(m, flash_attn=False)
        try:
            assert not twin.restore_sequence(other, rows)  # llama.cpp refuses the other layout
            assert twin.restore_sequence(other, bytes(transposed))  # read from a copy
            assert twin.restore_sequence(other, transposed)  # read in place (a bytearray)
            saved = twin.sequence_state(other)
            assert saved == transposed  # what it holds is exactly what was converted
            assert kvstate.with_v_layout(saved, False) == rows  # and back, to the byte
        finally:
            llama_cpp.llama_free(other)


def _state(trans: bool, k: list[int], v: list[int], n_embd: int, v_type: int = 1) -> bytes:
    """A one-layer, two-cell cache (K F16, V F16 or ``v_type``) as llama.cpp saves it (magic, seq 0, 1 stream)."""
    cells = 2
    out = struct.pack("<IiII", 0xAF143CD8, 0, 1, cells) + b"".join(struct.pack("<iI", pos, 1) + struct.pack("<i", 0) for pos in range(cells))
    out += struct.pack("<II", int(trans), 1) + struct.pack("<iQ", 1, 2 * n_embd) + struct.pack(f"<{len(k)}H", *k)
    head = struct.pack("<iII", v_type, 2, n_embd) if trans else struct.pack("<iQ", v_type, 2 * n_embd)
    return out + head + struct.pack(f"<{len(v)}H", *v)


def _bf16_bits(f16_bits: int) -> int:
    """An F16 value's nearest BF16 (ties to even), by hand."""
    (x,) = struct.unpack("<I", struct.pack("<f", struct.unpack("<e", struct.pack("<H", f16_bits))[0]))
    return (x + 0x7FFF + ((x >> 16) & 1)) >> 16


def _f16_bits(bf16_bits: int) -> int:
    return struct.unpack("<H", struct.pack("<e", struct.unpack("<f", struct.pack("<I", bf16_bits << 16))[0]))[0]


@pytest.mark.parametrize("trans", [False, True])
def test_the_v_values_change_type_between_f16_and_bf16_rounded_to_nearest(trans):
    from localinfer.engine import kvstate

    k = [9, 8, 7, 6, 5, 4, 3, 2]  # K is never converted
    # 1, 0.5, -2, 0, 1 + 2^-10 (rounds down), 1 + 6 * 2^-10 (rounds up), a subnormal, -1000
    f16 = [0x3C00, 0x3800, 0xC000, 0x0000, 0x3C01, 0x3C06, 0x0001, 0xE3D0]
    bf16 = [_bf16_bits(x) for x in f16]
    assert bf16[:6] == [0x3F80, 0x3F00, 0xC000, 0x0000, 0x3F80, 0x3F81]
    n_embd = 4  # two cells of 4: the same values in either layout, converted one by one
    state = _state(trans, k, f16, n_embd)
    converted = kvstate.with_v_layout(state, trans, 30)
    assert converted == _state(trans, k, bf16, n_embd, v_type=30)
    back = kvstate.with_v_layout(converted, trans, 1)
    assert back == _state(trans, k, [_f16_bits(x) for x in bf16], n_embd)
    assert kvstate.with_v_layout(back, trans, 1) is back  # already F16: untouched
    # both at once: the other layout and the other type
    other = [bf16[i] for i in (0, 4, 1, 5, 2, 6, 3, 7)] if not trans else [bf16[i] for i in (0, 2, 4, 6, 1, 3, 5, 7)]
    assert kvstate.with_v_layout(state, not trans, 30) == _state(not trans, k, other, n_embd, v_type=30)
    assert kvstate.with_v_layout(state, trans, 8) is None  # Q8_0: not a conversion it makes


@pytest.mark.parametrize("numpy_loaded", ["yes", "no", "half"])  # numpy when imported whole, memoryviews otherwise
def test_the_v_values_are_transposed_cell_by_dimension(numpy_loaded, monkeypatch):
    import sys
    import types

    import numpy

    from localinfer.engine import kvstate

    if numpy_loaded == "no":
        monkeypatch.delitem(sys.modules, "numpy")
    elif numpy_loaded == "half":  # another thread is importing it
        half = types.ModuleType("numpy")
        half.__spec__ = types.SimpleNamespace(_initializing=True)
        monkeypatch.setitem(sys.modules, "numpy", half)
    else:
        assert sys.modules["numpy"] is numpy

    k = [9, 8, 7, 6, 5, 4]  # K stays one row per cell either way
    rows = _state(False, k, [1, 2, 3, 4, 5, 6], n_embd=3)  # cell 0: 1 2 3, cell 1: 4 5 6
    transposed = _state(True, k, [1, 4, 2, 5, 3, 6], n_embd=3)  # dimension 0: 1 4, 1: 2 5, 2: 3 6
    assert kvstate.with_v_layout(rows, True) == transposed
    assert kvstate.with_v_layout(transposed, False) == rows
    assert kvstate.v_layout(rows) is False and kvstate.v_layout(transposed) is True


def test_a_value_rounded_past_f16s_largest_comes_back_finite():
    from localinfer.engine import kvstate

    k = [0] * 4
    # 65,504 (F16's largest) and 65,440 round up to 65,536 in BF16; infinities stay infinite
    f16 = [0x7BFF, 0xFBFD, 0x7C00, 0xFC00]
    bf16 = kvstate.with_v_layout(_state(False, k, f16, n_embd=2), False, 30)
    assert bf16 == _state(False, k, [0x4780, 0xC780, 0x7F80, 0xFF80], n_embd=2, v_type=30)
    assert kvstate.with_v_layout(bf16, False, 1) == _state(False, k, [0x7BFF, 0xFBFF, 0x7C00, 0xFC00], n_embd=2)


def test_a_cache_converted_to_bf16_restores_into_a_bf16_context_and_comes_back(smollm2_path):
    from localinfer.engine import kvstate, twin
    from localinfer.engine.backend import llama_cpp
    from localinfer.engine.llama import Model

    with Model(smollm2_path, LoadOptions(n_ctx=1024, n_threads=2, flash_attn="on")) as m:
        m._decode(m.tokenize("The history of computing is a story of abstraction. " * 10))
        rows = twin.sequence_state(m._ctx_prompt)
        for trans in (False, True):
            converted = kvstate.with_v_layout(rows, trans, 30)
            assert converted is not None and len(converted) == len(rows) and converted != rows
            settings = twin.decode_settings(m._params[1], m.n_ctx, not trans)
            settings.type_v = 30
            other = llama_cpp.llama_init_from_model(m._model, settings)
            assert other
            try:
                assert not twin.restore_sequence(other, kvstate.with_v_layout(rows, trans))  # F16 into BF16: refused
                assert twin.restore_sequence(other, converted)
                assert twin.sequence_state(other) == converted
            finally:
                llama_cpp.llama_free(other)
            back = kvstate.with_v_layout(converted, False, 1)
            assert twin.restore_sequence(m._ctx_prompt, back)
            assert kvstate.with_v_layout(kvstate.with_v_layout(back, False, 30), False, 1) == back  # exact from now on


def test_what_does_not_parse_is_left_alone(smollm2_path):
    from localinfer.engine import kvstate, twin
    from localinfer.engine.llama import Model

    with Model(smollm2_path, LoadOptions(n_ctx=256, n_threads=2)) as m:
        m._decode(m.tokenize("Once upon a time"))
        state = twin.sequence_state(m._ctx_prompt)
    for broken in (b"", state[:-1], state + b"\0", b"\0" * 64, state[:8] + struct.pack("<I", 7) + state[12:]):
        assert kvstate.with_v_layout(broken, True) is None and kvstate.v_layout(broken) is None


@needs_amx_twin
@pytest.mark.parametrize("converts", [True, False])
def test_the_twin_decodes_without_flash_attention_or_else_as_the_model_does(smollm2_path, monkeypatch, converts):
    # The twin decodes faster without flash attention; its cache is converted on the way there and
    # back. A cache kvstate cannot read is copied as it is, to a twin made again like the model.
    from localinfer.engine import kvstate, twin
    from localinfer.engine.llama import Model
    from localinfer.engine.types import GenerationStats, SamplingOptions

    monkeypatch.setattr(twin, "SHALLOW_MEAN_DEPTH", 0)  # as for an answer that goes deep (twin.shallow)
    if not converts:
        monkeypatch.setattr(kvstate, "v_layout", lambda state: None)
    with Model(smollm2_path, LoadOptions(n_ctx=1024, n_threads=2)) as m:
        prompt = m.tokenize("Once upon a time")

        def answer(tokens):  # noqa: ANN001, ANN202
            stats = GenerationStats()
            text = "".join(s.text for s in m.generate(tokens, SamplingOptions(temperature=0), stats, max_tokens=40, ignore_eos=True))
            return text, stats

        first, _ = answer(prompt)
        assert m.decodes_on_twin and m._twin.v_transposed == converts and first
        follow = m.cached_tokens + m.tokenize(" The end.", add_special=False)
        text, stats = answer(follow)  # the cache came back from the twin: only the new tokens are evaluated
        assert stats.cached_tokens == len(prompt) + 39 and text and m.decodes_on_twin


def test_numpy_is_imported_for_a_large_state_only():
    # Nothing imports numpy before the first conversion (the chat formatter no longer does): a state
    # below NUMPY_PAYS_BYTES is converted in memoryview copies, a larger one imports numpy first.
    code = (
        "import sys\n"
        "from localinfer.engine import kvstate\n"
        "assert kvstate.with_v_layout(b'not a state', True) is None\n"
        "small = 'numpy' in sys.modules\n"
        "kvstate.NUMPY_PAYS_BYTES = 8\n"
        "assert kvstate.with_v_layout(b'not a state', True) is None\n"
        "print(small, 'numpy' in sys.modules)\n"
    )
    assert run_python(code).stdout.split() == ["False", "True"]
