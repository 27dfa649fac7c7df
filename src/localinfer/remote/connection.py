"""Where a server is and how to reach it: the endpoint (base URL, API key, timeout), the HTTP library,
and the one translation of HTTP failures into our errors (exit 5 with the URL and a hint).

The HTTP library is httpx2 (the maintained httpx, which huggingface_hub already brings in; it needs
Python 3.11), else httpx: the same API, TLS and proxies (HTTPS_PROXY, NO_PROXY, SSL_CERT_FILE).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from localinfer.errors import ContextOverflowError, NetworkError, UsageError

DEFAULT_TIMEOUT_S = 600.0  # between two bytes of an answer: a slow CPU server may think that long
CONNECT_TIMEOUT_S = 10.0


def httpx() -> Any:
    """The httpx module (httpx2 when installed); imported on first use, never by ``--help``."""
    import importlib

    try:
        return importlib.import_module("httpx2")
    except ImportError:  # Python 3.10: httpx2 needs 3.11
        return importlib.import_module("httpx")


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI base URL (``http://host:port/v1``), the key to send, and how long to wait."""

    base_url: str
    api_key: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def display(self) -> str:
        """The URL as we print and record it: no credentials, no query."""
        parts = urlsplit(self.base_url)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))

    def url(self, path: str) -> str:
        return self.base_url.rstrip("/") + "/" + path.lstrip("/")

    def headers(self) -> dict[str, str]:
        h = {"Accept": "text/event-stream, application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def timeout(self) -> Any:
        return httpx().Timeout(self.timeout_s, connect=min(CONNECT_TIMEOUT_S, self.timeout_s))


def endpoint(url: str, api_key: str | None = None, timeout_s: float | None = None) -> Endpoint:
    """Check ``--endpoint``; a URL without a path gets ``/v1`` (what every OpenAI server serves under).
    The key: ``--api-key``/LOCALINFER_API_KEY (given here), else OPENAI_API_KEY, read when called."""
    text = url.strip()
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(
            f"--endpoint must be an http(s) URL such as http://127.0.0.1:8080/v1, not {url!r}",
            hint="the OpenAI base URL of the server, as the openai client takes it",
        )
    if parts.path in ("", "/"):
        text = urlunsplit((parts.scheme, parts.netloc, "/v1", parts.query, ""))
    key = api_key or os.environ.get("OPENAI_API_KEY") or None
    if timeout_s is not None and timeout_s <= 0:
        raise UsageError("--timeout must be more than 0 seconds")
    return Endpoint(text.rstrip("/"), key, DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s)


class RemoteError(NetworkError):
    """The server answered with an error, or not in the protocol. ``retryable``: worth another try
    (429, 502-504, a dropped connection); ``retry_after``: seconds the server asked us to wait."""

    def __init__(self, message: str, hint: str | None = None, *, status: int | None = None,
                 retryable: bool = False, retry_after: float | None = None, fatal: bool = False) -> None:  # fmt: skip
        super().__init__(message, hint)
        self.status, self.retryable, self.retry_after = status, retryable, retry_after
        self.fatal = fatal  # every request would fail the same way (a wrong key, a wrong URL): stop the job


class ProtocolError(RemoteError):
    """The server's stream is not OpenAI's SSE (not JSON, wrong shapes, cut short)."""


_RETRY_STATUS = (408, 429, 502, 503, 504)


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header: seconds, or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    import email.utils  # here: the resident client reads no dates, and email costs milliseconds to import

    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


def _server_message(body: bytes) -> str:
    """The error message in an OpenAI-style error body, else the start of the body."""
    import json

    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        data = None
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        if isinstance(err, str):
            return err
    text = body[:200].decode("utf-8", errors="replace").strip()
    return " ".join(text.split()) or "no message"


def status_error(status: int, body: bytes, headers: Any, ep: Endpoint, what: str = "the request") -> Exception:
    """The error for an HTTP error answer (the exception to raise, not raised here)."""
    msg = _server_message(body)
    where = ep.display
    if status in (401, 403):
        return RemoteError(f"{where} refused {what} ({status}): {msg}", status=status, fatal=True,
                           hint="pass --api-key KEY, or set LOCALINFER_API_KEY or OPENAI_API_KEY")  # fmt: skip
    if status == 404:
        return RemoteError(f"{where}: not found ({status}): {msg}", status=status, fatal=True,
                           hint="--endpoint is the OpenAI base URL, e.g. http://host:8080/v1; -m names a model of /v1/models")  # fmt: skip
    if status in _RETRY_STATUS:
        wait = retry_after_s(headers.get("retry-after") if headers is not None else None)
        busy = "is busy" if status in (429, 503) else "did not answer in time"
        return RemoteError(f"{where} {busy} ({status}): {msg}", status=status, retryable=True, retry_after=wait,
                           hint="lower --parallel or the request rate, or try again later")  # fmt: skip
    if status in (400, 413, 422):
        if "context" in msg.lower() and ("exceed" in msg.lower() or "too long" in msg.lower() or "size" in msg.lower()):
            return ContextOverflowError(f"{where}: the prompt does not fit the server's context: {msg}",
                                        hint="shorten the prompt or lower --max-tokens")  # fmt: skip
        return UsageError(f"{where} refused {what} ({status}): {msg}")
    return RemoteError(f"{where} failed ({status}): {msg}", status=status, retryable=status >= 500,
                       hint="see the server's log")  # fmt: skip


def transport_error(exc: BaseException, ep: Endpoint, *, started: bool = False) -> RemoteError:
    """A connection-level failure (refused, timed out, cut, TLS, proxy) as one clear error."""
    h = httpx()
    where = ep.display
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, h.ProxyError):
        return RemoteError(f"the proxy refused the connection to {where}: {detail}", retryable=True,
                           hint="check HTTPS_PROXY / HTTP_PROXY, or add the host to NO_PROXY")  # fmt: skip
    if isinstance(exc, h.ConnectTimeout):
        return RemoteError(f"timed out connecting to {where}", retryable=True,
                           hint="is the server running and reachable? check --endpoint")  # fmt: skip
    if isinstance(exc, h.TimeoutException):
        return RemoteError(f"{where} sent nothing for {ep.timeout_s:g} s", retryable=True,
                           hint="the server is slow or stuck: raise --timeout, or check the server")  # fmt: skip
    if isinstance(exc, h.ConnectError):
        if "ssl" in detail.lower() or "certificate" in detail.lower():
            return RemoteError(f"TLS failed with {where}: {detail}", fatal=True,
                               hint="a self-signed server needs its CA in SSL_CERT_FILE")  # fmt: skip
        return RemoteError(f"cannot connect to {where}: {detail}", retryable=True,
                           hint="is the server running? check --endpoint (or LOCALINFER_ENDPOINT)")  # fmt: skip
    if started:
        return RemoteError(f"the connection to {where} broke during the answer: {detail}", retryable=True,
                           hint="the server closed it or died; see its log")  # fmt: skip
    return RemoteError(f"the request to {where} failed: {detail}", retryable=True, hint="see the server's log")
