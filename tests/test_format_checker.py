"""request/checker.py: serve checks large schemas and grammars in a helper process (off the GIL its
event loop needs, issue 40), with the answers and errors of the in-thread checks."""

from __future__ import annotations

import pytest
from test_serve_hostile_formats import WIDE, _chain, _ref_chain, _wide

from localinfer.request import checker, structured

LARGE = [
    lambda: structured.from_grammar(_wide(600)),
    lambda: structured.from_grammar(_chain(3000)),
    lambda: structured.from_schema({"type": "string", "pattern": WIDE * 2000}),
    lambda: structured.from_schema({"type": "string", "pattern": "(?=a)" + "a" * 9000}),
    lambda: structured.from_schema(_ref_chain(1000)),
    lambda: structured.from_schema({"type": "string", "pattern": "\ud800" * 9000}),  # a lone surrogate travels
]


def _outcome(make):
    try:
        f = make()
    except structured.FormatError as exc:
        return "error", str(exc)
    return f, f.lark


@pytest.fixture
def helper():
    checker.enable()
    yield checker
    checker.enable(False)


def test_the_helper_answers_as_the_thread_does(helper):
    offloaded = [_outcome(make) for make in LARGE]
    assert checker._proc is not None and checker._proc.poll() is None  # they went to the helper
    helper.enable(False)
    assert offloaded == [_outcome(make) for make in LARGE]
    assert offloaded[0][1].startswith("%llguidance") and offloaded[1][0] == "error" and offloaded[3][0] == "error"


def test_small_formats_stay_in_thread_and_a_dead_helper_is_replaced(helper):
    structured.from_grammar('root ::= "yes" | "no"')
    assert checker._proc is None  # not started for a small format
    structured.from_grammar(_wide(600))
    first = checker._proc
    assert first is not None
    first.kill()
    first.wait()
    assert structured.from_grammar(_wide(601)).lark.startswith("%llguidance")
    assert checker._proc is not None and checker._proc is not first


def test_a_format_that_stops_the_helper_is_refused(helper, monkeypatch):
    structured.from_grammar(_wide(600))
    monkeypatch.setattr(checker, "read_message", lambda stream: (checker._proc.kill(), checker._proc.wait(), b"")[-1])
    with pytest.raises(structured.FormatError, match="the grammar could not be checked"):
        structured.from_grammar(_wide(602))
    assert checker._proc is None
