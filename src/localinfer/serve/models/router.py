"""The multi-model core that ``serve`` (one pinned model or many) and the resident server share: which models
are loaded; loading one on demand (once, however many ask at once, while the others keep serving);
unloading the least recently used idle one to make room (``max_models``, the memory pre-flight's
``ResourceError``); keep-alive unloads; and a bounded wait when every loaded model is busy.

Plain asyncio on plain values (``serve.models.pool`` decides reloads and victims): the caller's ``make``
loads a model on a thread, ``stop`` unloads it, ``active`` says whether it still has work of its own.
No HTTP here: each front door maps ``Busy`` and ``ResourceError`` to its own answer.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localinfer.serve.models import pool
from localinfer.serve.models.pool import Loaded, Want

POLL_S = 0.05  # a waiting request looks again this often (engines finish work on their own threads)


class Busy(Exception):
    """More requests wait for a model than ``max_queue`` allows (a 503 with Retry-After)."""


@dataclass
class KeptModel:
    """One model the router keeps loaded: ``held`` is what ``make`` returned (an engine, an app and its engine)."""

    info: Loaded
    held: Any
    load_s: float | None = None  # the load that made it, told to the request that asked for it

    @property
    def key(self) -> str:
        return self.info.key


class Router:
    """The loaded models, keyed by ``Want.key`` (the model file); event loop thread only."""

    def __init__(self, *, stop: Callable[[Any], None], active: Callable[[Any], bool] = lambda held: False,
                 max_models: int | None = None, keep_alive: float = 300.0, max_queue: int = 64,
                 say: Callable[[str], None] = lambda message: None) -> None:  # fmt: skip
        self.slots: dict[str, KeptModel] = {}
        self.stop, self.active, self.say = stop, active, say
        self.max_models, self.keep_alive, self.max_queue = max_models, keep_alive, max_queue
        self.waiting = 0  # requests waiting for room (bounded by max_queue)
        self._loading: dict[str, asyncio.Future[None]] = {}
        self._changed: asyncio.Event | None = None

    # -- using a model -------------------------------------------------------------------------------
    async def acquire(self, want: Want, name: str, make: Callable[[Want], Any], *, keep_alive: float | None = None,
                      check: Callable[[Want], None] | None = None) -> tuple[KeptModel, list[str]]:  # fmt: skip
        """The slot that answers ``want``, held (``release`` it): loaded or reloaded by ``make`` on a
        thread when needed, after unloading idle models to make room. ``Busy`` when the wait for room
        is full; the pre-flight's ``ResourceError`` when the model cannot fit even alone. ``check``
        (on a thread, before anything is unloaded for this load) raises when the load cannot happen."""
        notes: list[str] = []
        waited = checked = False
        try:
            while True:
                slot = self.slots.get(want.key)
                needs = slot is None or pool.reload_reason(slot.info, want) is not None
                if needs and check is not None and not checked and want.key not in self._loading:
                    grown = pool.grown(slot.info, want) if slot is not None else want
                    await asyncio.to_thread(check, grown)  # a refusal unloads nothing
                    checked = True
                    continue  # the slots may have changed meanwhile: look again
                if slot is not None:
                    reason = pool.reload_reason(slot.info, want)
                    if reason is None:
                        break
                    if not self.busy(slot):
                        notes.append(f"reloading {name}: {reason}")
                        want = pool.grown(slot.info, want)
                        await self._unload(slot, "reloaded")
                        continue
                elif want.key in self._loading:
                    await asyncio.shield(self._loading[want.key])
                    continue
                else:
                    victims = self._room()
                    if victims is not None:
                        slot = await self._load(want, name, make, victims, notes)
                        if slot is not None:
                            break
                if not waited:
                    if self.waiting >= self.max_queue:
                        raise Busy(f"{self.waiting} requests wait for a model to load")
                    self.waiting, waited = self.waiting + 1, True
                await self._wait()
        finally:
            if waited:
                self.waiting -= 1
        self.hold(slot)
        slot.info.keep_alive = self._seconds(self.keep_alive if keep_alive is None else keep_alive)
        return slot, notes

    def hold(self, slot: KeptModel) -> None:
        slot.info.busy += 1
        slot.info.last_used = time.monotonic()

    def release(self, slot: KeptModel) -> None:
        """A request on ``slot`` ended: its idle time starts now (``keep_alive`` 0: unload it)."""
        slot.info.busy -= 1
        slot.info.last_used = time.monotonic()
        if slot.info.busy == 0 and slot.info.keep_alive == 0 and self.slots.get(slot.key) is slot:
            asyncio.ensure_future(self._unload_idle(slot, "keep_alive 0"))
        self._notify()

    async def _unload_idle(self, slot: KeptModel, why: str) -> None:
        """Unload ``slot`` if it is still idle with keep_alive 0 when this runs: a request may have
        taken it between ``release`` and now, and must not be left with a stopped engine."""
        if not self.busy(slot) and slot.info.keep_alive == 0 and slot.key not in self._loading:
            await self._unload(slot, why)

    @property
    def loading(self) -> int:
        return len(self._loading)

    def busy(self, slot: KeptModel) -> bool:
        return slot.info.busy > 0 or bool(self.active(slot.held))

    def find(self, name_or_key: str) -> KeptModel | None:
        return next((s for s in self.slots.values() if name_or_key in (s.info.name, s.key)), None)

    # -- loading and unloading ---------------------------------------------------------------------------
    def _room(self) -> list[KeptModel] | None:
        """The idle models to unload so one more fits under ``max_models`` (None: wait, all busy)."""
        if self.max_models is None:
            return []
        infos = [s.info for s in self.slots.values() if not self.active(s.held)]
        busy = len(self.slots) - len(infos)
        limit = self.max_models - busy - len(self._loading)  # loads under way count as loaded
        if limit < 1:
            return None
        chosen = pool.victims(infos, max_models=limit, adding=True)
        if len(infos) - len(chosen) + 1 > limit:
            return None
        return [self.slots[v.key] for v in chosen]

    async def _load(self, want: Want, name: str, make: Callable[[Want], Any], victims: list[KeptModel],
                    notes: list[str]) -> KeptModel | None:  # fmt: skip
        """Load ``want`` (marked as loading before the first await); None when the pre-flight says
        it does not fit while busy models hold the memory (the caller waits and asks again)."""
        from localinfer.errors import ResourceError

        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._loading[want.key] = done
        try:
            for old in victims:
                if self.busy(old):  # taken by a request since it was chosen (an await ago): kept; wait, look again
                    return None
                notes.append(f"unloaded {old.info.name} to keep at most {self.max_models} model(s) loaded")
                await self._unload(old, "--max-models")
            while True:
                try:
                    t0 = time.perf_counter()
                    held = await asyncio.to_thread(make, want)
                    break
                except ResourceError:
                    idle = [s for s in self.slots.values() if not self.busy(s)]
                    if not idle:
                        if self.slots:  # busy models hold the memory: wait for one to go idle
                            return None
                        raise
                    old = min(idle, key=lambda s: s.info.last_used)
                    notes.append(f"unloaded {old.info.name} to make room for {name}")
                    await self._unload(old, f"room for {name}")
            return self.adopt(want, name, held, load_s=time.perf_counter() - t0)
        except Exception as exc:  # the requests waiting on this load get its error, not a load each
            done.set_exception(exc)
            done.exception()  # retrieved: no "never retrieved" warning when nobody waited
            raise
        finally:
            del self._loading[want.key]
            if not done.done():
                done.set_result(None)
            self._notify()

    def adopt(self, want: Want, name: str, held: Any, *, load_s: float | None = None,
              n_ctx_seq: int | None = None) -> KeptModel:  # fmt: skip
        """A model loaded elsewhere (a preload), kept from now on."""
        n_ctx = n_ctx_seq or getattr(held, "n_ctx_seq", want.ctx_per_seq)
        info = Loaded(want.key, name, want.options, want.sequences, want.ctx_per_seq, n_ctx,
                      keep_alive=self._seconds(self.keep_alive), last_used=time.monotonic())  # fmt: skip
        slot = KeptModel(info, held, load_s)
        self.slots[want.key] = slot
        return slot

    async def _unload(self, slot: KeptModel, why: str) -> None:
        if self.slots.get(slot.key) is not slot:
            return
        del self.slots[slot.key]  # gone at once: counts and lookups see it so before the engine stops
        await asyncio.to_thread(self.stop, slot.held)
        self.say(f"unloaded {slot.info.name} ({why})")
        self._notify()

    async def unload(self, name: str | None, why: str = "stop") -> list[str]:
        """Unload the model ``name`` (its name or file), or every model (None)."""
        chosen = [s for s in list(self.slots.values()) if name is None or name in (s.info.name, s.key)]
        for slot in chosen:
            await self._unload(slot, why)
        return [s.info.name for s in chosen]

    async def reap(self, now: float | None = None) -> list[str]:
        """Unload the models idle past their keep-alive (a model still working is not idle)."""
        now = time.monotonic() if now is None else now
        for slot in self.slots.values():
            if slot.info.busy == 0 and self.active(slot.held):
                slot.info.last_used = now
        gone = []
        for info in pool.expired([s.info for s in self.slots.values()], now):
            slot = self.slots.get(info.key)  # an earlier unload's await may have let it go already
            if slot is not None and slot.info is info and not self.busy(slot) and info.key not in self._loading:
                gone.append(info.name)
                await self._unload(slot, f"idle for {info.keep_alive:g} s")
        return gone

    def stop_all(self) -> None:
        """At exit (no loop needed): stop every model."""
        for slot in list(self.slots.values()):
            self.slots.pop(slot.key, None)
            self.stop(slot.held)

    # -- waiting ---------------------------------------------------------------------------------------
    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def _wait(self) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        try:
            await asyncio.wait_for(self._changed.wait(), POLL_S)
        except asyncio.TimeoutError:
            pass

    @staticmethod
    def _seconds(keep_alive: float) -> float:
        return math.inf if keep_alive < 0 else float(keep_alive)
