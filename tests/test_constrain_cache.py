"""The compiled-format cache is bounded in the formats' bytes as well as in their number: a client
sending large distinct schemas cannot make one loaded model hold an unbounded set of matchers."""

from __future__ import annotations

import pytest

from localinfer.engine import constrain
from localinfer.request.structured import Format


def _compiler(monkeypatch) -> constrain.Compiler:
    c = constrain.Compiler(None, 1)  # no model: matchers are stand-ins here
    monkeypatch.setattr(constrain.Compiler, "_matcher", lambda self, fmt: object())
    return c


@pytest.mark.llama  # engine.constrain loads llama.cpp's bindings
def test_the_cache_holds_at_most_its_bytes_of_format_text(monkeypatch):
    c = _compiler(monkeypatch)
    size = constrain.CACHE_TEXT_BYTES // 4 + 1
    formats = [Format("json_schema", f'{{"description":"{i}{"x" * size}"}}') for i in range(8)]
    for fmt in formats:
        c.compile(fmt)
    held = sum(len(k[1]) for k in c._cache)
    assert held <= constrain.CACHE_TEXT_BYTES and len(c._cache) == 3, (held, len(c._cache))
    assert c._text_bytes == held
    assert c.compile(formats[-1]) is c._cache[("json_schema", formats[-1].text)], "the newest kept"
    huge = Format("json_schema", "y" * (constrain.CACHE_TEXT_BYTES + 1))
    assert c.compile(huge) is not None and list(c._cache) == [("json_schema", huge.text)], "one over the bound: alone"


@pytest.mark.llama  # engine.constrain loads llama.cpp's bindings
@pytest.mark.parametrize("density", [0.0005, 0.03, 0.5, 0.999])
def test_a_masks_tokens_are_the_same_read_from_few_words_or_all(density):
    # constrain._set_bits reads a mask's tokens from its nonzero words where they are few, else from the
    # whole mask unpacked: the same ids, in order, either way (and for the forbidden side, ~words)
    import numpy as np

    from localinfer.engine.constrain import _FEW_WORDS, _set_bits, _tokens

    bits = np.random.default_rng(3).random(49_152) < density
    words = np.packbits(bits, bitorder="little").view(np.uint32)
    for side in (words, ~words):
        index = np.flatnonzero(side)
        assert np.array_equal(_set_bits(side, index), np.flatnonzero(bits if side is words else ~bits))
        assert np.array_equal(_set_bits(side, index), _tokens(index, side[index]))
    assert (len(np.flatnonzero(words)) <= _FEW_WORDS) == (density < 0.001)
