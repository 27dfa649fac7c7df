"""The sampler settings a request asks for (temperature, top-k/p, min-p, penalties, seed);
the engine builds its sampler chain from them. Defaults: llama.cpp's (``defaults.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from localinfer.request import defaults


@dataclass(frozen=True)
class SamplingOptions:
    """Sampler chain settings; defaults follow llama.cpp's."""

    temperature: float = defaults.temperature
    top_k: int = defaults.top_k
    top_p: float = defaults.top_p
    min_p: float = defaults.min_p
    repeat_penalty: float = defaults.repeat_penalty
    repeat_last_n: int = defaults.repeat_last_n
    frequency_penalty: float = 0.0  # OpenAI's penalties, over the same last_n window; 0 = off
    presence_penalty: float = 0.0
    seed: int | None = None  # None: a random seed each request

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0
