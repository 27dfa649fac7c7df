"""localinfer.request.reasoning: the families' markers found in their real templates, and the streaming
splitter (a marker split across pieces, thinking opened by the prompt, thinking never closed)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localinfer.request import reasoning
from localinfer.request.reasoning import Markers, Splitter, Thinking, detect, opened_by

THINK = Markers("<think>", "</think>")
GPT_OSS = Markers("<|channel|>analysis<|message|>", "<|end|>", answer_open="<|channel|>final<|message|>")


def split_text(markers: Markers, text: str, *, opened: bool = False) -> tuple[str | None, str]:
    """A whole answer's ``(reasoning, answer)``: its text fed at once."""
    s = Splitter(markers, opened=opened)
    s.feed(text)
    s.flush()
    return s.reasoning, s.answer


def _streamed(markers: Markers, pieces: list[str], opened: bool = False) -> tuple[str, str, list[tuple[str, str]]]:
    s = Splitter(markers, opened=opened)
    out = [s.feed(p) for p in pieces] + [s.flush()]
    return "".join(r for r, _ in out), "".join(a for _, a in out), out


@pytest.mark.parametrize(
    ("text", "opened", "thinking", "answer"),
    [
        ("<think>\nI should add.\n</think>\n\n4", False, "I should add.", "4"),
        ("  <think>a</think>b", False, "a", "b"),  # whitespace before the marker
        ("\nI should add.\n</think>\n\n4", True, "I should add.", "4"),  # DeepSeek-R1-Distill: opened by the prompt
        ("<think>\nx\n</think>\n\n4", True, "x", "4"),  # a model that opens it again anyway
        ("Just 4.", False, "", "Just 4."),  # a reasoning template, an answer without thinking
        ("4 <think>not thinking</think>", False, "", "4 <think>not thinking</think>"),  # only at the start
        ("<think>ran out of tokens", False, "ran out of tokens", ""),  # never closed: all thinking
        ("<thi", False, "", "<thi"),  # the start of a marker that never came
    ],
)
def test_split_whole_and_streamed_agree(text: str, opened: bool, thinking: str, answer: str) -> None:
    assert split_text(THINK, text, opened=opened) == (thinking, answer)
    for size in (1, 2, 3, 5):  # every way of cutting the markers across pieces
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        r, a, _ = _streamed(THINK, pieces, opened)
        assert (r, a) == (thinking, answer), size


@given(st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=40))
def test_any_cut_of_a_reasoning_answer_gives_the_same_split(cuts: list[int]) -> None:
    text = "<think>\nStep one.\nStep two. </thin k> is not a marker\n</think>\n\nThe answer: 42 </think> stays."
    pieces, at = [], 0
    for n in cuts:
        pieces.append(text[at : at + n])
        at += n
    pieces.append(text[at:])
    r, a, _ = _streamed(THINK, pieces)
    assert r == "Step one.\nStep two. </thin k> is not a marker"
    assert a == "The answer: 42 </think> stays."


def test_no_piece_of_the_markers_is_handed_out() -> None:
    _r, _a, out = _streamed(THINK, list("<think>abc</think>def"))
    assert all("<" not in r + a and ">" not in r + a for r, a in out)
    assert [r for r, _ in out if r] == ["a", "b", "c"]  # the thinking streams as it comes, not at the end


def test_gpt_oss_channels() -> None:
    text = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi!"
    assert split_text(GPT_OSS, text) == ("Think.", "Hi!")
    r, a, _ = _streamed(GPT_OSS, [text[i : i + 4] for i in range(0, len(text), 4)])
    assert (r, a) == ("Think.", "Hi!")
    # no final channel after the thinking: what followed it is the answer
    assert split_text(GPT_OSS, "<|channel|>analysis<|message|>T<|end|>plain") == ("T", "plain")


def test_thinking_counts_and_times_its_pieces() -> None:
    got: list[tuple[str, str]] = []
    t = Thinking(Splitter(THINK), lambda x: got.append(("text", x)), lambda x: got.append(("reasoning", x)))
    for piece in ["<think>", "a", "b", "</think>", "\n\n", "c", "d"]:
        t.feed(piece)
    t.finish()
    assert got == [("reasoning", "a"), ("reasoning", "b"), ("text", "c"), ("text", "d")]
    assert t.tokens == 4  # <think>, a, b, </think>
    assert t.t_reasoning is not None and t.t_text is not None and t.t_reasoning <= t.t_text


def test_opened_by_the_generation_prompt() -> None:
    assert opened_by(THINK, "<|im_start|>assistant\n<think>\n")
    assert not opened_by(THINK, "<|im_start|>assistant\n<think>\n\n</think>\n\n")  # Qwen3, enable_thinking=False
    assert not opened_by(THINK, "<|im_start|>assistant\n")


def test_detect_from_template_text() -> None:
    assert detect(None) is None and detect("{{ messages }}") is None
    assert detect("{{ '<think>' }}{{ '</think>' }}") == THINK
    assert detect("<seed:think>x</seed:think>").open == "<seed:think>"
    assert detect("[THINK]x[/THINK]").close == "[/THINK]"
    assert detect("<|START_THINKING|><|END_THINKING|>").open == "<|START_THINKING|>"
    assert reasoning.FORMATS == ("auto", "deepseek", "none")
