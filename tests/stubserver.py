"""A tiny OpenAI-compatible server on 127.0.0.1 for the --endpoint tests and the load generator's floor:
raw asyncio HTTP/1.1 (keep-alive), so it costs next to nothing per request, and scripted faults.

    with StubServer(tokens=4) as stub:            # stub.url == "http://127.0.0.1:PORT/v1"
        stub.plan.extend(["429", "ok"])          # the next requests' behaviours, in order
        stub.by_prompt["boom"] = ["die", "ok"]   # requests whose prompt contains "boom"

Behaviours: ok (stream ``tokens`` chunks, then usage and [DONE]), 401, 404, 429 and 503 (with
Retry-After: ``retry_after``), 400, 500, die (two chunks, then the connection closes), hang (no answer
until the client gives up), malformed (an event that is not JSON), nousage (no usage chunk), cut
(half an event, then close), json (a whole non-streamed completion).
"""

from __future__ import annotations

import asyncio
import collections
import json
import threading
import time
from typing import Any


class StubServer:
    def __init__(self, tokens: int = 4, first_delay: float = 0.0, token_delay: float = 0.0, retry_after: str = "1",
                 model: str = "stub-model") -> None:  # fmt: skip
        self.tokens, self.first_delay, self.token_delay = tokens, first_delay, token_delay
        self.retry_after, self.model = retry_after, model
        self.plan: collections.deque[str] = collections.deque()
        self.by_prompt: dict[str, list[str]] = {}
        self.requests = 0  # chat/completion requests received
        self.bodies: list[dict[str, Any]] = []
        # last message -> (perf_counter when the request was read, when its first token was written)
        self.timeline: dict[str, tuple[float, float]] = {}
        self.keep_bodies = True
        self.last_headers: dict[str, str] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> StubServer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5)

    def _serve(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._conn, "127.0.0.1", 0, backlog=1024)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()

    def _behaviour(self, body: dict[str, Any]) -> str:
        text = json.dumps(body.get("messages") or body.get("prompt") or "")
        for key, plan in self.by_prompt.items():
            if key in text and plan:
                return plan.pop(0) if len(plan) > 1 else plan[0]
        return self.plan.popleft() if self.plan else "ok"

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                raw = await reader.readexactly(int(headers.get("content-length", "0")))
                self._t_recv = time.perf_counter()
                self.last_headers = headers
                if not await self._route(method, path, raw, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def _route(self, method: str, path: str, raw: bytes, w: asyncio.StreamWriter) -> bool:
        if method == "GET" and path == "/timeline":  # for a load generator in another process (same clock)
            return await self._json(w, 200, {k: list(v) for k, v in self.timeline.items()})
        if method == "GET" and path.endswith("/models"):
            return await self._json(w, 200, {"object": "list", "data": [{"id": self.model, "object": "model"}]})
        if method != "POST" or not path.endswith("completions"):
            return await self._json(w, 404, {"error": {"message": f"no route {path}"}})
        body = json.loads(raw)
        self.requests += 1
        if self.keep_bodies:
            self.bodies.append(body)
        b = self._behaviour(body)
        if b in ("400", "401", "404", "500"):
            return await self._json(w, int(b), {"error": {"message": f"stub says {b}"}})
        if b in ("429", "503"):
            return await self._json(w, int(b), {"error": {"message": "busy"}}, {"Retry-After": self.retry_after})
        if b == "hang":
            await asyncio.sleep(3600)
            return False
        if b == "json":
            msg = {"role": "assistant", "content": self._text(body)}
            return await self._json(w, 200, {"object": "chat.completion", "model": self.model, "choices": [
                {"index": 0, "message": msg, "finish_reason": "stop"}], "usage": self._usage(body)})  # fmt: skip
        return await self._stream(w, body, b)

    def _text(self, body: dict[str, Any]) -> str:
        return "".join(self._pieces(body))

    def _pieces(self, body: dict[str, Any]) -> list[str]:
        n = body.get("max_tokens") or self.tokens
        return [f"t{i} " for i in range(n)]

    def _usage(self, body: dict[str, Any]) -> dict[str, int]:
        text = json.dumps(body.get("messages") or body.get("prompt") or "")
        n = body.get("max_tokens") or self.tokens
        return {"prompt_tokens": len(text.split()), "completion_tokens": n, "total_tokens": len(text.split()) + n}

    async def _stream(self, w: asyncio.StreamWriter, body: dict[str, Any], b: str) -> bool:
        t_recv = self._t_recv
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        if self.first_delay:
            await asyncio.sleep(self.first_delay)
        if b == "malformed":
            await self._chunk(w, b"data: {this is not json\n\n")
            await self._chunk(w, b"")
            return True
        for i, piece in enumerate(self._pieces(body)):
            if i and self.token_delay:
                await asyncio.sleep(self.token_delay)
            if b == "die" and i == 2:
                w.transport.abort()
                return False
            event = {"object": "chat.completion.chunk", "model": self.model,
                     "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}  # fmt: skip
            if b == "cut" and i == 1:
                await self._chunk(w, b'data: {"choices": [')
                w.transport.abort()
                return False
            await self._chunk(w, b"data: " + json.dumps(event).encode() + b"\n\n")
            if i == 0 and body.get("messages"):
                self.timeline[body["messages"][-1]["content"]] = (t_recv, time.perf_counter())
        end = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
        out = b"data: " + json.dumps(end).encode() + b"\n\n"
        if b != "nousage":
            out += b"data: " + json.dumps({"choices": [], "usage": self._usage(body)}).encode() + b"\n\n"
        await self._chunk(w, out + b"data: [DONE]\n\n")
        await self._chunk(w, b"")
        return True

    async def _chunk(self, w: asyncio.StreamWriter, data: bytes) -> None:
        w.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        await w.drain()

    async def _json(self, w: asyncio.StreamWriter, status: int, obj: Any, extra: dict[str, str] | None = None) -> bool:
        data = json.dumps(obj).encode()
        head = f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in (extra or {}).items())
        w.write(head.encode() + b"\r\n" + data)
        await w.drain()
        return True


def main() -> None:
    """``python tests/stubserver.py [--tokens N] [--first-delay S] [--token-delay S]``: serve until
    killed; prints the base URL on its first line."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--first-delay", type=float, default=0.0)
    parser.add_argument("--token-delay", type=float, default=0.0)
    args = parser.parse_args()
    with StubServer(tokens=args.tokens, first_delay=args.first_delay, token_delay=args.token_delay) as stub:
        stub.keep_bodies = False
        print(stub.url, flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
