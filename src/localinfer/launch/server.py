"""The `serve` that `launch` uses: one given with --endpoint, the one an earlier launch started
(``launch/server.json`` in the data folder: its URL, pid and this boot), else a new one started in
the background (detached, logging to ``launch/serve.log``) and left running for the next launch,
until `localinfer stop`.

It serves every installed model (``--map-model '*=MODEL'`` answers the names agents invent), one
sequence at a time with the context agents need, and keeps a model loaded for ``KEEP_ALIVE`` idle.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from localinfer.errors import LocalInferError

KEEP_ALIVE = "30m"  # an agent's turns are minutes apart: the model and its prompt cache stay loaded between them
START_TIMEOUT_S = 60.0  # for the port to be bound (the model itself loads after: see preload)
LOAD_TIMEOUT_S = 600.0
_LISTENING = re.compile(r"listening on (http://(?:\[[^\]]*\]|[^\s:/]+):\d+)")


def folder() -> Path:
    from localinfer import paths

    return paths.data_dir() / "launch"


def _record() -> Path:
    return folder() / "server.json"


def healthy(url: str, timeout_s: float = 1.0) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout_s) as response:  # noqa: S310 - our own server
            return response.status == 200
    except Exception:
        return False


def running() -> dict[str, Any] | None:
    """The server an earlier launch started, when it is still ours and answers; None otherwise."""
    try:
        info = json.loads(_record().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or not _ours(info) or not healthy(str(info.get("url"))):
        return None
    return info


def _ours(info: dict[str, Any]) -> bool:
    """The recorded pid is still that serve: same boot (a pid is reused after a restart), alive, and
    (where /proc tells) running `localinfer serve`: `stop` never signals a stranger."""
    from localinfer.paths import boot_id

    pid = info.get("pid")
    if not isinstance(pid, int) or pid <= 0 or info.get("boot") != boot_id():
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True
    return b"localinfer" in cmdline and b"serve" in cmdline


def start(model: str, ctx: int, n_predict: int, say: Any) -> dict[str, Any]:
    """A background `serve` (every installed model, ``model`` answering unknown names, ``ctx`` per
    sequence, ``n_predict``: the cap of an answer whose request names none), once it answers /health
    and ``model`` is loaded; recorded for the next launch."""
    import fcntl
    import subprocess

    where = folder()
    where.mkdir(parents=True, exist_ok=True)
    with open(where / "lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two launches at once start one server
        info = running()
        if info is not None:
            return info
        log = where / "serve.log"
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        offset = os.lseek(fd, 0, os.SEEK_END)
        cmd = [sys.executable, "-m", "localinfer", "serve", "--port", "0", "-np", "1", "-c", str(ctx), "--keep-alive", KEEP_ALIVE,
               "--map-model", f"*={model}", "--drain-timeout", "5", "--n-predict", str(n_predict)]  # fmt: skip
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, start_new_session=True, cwd=os.sep)
        finally:
            os.close(fd)
        say(f"starting localinfer serve in the background (log: {log})")
        url = _wait_listening(proc, log, offset)
        from localinfer.paths import boot_id

        info = {"url": url, "pid": proc.pid, "boot": boot_id(), "log": str(log), "model": model, "ctx": ctx, "n_predict": n_predict}
        _record().write_text(json.dumps(info) + "\n", encoding="utf-8")
    return info


def _wait_listening(proc: Any, log: Path, offset: int) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        text = _tail(log, offset)
        m = _LISTENING.search(text)
        if m and healthy(m.group(1)):
            return m.group(1)
        if proc.poll() is not None:
            last = [ln for ln in text.splitlines() if ln.strip()][-1:] or [f"it exited with status {proc.returncode}"]
            raise LocalInferError(f"localinfer serve did not start: {last[0].strip()}", hint=f"see {log}")
        if time.monotonic() > deadline:
            proc.terminate()
            raise LocalInferError(f"localinfer serve did not answer within {START_TIMEOUT_S:.0f} s", hint=f"see {log}")
        time.sleep(0.05)


def _tail(log: Path, offset: int) -> str:
    with open(log, "rb") as fh:
        fh.seek(offset)
        return fh.read().decode("utf-8", "replace")


def preload(url: str, model: str, token: str) -> None:
    """Load ``model`` now (Ollama's empty generate), so a model that cannot load is our one-line error
    before the agent starts, not the agent's retry loop."""
    import urllib.error
    import urllib.request

    body = json.dumps({"model": model}).encode()
    request = urllib.request.Request(url + "/api/generate", data=body, method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=LOAD_TIMEOUT_S):  # noqa: S310 - our own server
            return
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error")
        except ValueError:
            message = None
        raise LocalInferError(f"the server at {url} cannot serve {model}: {message or exc}") from None
    except OSError as exc:
        raise LocalInferError(f"the server at {url} did not load {model}: {exc}") from None


def context(url: str, model: str, token: str) -> int | None:
    """The context the server at ``url`` gives ``model`` (llama-server's ``/props``, which serve and
    llama-server answer): what the agent is told with --endpoint; None when it does not say."""
    import urllib.parse
    import urllib.request

    request = urllib.request.Request(f"{url}/props?model={urllib.parse.quote(model)}", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - the user's own server
            n_ctx = json.loads(response.read())["default_generation_settings"]["n_ctx"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return n_ctx if isinstance(n_ctx, int) and n_ctx > 0 else None


def stop() -> dict[str, Any] | None:
    """Stop the server launch started (SIGTERM, then wait for it); what it was, or None when none runs."""
    import signal

    try:
        info = json.loads(_record().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    with contextlib.suppress(OSError):
        _record().unlink()
    if not isinstance(info, dict) or not _ours(info):
        return None
    pid = int(info["pid"])
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    return info
