"""A scripted stand-in for the engine's LlamaModel, for CLI tests that are not about a model's output
(simonw/llm's MockModel): tokens are words, the answer and its timings are what the test enqueued,
and nothing is loaded. ``fake_engine`` puts it where ``generate.loading.load`` finds the LlamaModel.

    def test_x(fake_engine):
        fake_engine.enqueue(["Hello", " world"])
        CliRunner().invoke(build_app(), ["run", "-m", smollm2, "-p", "hi"])
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pytest

from localinfer.engine.types import GenerationStats, LoadOptions, SeqJob, Step
from localinfer.request.sampling import SamplingOptions

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}<assistant>"


@dataclass
class Script:
    """What the fake answers next, and how long each token takes."""

    answers: list[list[str]] = field(default_factory=list)
    token_s: float = 0.0
    loads: list[LoadOptions] = field(default_factory=list)
    prompts: list[list[int]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # the prompts, as the fake's words

    def enqueue(self, pieces: list[str]) -> None:
        self.answers.append(pieces)


class FakeModel:
    """The face of engine.model.LlamaModel that generate and the CLI use."""

    script: Script

    def __init__(self, path: object, options: LoadOptions = LoadOptions(), *, meanwhile: object = None) -> None:
        self.script.loads.append(options)
        if meanwhile is not None:  # the real one runs it beside the load
            meanwhile()  # type: ignore[operator]
        self.n_ctx = options.n_ctx or 4096
        self.n_ctx_train = 8192
        self.n_ctx_seq = self.n_ctx
        self.memory_log: tuple[str, ...] = ()
        self.chat_template = TEMPLATE
        self.bos_text, self.eos_text = "", "</s>"
        self.load_s = 0.0
        self._vocab: dict[str, int] = {}
        self._words: list[str] = []

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        out = []
        for word in text.split():
            if word not in self._vocab:
                self._vocab[word] = len(self._words)
                self._words.append(word)
            out.append(self._vocab[word])
        return out or [0]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return " ".join(self._words[t] for t in tokens if t < len(self._words))

    def run(self, job: SeqJob, stats: GenerationStats) -> Iterator[Step]:
        """The engine's one entry for a sequence (engine.single.SingleSequence.run), through ``generate``."""
        return self.generate(job.tokens, job.sampling, stats, max_tokens=job.max_tokens, stop=job.stop,
                             ignore_eos=job.ignore_eos, logprobs=job.logprobs, constraint=job.constraint,
                             constraint_after=job.constraint_after)  # fmt: skip

    def generate(self, prompt: Sequence[int], sampling: SamplingOptions, stats: GenerationStats, *,
                 max_tokens: int | None = None, stop: Sequence[str] = (), ignore_eos: bool = False,
                 logprobs: int | None = None, constraint: object = None, constraint_after: str | None = None,
                 ) -> Iterator[Step]:  # fmt: skip
        self.script.prompts.append(list(prompt))
        self.script.texts.append(self.detokenize(prompt))
        pieces = self.script.answers.pop(0) if self.script.answers else ["ok"]
        t0 = time.perf_counter()
        stats.n_ctx, stats.prompt_tokens, stats.prefill_s = self.n_ctx, len(prompt), 0.001
        stats.finish_reason = "stop"
        try:
            for i, piece in enumerate(pieces):
                if max_tokens is not None and i >= max_tokens:
                    stats.finish_reason = "length"
                    break
                time.sleep(self.script.token_s)
                if i == 0:
                    stats.first_token_s = time.perf_counter() - t0
                stats.completion_tokens = i + 1
                stats.decode_s = time.perf_counter() - t0 - (stats.first_token_s or 0)
                yield Step(piece, i)
        except GeneratorExit:
            stats.finish_reason = "interrupted"
            raise
        finally:
            stats.context_used = len(prompt) + stats.completion_tokens

    def close(self) -> None:
        pass


@pytest.fixture
def fake_engine(monkeypatch: pytest.MonkeyPatch) -> Script:
    from localinfer.engine import model as engine_model

    script = Script()
    fake = type("FakeModel", (FakeModel,), {"script": script})
    monkeypatch.setattr(engine_model, "LlamaModel", fake)
    return script
