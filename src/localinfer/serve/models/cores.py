"""The CPUs that serve's loaded models share with a model loading and with each other (issue 38):
while a load runs, or several models decode at once, each decodes with its share of the CPUs
(never more threads than it was loaded with; alone and with no load, all of them).

A load is llama.cpp reading and repacking weights on the loading thread: one CPU, busy for the
whole load (benchmarks/load_gil.py: the process's CPU time is the loader's, no other thread). A
model decoding with a thread on every CPU then has one thread off a CPU at each step, and llama.cpp's
threads wait for it at every barrier: on 2 CPUs with -t 2, 62 tokens/s fell to 5 while another model
loaded (benchmarks/results/load-gil-2026-12-04.txt). With one thread fewer it keeps most of its speed.
The change is made by the engine's own thread before a decode (``Engine``'s ``on_step``), never
while one runs.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

from localinfer.system.hardware import available_cpus

LOAD_THREADS = 1  # the CPUs a load keeps busy


class Cores:
    """The loads running now and the models decoding now, and the threads each model may decode with
    meanwhile (any thread)."""

    def __init__(self, cpus: int | None = None) -> None:
        self.cpus = cpus or available_cpus()
        self.loads = 0
        self._busy: dict[int, Callable[[], bool]] = {}  # a model's key -> whether it is decoding now
        self._keys = itertools.count()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def loading(self) -> Iterator[None]:
        """Around a load: the loaded models give it its CPU until it ends."""
        with self._lock:
            self.loads += 1
        try:
            yield
        finally:
            with self._lock:
                self.loads -= 1

    def cap(self, threads: int) -> int:
        """The threads a model loaded with ``threads`` decodes with now: all of them unless a load or
        another model decoding shares the CPUs; then its share of the CPUs the loads leave."""
        decoding = sum(1 for busy in list(self._busy.values()) if busy())
        if not self.loads and decoding <= 1:
            return threads
        free = self.cpus - self.loads * LOAD_THREADS
        return max(1, min(threads, free // max(1, decoding)))

    def keeper(self, model: Any, busy: Callable[[], bool]) -> tuple[Callable[[], None], Callable[[], None]]:
        """(keep, leave) for a loaded model: ``keep``, on its engine thread before each decode, sets
        its threads when its share changed; ``leave`` when it is unloaded. ``model``: an
        ``engine.model.LlamaModel``; ``busy``: whether it has requests decoding."""
        full = (model.n_threads, model.n_threads_batch)
        now = list(full)
        key = next(self._keys)
        self._busy[key] = busy

        def keep() -> None:
            wanted = [self.cap(full[0]), self.cap(full[1])]
            if wanted != now:
                model.set_threads(*wanted)
                now[:] = wanted

        return keep, lambda: self._busy.pop(key, None)
