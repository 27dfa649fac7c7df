"""What `ps` and `stop` ask of the resident server (found, never started), and ps's table."""

from __future__ import annotations

import os
import time
from typing import Any

from localinfer.errors import LocalInferError, ModelNotFoundError

STOP_WAIT_S = 10.0  # `stop --all` returns once the server has exited


def _server() -> tuple[Any, Any]:
    from localinfer import paths
    from localinfer.resident import client
    from localinfer.resident.start import place, unix_sockets

    where = place(paths.data_dir())
    return where, (client.find(where) if unix_sockets() else None)


def ps() -> dict[str, Any]:
    """``{"server": {...} | None, "models": [...]}``: what the server says it holds."""
    where, server = _server()
    if server is None:
        return {"server": None, "models": []}
    status, body = server.call("GET", "/resident/ps")
    if status != 200:
        raise LocalInferError(f"the resident server answered {status} to ps", hint=f"see {where.log}")
    return {"server": {"pid": body["pid"], "rss_bytes": body["rss"], "socket": str(where.socket), "log": str(where.log)},
            "models": body["models"]}  # fmt: skip


def endpoint_ps(ep: Any) -> dict[str, Any]:
    """``ps --endpoint URL``: what a `localinfer serve` (or Ollama) says it has loaded (``/api/ps``),
    in the rows ``table`` prints. ``ep``: the checked ``remote.connection.Endpoint``."""
    from localinfer.remote.connection import httpx, status_error, transport_error

    root = ep.base_url.removesuffix("/v1")
    try:
        response = httpx().get(root + "/api/ps", headers=ep.headers(), timeout=ep.timeout())
    except Exception as exc:
        raise transport_error(exc, ep) from None
    if response.status_code != 200:
        raise status_error(response.status_code, response.content, response.headers, ep, "ps")
    models = []
    for m in response.json().get("models") or []:
        extra = m.get("localinfer") or {}
        models.append({"name": m.get("name"), "size_bytes": int(m.get("size") or 0), "sequences": extra.get("sequences", "-"),
                       "context": m.get("context_length", "-"), "busy": extra.get("busy", 0), "idle_s": extra.get("idle_s"),
                       "keep_alive_s": extra.get("keep_alive_s"), "unloads_in_s": extra.get("unloads_in_s"),
                       "expires_at": m.get("expires_at")})  # fmt: skip
    return {"server": {"endpoint": ep.display}, "models": models}


def stop(name: str | None) -> list[str]:
    """Unload ``name`` (None: every model, and wait for the server to exit); the names unloaded."""
    where, server = _server()
    if server is None:
        if name:
            raise ModelNotFoundError(f"{name} is not resident: no resident server runs")
        return []
    status, body = server.call("POST", "/resident/stop", {"name": name})
    if status != 200:
        raise LocalInferError(f"the resident server answered {status} to stop", hint=f"see {where.log}")
    if name and not body["stopped"]:
        loaded = ", ".join(m["name"] for m in ps()["models"]) or "none"
        raise ModelNotFoundError(f"{name} is not resident (loaded: {loaded})", hint="localinfer ps lists them")
    if not body["left"]:
        _wait_gone(int(body["pid"]))
    return list(body["stopped"])


def _wait_gone(pid: int) -> None:
    """The server exits once nothing is loaded: wait for it, so that `stop` leaves no process."""
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            return
        time.sleep(0.05)


def table(models: list[dict[str, Any]]) -> str:
    from localinfer.resident.place import show_duration
    from localinfer.units import human_bytes

    rows = [("NAME", "SIZE", "SEQUENCES", "CONTEXT", "IDLE", "UNLOADS IN")]
    for m in models:
        until = "forever" if m["unloads_in_s"] is None else ("busy" if m["busy"] else show_duration(m["unloads_in_s"]))
        idle = "busy" if m["busy"] else show_duration(m["idle_s"])
        rows.append((m["name"], human_bytes(m["size_bytes"]), str(m["sequences"]), str(m["context"]),
                     idle, until))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n" for r in rows)
