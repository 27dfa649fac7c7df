"""The aggregate figures of a BatchDecoder run (``BatchStats``): what llama-batched-bench reports."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BatchStats:
    """Aggregate figures over a run: what llama-batched-bench reports, measured the same way.

    A *decode-only* step carries no prompt tokens (every token in it is a sequence's next token); its
    time runs from filling the batch to the end of sampling, so it includes our Python overhead.
    """

    steps: int = 0
    decode_only_steps: int = 0
    mixed_steps: int = 0  # steps carrying prompt tokens and other sequences' next tokens together
    filler_tokens: int = 0  # throwaway rows: idle sequences' between busy ones, and a draft's padding
    decode_only_s: float = 0.0
    decode_only_tokens: int = 0  # tokens sampled at the end of decode-only steps
    llama_decode_s: float = 0.0  # inside llama_decode, all steps
    decode_only_llama_s: float = 0.0  # of decode_only_s, inside llama_decode (the rest is sampling and Python)
    prompt_tokens: int = 0  # prompt tokens evaluated
    cached_tokens: int = 0  # prompt tokens a slot already held (keep_cache), not evaluated
    sampled_tokens: int = 0  # all tokens sampled (end-of-generation tokens included)
    max_active: int = 0
    draft_tokens: int = 0  # tokens drafted and verified (speculative decoding), all sequences
    draft_accepted: int = 0  # of those, kept
    extra: dict = field(default_factory=dict)

    @property
    def decode_tps(self) -> float | None:
        """Aggregate decode tokens/s over decode-only steps (llama-batched-bench's S_TG)."""
        if self.decode_only_s <= 0 or self.decode_only_tokens <= 0:
            return None
        return self.decode_only_tokens / self.decode_only_s
