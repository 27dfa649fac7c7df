"""From the engine thread to the event loop: each request's text pieces and its outcome.

The engine thread only appends to a deque and, once per step, asks the loop to wake
(``call_soon_threadsafe``): one wake-up carries every piece of the step, for every request, so the
loop's work grows with the steps, not with the tokens. With ``deferred``, the engine says when
(``flush``, just before ``llama_decode``): the loop then runs while the engine thread waits in C
without the GIL, instead of taking the GIL from it between two sequences' sampling.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Hub:
    """Wakes the channels that have something new, in one loop callback per burst."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, deferred: bool = False) -> None:
        self._loop = loop
        self._ready: collections.deque[Channel] = collections.deque()
        self._scheduled = False
        self.deferred = deferred  # the producer calls flush() itself

    def notify(self, channel: Channel) -> None:
        """Any thread: ``channel`` has news (the loop hears of it now, or at the next ``flush``)."""
        self._ready.append(channel)
        if not self.deferred:
            self.flush()

    def flush(self) -> None:
        """Wake the loop if anything is ready (one wake-up, however many channels)."""
        if self._ready and not self._scheduled:
            self._scheduled = True
            try:
                self._loop.call_soon_threadsafe(self._wake)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass

    def _wake(self) -> None:
        self._scheduled = False  # before draining: a notify racing with us schedules another wake-up
        ready = self._ready
        while ready:
            ready.popleft().event.set()


class Channel(Generic[T]):
    """One request's pieces of text (or its steps: ``localinfer.generate.finish``), then its end value
    (``T``: the engine's Ended)."""

    def __init__(self, hub: Hub) -> None:
        self._hub = hub
        self._pieces: collections.deque[Any] = collections.deque()  # text, steps, or (text, entries)
        self._end: T | None = None
        self.event = asyncio.Event()
        self.total = 0  # the prompt's tokens (set by whoever submits it)
        self.prompt: tuple[int, int, float] | None = None  # the latest news of the prompt: cached, evaluated, when
        self._admitted = 0.0
        self._prompt_news = False

    # engine thread
    def push(self, text: str) -> None:
        self._pieces.append(text)
        self._hub.notify(self)

    def push_steps(self, steps: list) -> None:
        """An answer's typed steps (read with ``get_steps``)."""
        self._pieces.extend(steps)
        self._hub.notify(self)

    def push_logprobs(self, text: str, entries: list) -> None:
        """A piece with its tokens' log probabilities, in one append (read with ``get_logprobs``)."""
        self._pieces.append((text, entries))
        self._hub.notify(self)

    def push_prompt(self, cached: int, evaluated: int) -> None:
        """The prompt's progress (``SeqJob.on_prompt``): only the latest is kept (read with ``take_prompt``)."""
        now = time.perf_counter()
        if self.prompt is None:
            self._admitted = now
        self.prompt, self._prompt_news = (cached, evaluated, now - self._admitted), True
        self._hub.notify(self)

    def close(self, end: T) -> None:
        self._end = end
        self._hub.notify(self)

    # event loop
    async def get(self) -> tuple[str, T | None]:
        """What came since the last call, joined, and the end value once there is one."""
        await self.event.wait()
        self.event.clear()  # before reading: a piece that comes now sets it again
        end = self._end  # before the pieces: every piece pushed before the end is then in the deque
        pieces = self._pieces
        text = pieces.popleft() if len(pieces) == 1 else "".join(pieces.popleft() for _ in range(len(pieces)))
        return text, end

    async def get_steps(self) -> tuple[list, T | None]:
        """``get`` for a channel fed by ``push_steps``: the steps that came since, in order."""
        await self.event.wait()
        self.event.clear()
        end = self._end
        pieces = self._pieces
        return [pieces.popleft() for _ in range(len(pieces))], end

    async def get_logprobs(self) -> tuple[str, list, T | None]:
        """``get`` for a channel fed by ``push_logprobs``: the text and its entries, in order."""
        await self.event.wait()
        self.event.clear()
        end = self._end
        pieces = self._pieces
        items = [pieces.popleft() for _ in range(len(pieces))]
        return "".join(t for t, _ in items), [e for _, es in items for e in es], end

    def take_prompt(self) -> tuple[int, int, float] | None:
        """Event loop: the prompt's news since the last call (cached, evaluated, seconds since admission), or None."""
        if not self._prompt_news:
            return None
        self._prompt_news = False
        return self.prompt

    def has_answer(self) -> bool:
        """Event loop: a piece of the answer or its end is waiting (not only the prompt's news)."""
        return bool(self._pieces) or self._end is not None

    def wake(self) -> None:
        """Event loop: make a waiting ``get`` return (the client went away)."""
        self.event.set()
