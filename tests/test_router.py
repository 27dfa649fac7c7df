"""The multi-model core (``serve.models.router``) on fake models and faked memory: loads once however many
ask, least recently used idle models go first, a model in use is never unloaded, the wait for room
is bounded, keep-alive 0 unloads, and a model that cannot fit is the pre-flight's error."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from localinfer.errors import ResourceError
from localinfer.serve.models.pool import Want
from localinfer.serve.models.router import Busy, Router


class Fake:
    """A loaded fake model: ``size`` bytes of the faked memory; ``work`` keeps it active."""

    def __init__(self, key: str, size: int) -> None:
        self.key, self.size, self.work, self.stopped = key, size, 0, False
        self.n_ctx_seq = 512


class Machine:
    """Faked memory: ``make`` refuses (as the pre-flight does) a model that does not fit beside the loaded ones."""

    def __init__(self, memory: int, sizes: dict[str, int], load_s: float = 0.0) -> None:
        self.memory, self.sizes, self.load_s = memory, sizes, load_s
        self.loaded: dict[str, Fake] = {}
        self.loads: list[str] = []
        self.lock = threading.Lock()

    def make(self, want: Want) -> Fake:
        time.sleep(self.load_s)
        with self.lock:
            need, free = self.sizes[want.key], self.memory - sum(f.size for f in self.loaded.values())
            if need > free:
                raise ResourceError(f"{want.key} needs {need} bytes, {free} free")
            self.loads.append(want.key)
            fake = self.loaded[want.key] = Fake(want.key, need)
        return fake

    def stop(self, fake: Fake) -> None:
        with self.lock:
            fake.stopped = True
            self.loaded.pop(fake.key, None)

    def router(self, **kw: Any) -> Router:
        return Router(stop=self.stop, active=lambda f: f.work > 0, **kw)


def want(key: str, ctx: int = 512) -> Want:
    return Want(key=key, options={}, sequences=1, ctx_per_seq=ctx)


async def use(router: Router, machine: Machine, key: str, **kw: Any) -> Any:
    slot, _ = await router.acquire(want(key), key, machine.make, **kw)
    return slot


def test_concurrent_first_requests_load_once_and_others_keep_serving():
    m = Machine(100, {"a": 10, "b": 10}, load_s=0.2)

    async def main() -> None:
        r = m.router()
        slot_b = await use(r, m, "b")
        loading = [asyncio.ensure_future(use(r, m, "a")) for _ in range(5)]
        await asyncio.sleep(0.05)  # a loads on its thread: b answers meanwhile
        again = await use(r, m, "b")
        assert again is slot_b and not any(t.done() for t in loading)
        slots = await asyncio.gather(*loading)
        assert len({id(s) for s in slots}) == 1 and slots[0].info.busy == 5

    asyncio.run(main())
    assert m.loads == ["b", "a"]


def test_the_least_recently_used_idle_model_goes_first_and_a_busy_one_never():
    m = Machine(100, {"a": 10, "b": 10, "c": 10})

    async def main() -> None:
        r = m.router(max_models=2)
        a = await use(r, m, "a")
        b = await use(r, m, "b")
        r.release(b)
        await asyncio.sleep(0.01)
        r.release(a)  # a used last: b goes
        c = await use(r, m, "c")
        assert set(r.slots) == {"a", "c"} and "b" not in m.loaded
        waiting = asyncio.ensure_future(use(r, m, "b"))  # a idle, c busy: a goes
        slot_b = await waiting
        assert set(r.slots) == {"b", "c"} and c.info.busy == 1
        third = asyncio.ensure_future(use(r, m, "a"))  # b and c both busy: a waits
        await asyncio.sleep(0.2)
        assert not third.done() and set(r.slots) == {"b", "c"}
        c.held.work = 1
        r.release(c)  # c still has work on its engine: not idle yet
        await asyncio.sleep(0.2)
        assert not third.done()
        r.release(slot_b)
        slot_a = await asyncio.wait_for(third, 5)
        assert set(r.slots) == {"a", "c"} and slot_a.info.busy == 1

    asyncio.run(main())


def test_the_wait_for_room_is_bounded():
    m = Machine(100, {"a": 10, "b": 10})

    async def main() -> None:
        r = m.router(max_models=1, max_queue=2)
        a = await use(r, m, "a")
        waiting = [asyncio.ensure_future(use(r, m, "b")) for _ in range(2)]
        await asyncio.sleep(0.1)
        with pytest.raises(Busy):
            await use(r, m, "b")
        r.release(a)
        slots = await asyncio.gather(*waiting)
        assert slots[0] is slots[1] and list(r.slots) == ["b"] and r.waiting == 0

    asyncio.run(main())


def test_keep_alive_zero_unloads_after_the_request_and_idle_models_expire():
    m = Machine(100, {"a": 10, "b": 10})

    async def main() -> None:
        r = m.router(keep_alive=0.2)
        a = await use(r, m, "a", keep_alive=0)
        b = await use(r, m, "b")
        r.release(a)
        await asyncio.sleep(0.05)
        assert list(r.slots) == ["b"] and a.held.stopped
        r.release(b)
        assert await r.reap() == []
        assert await r.reap(time.monotonic() + 0.3) == ["b"] and not r.slots
        forever = await use(r, m, "a", keep_alive=-1)
        r.release(forever)
        assert await r.reap(time.monotonic() + 1e6) == []

    asyncio.run(main())


def test_the_memory_pre_flight_makes_room_or_refuses():
    m = Machine(100, {"a": 60, "b": 60, "huge": 500})

    async def main() -> None:
        r = m.router()
        a = await use(r, m, "a")
        r.release(a)
        slot_b, notes = await r.acquire(want("b"), "b", m.make)  # a is idle: unloaded to make room
        assert list(r.slots) == ["b"] and any("make room" in n for n in notes)
        other = asyncio.ensure_future(use(r, m, "a"))  # b is busy: a waits for the memory
        await asyncio.sleep(0.2)
        assert not other.done()
        r.release(slot_b)
        await asyncio.wait_for(other, 5)
        r.release(other.result())
        with pytest.raises(ResourceError, match="needs 500 bytes, 100 free"):
            await use(r, m, "huge")
        assert not r.slots  # everything idle was tried, and the refusal names need and free

    asyncio.run(main())


def test_a_larger_context_reloads_when_idle():
    m = Machine(100, {"a": 10})

    async def main() -> None:
        r = m.router()
        first = await use(r, m, "a")
        r.release(first)
        slot, notes = await r.acquire(want("a", ctx=2048), "a", m.make)
        assert slot is not first and first.held.stopped and notes and "2048" in notes[0]
        assert slot.info.ctx_asked == 2048
        r.release(slot)
        small, _ = await r.acquire(want("a", ctx=256), "a", m.make)
        assert small is slot  # a smaller context reuses what is loaded

    asyncio.run(main())


def test_requests_waiting_on_a_failed_load_get_its_error_without_loading_again():
    m = Machine(100, {"huge": 500}, load_s=0.1)

    async def main() -> None:
        r = m.router()
        tries = [asyncio.ensure_future(use(r, m, "huge")) for _ in range(4)]
        results = await asyncio.gather(*tries, return_exceptions=True)
        assert all(isinstance(e, ResourceError) for e in results)

    calls: list[str] = []
    make = m.make
    m.make = lambda want: calls.append(want.key) or make(want)  # type: ignore[method-assign]
    asyncio.run(main())
    assert calls == ["huge"]


def test_a_request_that_takes_a_keep_alive_0_model_before_its_unload_runs_keeps_it():
    m = Machine(100, {"a": 10})

    async def main() -> None:
        r = m.router()
        first = await use(r, m, "a", keep_alive=0)
        r.release(first)  # its unload is scheduled, not run yet
        again = await use(r, m, "a", keep_alive=0)  # takes the slot in that window
        await asyncio.sleep(0.1)
        assert again is first and not again.held.stopped and r.slots["a"] is again
        r.release(again)
        await asyncio.sleep(0.1)
        assert again.held.stopped and not r.slots  # idle now: keep_alive 0 unloads it

    asyncio.run(main())


def test_a_victim_taken_by_a_request_while_others_unload_is_kept():
    m = Machine(100, {"a": 10, "b": 10, "c": 10})

    async def main() -> None:
        r = m.router()
        a, b = await use(r, m, "a"), await use(r, m, "b")
        r.release(a)
        await asyncio.sleep(0.01)
        r.release(b)
        r.max_models = 1  # c's load must unload a, then b (one await each)
        stop = r.stop
        r.stop = lambda held: (time.sleep(0.1), stop(held))  # type: ignore[method-assign]
        loading = asyncio.ensure_future(use(r, m, "c"))
        await asyncio.sleep(0.05)  # a unloads on its thread
        held_b = await use(r, m, "b")  # meanwhile a request takes b
        await asyncio.sleep(0.3)
        assert held_b is b and not b.held.stopped and "b" in r.slots and not loading.done()
        r.release(held_b)
        c = await asyncio.wait_for(loading, 5)
        assert list(r.slots) == ["c"] and b.held.stopped and c.info.busy == 1

    asyncio.run(main())


def test_a_refused_check_unloads_nothing():
    m = Machine(100, {"a": 10, "b": 10})
    checked: list[tuple[str, int]] = []

    def check(w: Want) -> None:
        checked.append((w.key, w.ctx_per_seq))
        raise ResourceError(f"{w.key} with {w.ctx_per_seq} tokens does not fit")

    async def main() -> None:
        r = m.router(max_models=1)
        a = await use(r, m, "a")
        r.release(a)
        with pytest.raises(ResourceError):
            await r.acquire(want("a", ctx=10**8), "a", m.make, check=check)  # a reload
        with pytest.raises(ResourceError):
            await r.acquire(want("b"), "b", m.make, check=check)  # a load that would unload a
        assert r.slots == {"a": a} and not a.held.stopped and m.loads == ["a"]
        same, _ = await r.acquire(want("a"), "a", m.make, check=check)  # loaded as asked: no check
        assert same is a

    asyncio.run(main())
    assert checked == [("a", 10**8), ("b", 512)]
