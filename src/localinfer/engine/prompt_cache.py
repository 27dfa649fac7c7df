"""Idle sequences' KV cells kept in host memory, as llama-server's ``--cache-ram``, per model.

A server's sequences keep what they last held (``slots.SlotTable``), but a sequence taken by a prompt
that shares little with it loses that: one unrelated request between two turns of an agent's
21k-token session (its own title call, a second agent, a subagent) and the next turn evaluated all of
it again. Before such a sequence's cells go, they are copied here (``llama_state_seq_get_data``); a
prompt that shares a longer prefix with an entry than with any idle sequence gets the entry's cells
back (``set_data``) and evaluates only the rest - also a second session with the same system prompt
and tools. Bounded in bytes, least recently used out first. The cells restored are the bytes saved,
so an answer is the same with the cache as without (a prefix reused from an idle sequence is too).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localinfer.engine.slots import common_prefix

if TYPE_CHECKING:
    from localinfer.engine.model import LlamaModel

# A prefix shorter than this is evaluated again sooner than it is copied and looked up (and a chat's
# short turns would churn the cache); the same bound keeps entries that add little to one they extend.
MIN_TOKENS = 256


@dataclass
class Entry:
    tokens: list[int]
    data: bytearray
    used: int


@dataclass
class CacheStats:
    """For /metrics: what the cache holds and what it saved."""

    entries: int = 0
    bytes: int = 0
    hits: int = 0
    tokens_restored: int = 0  # prompt tokens not evaluated thanks to a restore


class PromptCache:
    def __init__(self, model: LlamaModel, limit_bytes: int) -> None:
        self.model = model
        self.limit = max(0, int(limit_bytes))
        self.entries: list[Entry] = []
        self.stats = CacheStats()
        self._clock = 0

    def save(self, seq: int, tokens: Sequence[int]) -> None:
        """Keep the cells of ``seq`` (which hold ``tokens``) before they are dropped."""
        if len(tokens) < MIN_TOKENS or not self.limit:
            return
        for e in self.entries:
            if len(e.tokens) >= len(tokens) and e.tokens[: len(tokens)] == tokens:
                self.touch(e)  # an entry holds all of it already
                return
        data = self.model.save_sequence(seq)
        if not data or len(data) > self.limit:
            return
        tokens = list(tokens)
        # those it extends, and those it holds most of: an agent's next turn shares all of the last one
        # but the answer (re-rendered, it is not the sampled tokens), and each turn kept whole would hold
        # another copy of the same session (agent_session.py: 10 entries, 750 MiB, for one 4k session)
        for e in [e for e in self.entries if common_prefix(e.tokens, tokens, len(e.tokens)) * 5 >= len(e.tokens) * 4]:
            self._remove(e)
        while self.entries and self.stats.bytes + len(data) > self.limit:
            self._remove(min(self.entries, key=lambda e: e.used))
        self.entries.append(Entry(tokens, data, self._tick()))
        self.stats.bytes += len(data)
        self.stats.entries = len(self.entries)

    def longest(self, tokens: Sequence[int], limit: int) -> tuple[Entry | None, int]:
        """The entry sharing the longest prefix with ``tokens`` (at most ``limit``), and its length."""
        best: tuple[Entry | None, int] = (None, 0)
        for e in self.entries:
            n = common_prefix(e.tokens, tokens, limit)
            if n > best[1]:
                best = (e, n)
        return best

    def restore(self, seq: int, entry: Entry, n: int) -> bool:
        """``entry``'s first ``n`` tokens' cells into the empty sequence ``seq``; False: ``seq`` is empty."""
        if not self.model.restore_sequence(seq, entry.data):
            self._remove(entry)  # it will not restore next time either
            return False
        if n < len(entry.tokens) and not self.model.drop_tokens(seq, n):
            self.model.drop_sequence(seq)
            return False
        self.touch(entry)
        self.stats.hits += 1
        self.stats.tokens_restored += n
        return True

    def touch(self, entry: Entry) -> None:
        entry.used = self._tick()

    def _remove(self, entry: Entry) -> None:
        self.entries.remove(entry)
        self.stats.bytes -= len(entry.data)
        self.stats.entries = len(self.entries)

    def _tick(self) -> int:
        self._clock += 1
        return self._clock
