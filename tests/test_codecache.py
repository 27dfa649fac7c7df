"""localinfer.codecache: our dataclasses' generated methods run from code compiled once and kept in
__pycache__ (issue 40's start-up), the same classes as compiling their text each time."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest

from localinfer import codecache

CLASS = """
from dataclasses import dataclass, field

@dataclass(frozen=True)
class Point:
    x: int
    label: str = "a"
    tags: tuple = field(default=(), compare=False)
"""


def _module(name: str, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = types.ModuleType(name)
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses takes the globals from sys.modules
    exec(CLASS, module.__dict__)
    return module


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(codecache, "_path", str(tmp_path / "__pycache__" / "dataclass-code.marshal"))
    monkeypatch.setattr(codecache, "_codes", {})
    monkeypatch.setattr(codecache, "_used", set())
    monkeypatch.setattr(codecache, "_loaded", True)
    monkeypatch.setattr(codecache, "_added", True)  # no atexit write from a test
    monkeypatch.setattr(dataclasses, "exec", dataclasses.__dict__.get("exec"), raising=False)  # undone after
    codecache.install()  # as cli.main does before building the app
    return codecache


def test_our_classes_are_compiled_once_and_behave_as_dataclasses(cache, monkeypatch):
    assert getattr(dataclasses, "exec", None) is codecache._exec
    Point = _module("localinfer.test_codecache_a", monkeypatch).Point
    assert len(cache._codes) == 6  # __init__, __repr__, __eq__, __setattr__, __delattr__, __hash__
    p = Point(1)
    assert (p, repr(p), hash(p) == hash(Point(1, "a", ("x",)))) == (Point(1, "a"), "Point(x=1, label='a', tags=())", True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 2  # type: ignore[misc]
    assert dataclasses.replace(p, label="b").label == "b" and [f.name for f in dataclasses.fields(Point)] == ["x", "label", "tags"]

    cache._save()  # and read back by the next process: the same code, not compiled again
    saved = dict(cache._codes)
    monkeypatch.setattr(codecache, "_codes", {})
    cache._load()
    assert cache._codes.keys() == saved.keys()
    Again = _module("localinfer.test_codecache_b", monkeypatch).Point
    assert cache._codes.keys() == saved.keys() and Again(3) == Again(3, "a")


def test_other_modules_and_a_foreign_cache_are_left_alone(cache, monkeypatch, tmp_path):
    _module("elsewhere_test_codecache", monkeypatch)
    assert cache._codes == {}  # another package's classes: compiled as dataclasses does
    (tmp_path / "__pycache__").mkdir()
    with open(cache._path, "wb") as f:
        f.write(codecache._HEADER + b"\x00\x00\r\n" + b"junk")  # another interpreter's bytecode
    cache._load()
    assert cache._codes == {}
