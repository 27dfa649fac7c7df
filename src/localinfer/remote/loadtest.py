"""`bench --endpoint`: realistic traffic against a server, as vLLM's ``bench serve`` makes it.

Requests arrive as a Poisson process at ``rate`` per second (gamma-distributed gaps when
``burstiness`` != 1: below 1 burstier, above 1 more even; ``inf``: all at once), optionally at most
``max_concurrency`` in flight. Prompts are random words (about one token each; the server's usage
says how many tokens they really were) or the lines of a JSONL dataset. Each request streams; the
client measures TTFT, ITL and E2EL (see ``remote.metrics``). The server's own counters
(``/metrics``, Prometheus) are read before and after, when it has them, to compare with.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localinfer.errors import UsageError

if TYPE_CHECKING:
    from localinfer.remote.connection import Endpoint

# Short common English words: in the BPE vocabularies of the models we serve each is one token
# after a space, so N words are about N prompt tokens.
_WORDS = (
    "the of and to in is was for that with as on by at from his her they this had not are but which "
    "have one you were all she there their been has when who will more would if out so said what up its "
    "about into than them can only other new some time could these two may then first any like now my "
    "over such our man me even most made after also did many before must through back years where much "
    "your way well down should because each just those people how too little state good very make world "
    "still own see men work long get here between both life being under never day same another know while "
    "last might us great old year off come since against go came right used take three"
).split()


@dataclass(frozen=True)
class Sample:
    """One request of the test: a prompt (or messages) and how many tokens to ask for."""

    messages: tuple[dict[str, str], ...]
    prompt_len: int | None  # what we aimed for (words); the server's usage says what it was
    output_len: int | None


@dataclass
class RequestOutput:
    """One request as measured (vLLM's RequestFuncOutput; seconds)."""

    success: bool = False
    start: float = 0.0  # perf_counter when it was sent
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0  # sent -> the stream ended (E2EL)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    queue_s: float = 0.0  # waited for --max-concurrency before being sent
    error: str | None = None
    server_timings: dict[str, Any] | None = None


def random_samples(n: int, input_len: int, output_len: int, seed: int) -> list[Sample]:
    """``n`` prompts of ``input_len`` random words, each asking for ``output_len`` tokens."""
    rng = random.Random(seed)
    return [
        Sample(({"role": "user", "content": " ".join(rng.choices(_WORDS, k=input_len))},), input_len, output_len)
        for _ in range(n)
    ]


def dataset_samples(path: Path, n: int, output_len: int | None, seed: int) -> list[Sample]:
    """``n`` requests from a JSONL file: ``{"prompt": ...}`` or ``{"messages": [...]}``, with an optional
    ``max_tokens`` (or ``output_len``); fewer lines than ``n`` are cycled, in a shuffled order."""
    try:
        lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    except OSError as exc:
        raise UsageError(f"cannot read --dataset {path}: {exc.strerror or exc}") from None
    pool: list[Sample] = []
    for number, line in enumerate(lines, 1):
        try:
            obj = json.loads(line)
        except ValueError:
            raise UsageError(f"--dataset {path}: line {number} is not JSON") from None
        pool.append(_sample(obj, output_len, f"--dataset {path}: line {number}"))
    if not pool:
        raise UsageError(f"--dataset {path} has no requests")
    rng = random.Random(seed)
    order = [pool[i % len(pool)] for i in range(n)]
    rng.shuffle(order)
    return order


def _sample(obj: Any, output_len: int | None, where: str) -> Sample:
    if not isinstance(obj, dict):
        raise UsageError(f"{where} must be a JSON object")
    if isinstance(obj.get("prompt"), str):
        messages: tuple[dict[str, str], ...] = ({"role": "user", "content": obj["prompt"]},)
    elif isinstance(obj.get("messages"), list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in obj["messages"]
    ):
        messages = tuple({"role": m["role"], "content": m["content"]} for m in obj["messages"])
    else:
        raise UsageError(f"{where} needs a string 'prompt' or 'messages' with string roles and contents")
    out = obj.get("max_tokens", obj.get("output_len", output_len))
    if out is not None and (not isinstance(out, int) or isinstance(out, bool) or out < 1):
        raise UsageError(f"{where}: 'max_tokens' must be a whole number >= 1")
    return Sample(messages, None, out)


def arrival_offsets(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """When each request is sent, in seconds from the start (vLLM's ``get_request``): gaps drawn from
    a gamma distribution of shape ``burstiness`` and mean 1/rate (exponential when it is 1), then
    scaled so the last request leaves at n/rate, which keeps the offered rate exact whatever the seed."""
    if rate == math.inf:
        return [0.0] * n
    rng = random.Random(seed)
    theta = 1.0 / (rate * burstiness)
    offsets, t = [], 0.0
    for _ in range(n):
        t += rng.gammavariate(burstiness, theta)
        offsets.append(t)
    if offsets and offsets[-1] > 0:
        scale = (n / rate) / offsets[-1]
        offsets = [o * scale for o in offsets]
    return offsets


def body_for(model: str, sample: Sample, *, ignore_eos: bool, temperature: float) -> dict[str, Any]:
    from localinfer.request.sampling import SamplingOptions
    from localinfer.remote.client import request_body

    return request_body(model, messages=sample.messages, sampling=SamplingOptions(temperature=temperature),
                        max_tokens=sample.output_len, ignore_eos=ignore_eos and sample.output_len is not None)  # fmt: skip


async def _one(send: Any, body: dict[str, Any], gate: asyncio.Semaphore | None, arrived: float) -> RequestOutput:
    from localinfer.errors import LocalInferError

    if gate is not None:
        await gate.acquire()
    out = RequestOutput(start=time.perf_counter())
    out.queue_s = out.start - arrived
    try:
        o = await send(body)
    except LocalInferError as exc:
        out.error, out.latency = str(exc), time.perf_counter() - out.start
    else:
        out.success, out.start, out.ttft, out.itl, out.latency = True, o.t_start, o.ttft_s, o.itl, o.total_s
        out.prompt_tokens, out.output_tokens, out.server_timings = o.prompt_tokens, o.completion_tokens, o.server_timings
    finally:
        if gate is not None:
            gate.release()
    return out


async def _drive(ep: Endpoint, bodies: list[dict[str, Any]], offsets: list[float], max_concurrency: int | None,
                 progress: Any = None) -> tuple[list[RequestOutput], float]:  # fmt: skip
    """Send ``bodies[i]`` at ``offsets[i]``; every output, and the wall time from the first send."""
    from localinfer.remote import fastclient
    from localinfer.remote.client import astream
    from localinfer.remote.connection import httpx

    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    if fastclient.usable(ep):
        pool = fastclient.Pool(ep)
        try:
            return await _send_all(pool.stream, bodies, offsets, gate, progress)
        finally:
            await pool.close()
    h = httpx()
    limit = max_concurrency or len(bodies)
    limits = h.Limits(max_connections=limit, max_keepalive_connections=limit)
    async with h.AsyncClient(timeout=ep.timeout(), headers=ep.headers(), limits=limits) as http:
        return await _send_all(lambda body: astream(http, ep, body), bodies, offsets, gate, progress)


async def _send_all(send: Any, bodies: list[dict[str, Any]], offsets: list[float], gate: asyncio.Semaphore | None,
                    progress: Any) -> tuple[list[RequestOutput], float]:  # fmt: skip
    tasks: list[asyncio.Task[RequestOutput]] = []
    t0 = time.perf_counter()
    for body, offset in zip(bodies, offsets):
        delay = t0 + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(_one(send, body, gate, time.perf_counter()))
        if progress is not None:
            task.add_done_callback(lambda _t: progress())
        tasks.append(task)
    outputs = await asyncio.gather(*tasks)
    return list(outputs), time.perf_counter() - t0


def drive(ep: Endpoint, bodies: list[dict[str, Any]], offsets: list[float], max_concurrency: int | None,
          progress: Any = None) -> tuple[list[RequestOutput], float]:  # fmt: skip
    """Run the traffic (blocking): outputs in request order, and the test's duration."""
    _raise_open_files(max_concurrency or len(bodies))
    return asyncio.run(_drive(ep, bodies, offsets, max_concurrency, progress))


def _raise_open_files(connections: int) -> None:
    """Every request in flight holds a socket: lift the soft limit on open files (often 1024) toward
    the hard one, so a test at rate inf does not fail on the client's own limit."""
    try:
        import resource
    except ImportError:  # Windows: no such limit to lift
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = connections + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass


def scrape_metrics(ep: Endpoint) -> dict[str, float] | None:
    """The server's Prometheus counters (``/metrics`` beside ``/v1``), or None when it has none."""
    from localinfer.remote.connection import httpx

    base = ep.base_url.removesuffix("/v1")
    try:
        r = httpx().get(base + "/metrics", headers=ep.headers(), timeout=5.0)
    except Exception:  # a server without metrics is normal
        return None
    if r.status_code != 200:
        return None
    out: dict[str, float] = {}
    for line in r.text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name.split("{")[0].strip()] = float(value)
        except ValueError:
            continue
    return out or None


def metrics_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    """What the server's counters (``*_total``) grew by during the test."""
    if not before or not after:
        return None
    return {k: after[k] - before.get(k, 0.0) for k in sorted(after) if k.endswith("_total")}
