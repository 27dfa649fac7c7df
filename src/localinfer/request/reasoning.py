"""A reasoning model's thinking, kept apart from its answer: the markers of the families (read from
the chat template) and a streaming splitter (text pieces in, reasoning and answer pieces out).

The families' markers are those llama.cpp's ``common/chat.cpp`` parses: ``<think>…</think>`` (Qwen3,
QwQ, DeepSeek-R1 and its distills, SmolLM3, GLM-4.5/4.6, MiniMax, Kimi, Nemotron, Granite…),
Seed-OSS's ``<seed:think>``, Magistral's ``[THINK]``, Command-R7B's ``<|START_THINKING|>``,
Apertus's ``<|inner_prefix|>`` and gpt-oss's analysis channel. Thinking counts only at the start of
the answer (after whitespace), as llama.cpp parses it, or from the first token when the generation
prompt already opened it (DeepSeek-R1-Distill's ends in ``<think>\\n``). Plain Python only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

FORMATS = ("auto", "deepseek", "none")  # reasoning_format (llama-server's): none keeps the thinking inline


@dataclass(frozen=True)
class Markers:
    """How one family writes its thinking: ``open`` … ``close``; ``answer_open``: a header the answer
    starts after (gpt-oss's final channel), dropped with whatever precedes it after ``close``."""

    open: str
    close: str
    answer_open: str = ""


FAMILIES = (
    Markers("<|channel|>analysis<|message|>", "<|end|>", answer_open="<|channel|>final<|message|>"),  # gpt-oss
    Markers("<seed:think>", "</seed:think>"),  # ByteDance Seed-OSS
    Markers("<|START_THINKING|>", "<|END_THINKING|>"),  # Cohere Command-R7B
    Markers("<|inner_prefix|>", "<|inner_suffix|>"),  # Apertus
    Markers("[THINK]", "[/THINK]"),  # Magistral, Ministral reasoning
    Markers("<think>", "</think>"),  # Qwen3, QwQ, DeepSeek-R1, SmolLM3, GLM, MiniMax, Kimi, Granite...
)


def detect(template: str | None) -> Markers | None:
    """The markers a chat template writes, or None (not a reasoning model's template). A template
    names its markers (it renders past thinking, or opens it in the generation prompt)."""
    if not template:
        return None
    return next((m for m in FAMILIES if m.open in template and m.close in template), None)


def opened_by(markers: Markers, prompt_tail: str) -> bool:
    """Whether the prompt ends inside a thinking block (DeepSeek-R1-Distill's generation prompt);
    ``prompt_tail``: the end of the rendered prompt, special tokens written out."""
    tail = prompt_tail.rstrip()
    return tail.endswith(markers.open)


_START, _REASONING, _BETWEEN, _ANSWER_START, _ANSWER = range(5)


def _held(buf: str, marker: str) -> int:
    """Length of the longest end of ``buf`` that may begin ``marker`` (kept until the next piece)."""
    for n in range(min(len(buf), len(marker) - 1), 0, -1):
        if marker.startswith(buf[-n:]):
            return n
    return 0


class Splitter:
    """Feed the answer's pieces as they come; each ``feed`` returns ``(reasoning, answer)`` text to
    hand on now. A marker split across pieces is held back until it is whole; the reasoning and the
    answer are stripped of the whitespace around the markers. ``flush`` at the end."""

    def __init__(self, markers: Markers, *, opened: bool = False) -> None:
        self.markers = markers
        self._state = _START
        self._opened = opened  # the prompt opened the block: the answer starts as thinking
        self._buf = ""
        self._reasoning_started = False
        self.reasoning = ""  # all the thinking handed out so far
        self.answer = ""

    @property
    def opened(self) -> bool:
        """Whether the prompt opened the block (the answer starts as thinking)."""
        return self._opened

    @property
    def thinking(self) -> bool:
        """Whether the text fed last is (still) thinking, or may be: for counting reasoning tokens."""
        return self._state in (_REASONING, _BETWEEN) or (self._state == _START and self._opened)

    def feed(self, text: str) -> tuple[str, str]:
        self._buf += text
        reasoning, answer = self._step(final=False)
        self.reasoning += reasoning
        self.answer += answer
        return reasoning, answer

    def flush(self) -> tuple[str, str]:
        reasoning, answer = self._step(final=True)
        self.reasoning += reasoning
        self.answer += answer
        return reasoning, answer

    def _step(self, final: bool) -> tuple[str, str]:
        m, reasoning, answer = self.markers, "", ""
        while True:
            buf = self._buf
            if self._state == _START:
                head = buf.lstrip()
                if head.startswith(m.open):
                    self._buf, self._state = head[len(m.open) :], _REASONING
                elif m.open.startswith(head) and not final:
                    return reasoning, answer  # whitespace, or the start of the marker: wait
                else:
                    self._state = _REASONING if self._opened else _ANSWER_START
            elif self._state == _REASONING:
                at = buf.find(m.close)
                if at >= 0:
                    reasoning += self._think(buf[:at].rstrip())
                    self._buf = buf[at + len(m.close) :]
                    self._state = _BETWEEN if m.answer_open else _ANSWER_START
                    continue
                if final:  # never closed (the answer ran out of tokens): all of it was thinking
                    reasoning += self._think(buf.rstrip())
                    self._buf = ""
                    return reasoning, answer
                rest = buf[: len(buf) - _held(buf, m.close)]
                cut = len(rest.rstrip())  # whitespace is handed on only once more thinking follows
                reasoning += self._think(buf[:cut])
                self._buf = buf[cut:]
                return reasoning, answer
            elif self._state == _BETWEEN:
                at = buf.find(m.answer_open)
                if at >= 0:
                    self._buf, self._state = buf[at + len(m.answer_open) :], _ANSWER_START
                elif final:  # no final channel after all: what followed the thinking is the answer
                    self._state = _ANSWER_START
                else:
                    return reasoning, answer
            elif self._state == _ANSWER_START:
                head = buf.lstrip()
                if not head and not final:
                    self._buf = ""
                    return reasoning, answer
                self._buf, self._state = head, _ANSWER
            else:
                answer += buf
                self._buf = ""
                return reasoning, answer

    def _think(self, text: str) -> str:
        if not self._reasoning_started:
            text = text.lstrip()
            self._reasoning_started = bool(text)
        return text


OnText = Callable[[str], None]


class Thinking:
    """A reasoning answer's pieces as the engine hands them out: thinking to ``on_reasoning``, the
    answer to ``on_text`` (either None: wanted only at the end), counted and timed (``perf_counter``)."""

    __slots__ = ("split", "on_text", "on_reasoning", "tokens", "t_text", "t_reasoning")

    def __init__(self, split: Splitter, on_text: OnText | None = None, on_reasoning: OnText | None = None) -> None:
        self.split, self.on_text, self.on_reasoning = split, on_text, on_reasoning
        self.tokens = 0  # pieces fed while thinking: a piece is a token (a few, where a stop string held them)
        self.t_text: float | None = None  # the first piece of answer text
        self.t_reasoning: float | None = None  # the first piece of thinking

    def feed(self, piece: str) -> tuple[str, str]:
        """``(reasoning, answer)`` text of ``piece`` to hand on now (also given to the callbacks)."""
        thinking = self.split.thinking
        out = self._hand(*self.split.feed(piece))
        self.tokens += thinking or self.split.thinking
        return out

    def finish(self) -> tuple[str, str]:
        return self._hand(*self.split.flush())

    def _hand(self, reasoning: str, text: str) -> tuple[str, str]:
        if reasoning:
            self.t_reasoning = self.t_reasoning or time.perf_counter()
            if self.on_reasoning is not None:
                self.on_reasoning(reasoning)
        if text:
            self.t_text = self.t_text or time.perf_counter()
            if self.on_text is not None:
                self.on_text(text)
        return reasoning, text
