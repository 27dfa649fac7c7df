"""Images encoded off the batch engine's thread: one worker thread runs libmtmd's encoder while the
engine thread keeps stepping the other sequences (ctypes lets go of the GIL during the call).

libmtmd's context is not thread-safe, so its encodes run here only, one at a time, in the order
asked; each image's embeddings are copied out of libmtmd's buffer (the next encode overwrites it).
Decoding them into a sequence stays on the engine thread, which owns the llama context
(``MediaPrompt.decode_seq``, engine/batch_media.py).
"""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING, Any

from localinfer.engine import vision

if TYPE_CHECKING:
    from localinfer.engine.vision import MediaPrompt


class Encoding:
    """One prompt's images to encode (those a sequence holding ``start`` positions lacks). The
    engine thread reads ``done``, then ``embds`` (in order), ``encode_s`` and ``error``; it sets
    ``cancelled`` (the images not yet begun are skipped)."""

    __slots__ = ("media", "start", "embds", "encode_s", "error", "done", "cancelled")

    def __init__(self, media: MediaPrompt, start: int) -> None:
        self.media, self.start = media, start  # the prompt (and its chunks) live while this is held
        self.embds: list[Any] = []
        self.encode_s = 0.0
        self.error: str | None = None
        self.done = self.cancelled = False


class ImageEncoder:
    """The worker: ``submit`` queues a prompt's images (at most ``limit`` waiting: one per slot, and
    as many cancelled ones not yet skipped); ``ready`` is set each time one is done."""

    def __init__(self, limit: int) -> None:
        self._queue: queue.Queue[Encoding | None] = queue.Queue(limit)
        self.ready = threading.Event()
        self._thread: threading.Thread | None = None

    def submit(self, media: MediaPrompt, start: int) -> Encoding:
        """Queue ``media``'s images from position ``start``; ``queue.Full`` when ``limit`` wait already."""
        job = Encoding(media, start)
        self._queue.put_nowait(job)
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="localinfer-image-encode", daemon=True)
            self._thread.start()
        return job

    def close(self) -> None:
        """End the worker once what it is encoding now is done (what waits is skipped)."""
        if self._thread is None:
            return
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancelled = job.done = True
        self._queue.put(None)
        self._thread.join()
        self._thread = None

    def _work(self) -> None:
        while (job := self._queue.get()) is not None:
            try:
                for chunk in job.media.images_from(job.start):
                    if job.cancelled:
                        break
                    embd, spent = vision.encode_copy(job.media.projector, chunk)
                    job.embds.append(embd)
                    job.encode_s += spent
            except Exception as exc:  # the request's error; the worker goes on with the next
                job.error = str(exc) or type(exc).__name__
            finally:
                job.done = True
                self.ready.set()
