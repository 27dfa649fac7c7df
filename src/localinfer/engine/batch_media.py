"""A BatchDecoder's sequences whose images are being encoded (issue 41): admitted, given their slot,
but not stepping yet. Their images encode on engine/vision_encode.py's worker while the others keep
decoding; once encoded, the engine thread decodes the prompt's text and image embeddings into the
sequence (``MediaPrompt.decode_seq``) and the slot joins the running ones, its last prompt token
evaluated in the next step as any prompt's.

While a sequence waits, its slot table holds the prefix its cells keep (``SlotTable.hold``): an
idle id between running ones gets its throwaway token after that prefix, not over it.
"""

from __future__ import annotations

import queue
from typing import TYPE_CHECKING

from localinfer.engine.vision_encode import Encoding, ImageEncoder

if TYPE_CHECKING:
    from localinfer.engine.model import LlamaModel
    from localinfer.engine.slots import Slot, SlotTable
    from localinfer.engine.vision import MediaPrompt


class MediaSlots:
    """The waiting slots of one BatchDecoder (``n_parallel`` sequences) and the encoder they share."""

    def __init__(self, model: LlamaModel, n_parallel: int) -> None:
        self.model = model
        self.limit = 2 * n_parallel  # one per slot, and as many cancelled ones the worker has not skipped yet
        self.pending: dict[Slot, Encoding] = {}
        self._encoder: ImageEncoder | None = None

    def admit(self, slot: Slot, table: SlotTable) -> str | None:
        """Start encoding ``slot``'s images (its tokens are a MediaPrompt); an error to end it with, if any."""
        media = media_of(slot)
        cached = media.start_seq(self.model, slot.seq, slot.pos)
        if media.shift:  # M-RoPE: drafts are dropped by position (batch_step._verified), which cells' indices are not
            slot.drafter, slot.stats.draft = None, None
        slot.pos = slot.off = slot.stats.cached_tokens = cached
        slot.stats.image_tokens = media.image_tokens
        table.hold(slot.seq, media[:cached])
        if not media.images_from(cached):  # its images are in the cache: nothing to wait for behind others' encodes
            job = self.pending[slot] = Encoding(media, cached)
            job.done = True
            return None
        if self._encoder is None:
            self._encoder = ImageEncoder(self.limit)
        try:
            self.pending[slot] = self._encoder.submit(media, cached)
        except queue.Full:
            return "too many images are waiting to be encoded"
        return None

    def news(self, table: SlotTable) -> tuple[list[Slot], list[tuple[Slot, str | None]]]:
        """Slots whose images are encoded, now decoded into their sequences (to join the running ones),
        and slots that end: cancelled (error None, finish reason ``interrupted``) or failed."""
        if self._encoder is not None:
            self._encoder.ready.clear()  # before looking: a job done after this sets it again
        joined: list[Slot] = []
        ended: list[tuple[Slot, str | None]] = []
        for slot, job in list(self.pending.items()):
            if slot.cancel is not None and slot.cancel.is_set():
                job.cancelled = True
                slot.stats.finish_reason = "interrupted"
            elif not job.done:
                continue
            del self.pending[slot]
            slot.pos = slot.off = min(slot.pos, table.unhold(slot.seq))  # a filler's drop may have lost the prefix
            if job.cancelled:
                ended.append((slot, None))
                continue
            if job.error is None and slot.pos != job.start:  # its cells were lost meanwhile: encode from 0
                assert self._encoder is not None
                self.pending[slot] = self._encoder.submit(media_of(slot), 0)
                table.hold(slot.seq, [])
                continue
            slot.stats.image_encode_s = job.encode_s
            error = job.error or self._decode(slot, job)
            if error is None:
                joined.append(slot)
            else:
                ended.append((slot, error))
        return joined, ended

    def _decode(self, slot: Slot, job: Encoding) -> str | None:
        try:
            slot.pos = slot.off = media_of(slot).decode_seq(self.model, slot.seq, job.start, job.embds)
            slot.shift = media_of(slot).shift
        except Exception as exc:
            self.model.drop_sequence(slot.seq)  # part of it may be decoded
            slot.pos = slot.off = 0
            return str(exc) or type(exc).__name__
        return None

    def wait(self, timeout: float) -> None:
        """Block until an encode is done or ``timeout`` seconds pass (nothing else to step meanwhile)."""
        if self._encoder is not None:
            self._encoder.ready.wait(timeout)

    def drop_all(self) -> list[Slot]:
        """Forget every waiting slot (the decoder stops): their encodes are skipped or ignored."""
        slots = list(self.pending)
        for job in self.pending.values():
            job.cancelled = True
        self.pending.clear()
        return slots

    def close(self) -> None:
        self.drop_all()
        if self._encoder is not None:
            self._encoder.close()
            self._encoder = None


def media_of(slot: Slot) -> MediaPrompt:
    return slot.job.tokens  # type: ignore[return-value]
