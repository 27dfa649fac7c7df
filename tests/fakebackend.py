"""A scripted backend for tests of CLI logic (simonw/llm's MockModel): each answer is what the test
enqueued, tokens are words, and nothing is loaded or sent. ``fake_backend`` makes every command that
would load a model here (run, chat, batch) get one, after the model is resolved as usual.

    def test_x(fake_backend):
        fake_backend.enqueue(["Hello", " world"])
        CliRunner().invoke(build_app(), ["chat", "-m", smollm2, "--no-log"], input="hi\\n")
        assert fake_backend.requests[0].messages[-1]["content"] == "hi"

The engine keeps its real-model tests; this is for what the commands do around the answer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from localinfer.answer.answer import Answer, BatchResult
from localinfer.backends import Backend
from localinfer.engine.types import GenerationStats
from localinfer.request.request import Request


@dataclass
class Script:
    """What the fake answers next, and what it was asked."""

    answers: list[list[str]] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    n_ctx: int = 4096
    can_chat: bool = True
    reasoning: Any = None  # reasoning.Markers: the answers' pieces are split as a reasoning model's
    opened: bool = False  # the prompt opened the thinking (DeepSeek-R1-Distill's)
    loads: list[dict] = field(default_factory=list)  # backends.load's keywords, one dict per load

    def enqueue(self, pieces: list[str]) -> None:
        self.answers.append(pieces)


DEFAULT = ["An", " answer", " of", " eight", " words", " when", " unscripted", "."]


def _words(request: Request) -> int:
    text = request.raw_text if request.raw_text is not None else " ".join(str(m["content"]) for m in request.messages)
    return max(1, len(text.split()))


class FakeBackend(Backend):
    def __init__(self, script: Script, name: str) -> None:
        self.script, self.name = script, name
        self._cache: list[str] = []  # the words of the last prompt and answer: what a KV cache would hold

    @property
    def can_chat(self) -> bool:
        return self.script.can_chat

    def answer(self, request: Request, on_text: Any = None, *, on_reasoning: Any = None) -> Answer:
        self.script.requests.append(request)
        pieces = self.script.answers.pop(0) if self.script.answers else DEFAULT
        limit = request.max_tokens or request.default_max_tokens
        t0 = time.perf_counter()
        prompt_words = (request.raw_text or " ".join(str(m["content"]) for m in request.messages)).split()
        cached = next((i for i, (a, b) in enumerate(zip(prompt_words, self._cache)) if a != b), min(len(prompt_words), len(self._cache)))
        stats = GenerationStats(prompt_tokens=_words(request), cached_tokens=cached, n_ctx=self.script.n_ctx, finish_reason="stop")
        out = []
        from localinfer.generate.finish import Finish, Text, Thought
        from localinfer.request.reasoning import Splitter

        splits = self.script.reasoning is not None and request.splits_reasoning
        finish = Finish(Splitter(self.script.reasoning, opened=self.script.opened) if splits else None)  # as every surface finishes

        def hand(steps: list) -> None:
            for step in steps:
                to = on_reasoning if isinstance(step, Thought) else on_text if isinstance(step, Text) else None
                if to is not None and step.text:
                    to(step.text)

        for i, piece in enumerate(pieces):
            if limit is not None and i >= limit:
                stats.finish_reason = "length"
                break
            if i == 0:
                stats.first_token_s = time.perf_counter() - t0
            out.append(piece)
            stats.completion_tokens = i + 1
            hand(finish.feed(piece))
        hand(finish.close())
        stats.context_used = stats.prompt_tokens + stats.completion_tokens
        self._cache = prompt_words + "".join(out).split()
        done = finish.result(stats.finish_reason, stats)
        answer = Answer(done.text, self.name, stats, load_s=0.0, ttft_s=stats.first_token_s,
                        total_s=time.perf_counter() - t0, mode=request.mode)  # fmt: skip
        if finish.splits:
            answer.reasoning, answer.reasoning_tokens = done.reasoning, done.reasoning_tokens
            answer.reasoning_ttft_s = None if done.t_reasoning is None else done.t_reasoning - t0
        return answer

    def run_batch(self, items: Any, to_request: Any, parallel: int, *, stats: Any = None) -> Any:
        from localinfer.batch.io import InputError
        from localinfer.errors import UsageError

        for index, item in enumerate(items):
            if isinstance(item, InputError):
                yield BatchResult(index, item.id, item.line, error=item.reason, exc=UsageError(item.reason))
                continue
            self._cache = []  # every request in its own sequence
            yield BatchResult(index, item.id, item.line, self.answer(to_request(item)))


@pytest.fixture
def fake_backend(monkeypatch: pytest.MonkeyPatch) -> Script:
    from localinfer import backends

    script = Script()

    def load(resolved: Any, options: Any, **kw: Any) -> FakeBackend:
        script.loads.append(kw)
        return FakeBackend(script, resolved.name)

    monkeypatch.setattr(backends, "load", load)
    return script
