"""store.headers: a header parsed once is read back for the same file, parsed again for a changed
one, and a broken cache is only a miss."""

from __future__ import annotations

import os

import pytest
from ggufsynth import write_gguf

from localinfer.gguf import read_gguf
from localinfer.gguf.types import ArraySummary
from localinfer.store import headers


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALINFER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _model(path, **kw):
    extra = {"tokenizer.ggml.tokens": [f"t{i}" for i in range(3000)], "x.floats": [0.5, -1.25],
             "x.nested": [[1, 2], [3]], "x.nan": float("inf")}  # fmt: skip
    return write_gguf(path, chat_template="{{ messages }}", extra=extra, **kw)


def _no_parse(monkeypatch):
    def fail(path):
        raise AssertionError("parsed again")

    monkeypatch.setattr("localinfer.gguf.checks.parse_gguf", fail)


def test_a_header_is_parsed_once_per_file_version(home, tmp_path, monkeypatch):
    path = _model(tmp_path / "m.gguf")
    first = headers.read_header_cached(path)
    assert first == read_gguf(path)
    assert isinstance(first.metadata["tokenizer.ggml.tokens"], ArraySummary)  # summarised, and so kept
    with monkeypatch.context() as m:
        _no_parse(m)
        again = headers.read_header_cached(path)
    assert again == first and again.tensors == first.tensors and again.metadata == first.metadata
    _model(path, context_length=4096)  # rewritten: another file now
    changed = headers.read_header_cached(path)
    assert changed.context_length == 4096 and changed != first


def test_a_broken_or_foreign_cache_is_a_miss(home, tmp_path, monkeypatch):
    path = _model(tmp_path / "m.gguf")
    headers.read_header_cached(path)
    cache = home / "models" / "gguf-headers.json"
    cache.write_text('{"%s": {"key": "not this file", "info": {}}}' % path)
    assert headers.read_header_cached(path) == read_gguf(path)
    cache.write_text("not json")
    assert headers.read_header_cached(path) == read_gguf(path)
    record = cache.read_text()
    cache.write_text(record.replace('"tensors"', '"tensorz"'))  # a record this code cannot read
    assert headers.read_header_cached(path) == read_gguf(path)


def test_the_cache_keeps_a_bounded_number_of_files(home, tmp_path, monkeypatch):
    monkeypatch.setattr(headers, "MAX_ENTRIES", 3)
    paths = [_model(tmp_path / f"m{i}.gguf", name=f"m{i}") for i in range(5)]
    for p in paths:
        headers.read_header_cached(p)
    import json

    kept = json.loads((home / "models" / "gguf-headers.json").read_text())
    assert list(kept) == [str(p) for p in paths[-3:]]
    os.unlink(paths[3])
    headers.read_header_cached(paths[0])
    assert list(json.loads((home / "models" / "gguf-headers.json").read_text())) == [str(paths[2]), str(paths[4]), str(paths[0])]
