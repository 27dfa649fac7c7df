"""Who may use the server from a web browser: the ``Host`` a request names (a page that rebinds
its DNS name to 127.0.0.1 sends its own name), the ``Origin`` a page sends, CORS for the origins
``--cors-origin`` names, and JSON-only POST bodies (a page may send text/plain, form and multipart
bodies cross-site without asking first; JSON needs a preflight, which only named origins pass).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from typing import Any

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import JSONResponse, Response

from localinfer.errors import UsageError
from localinfer.serve.wires.openai import ApiError

ASGIApp = Callable[..., Any]
LOCAL_NAMES = frozenset({"localhost"})
WILDCARDS = frozenset({"0.0.0.0", "::", ""})  # --host values that name no single address
PREFLIGHT_MAX_AGE = "600"


def host_name(value: str) -> str:
    """The name part of a ``Host`` header or flag: lowercased, without port or trailing dot."""
    value = value.strip().lower()
    if value.startswith("["):  # [v6] or [v6]:port
        end = value.find("]")
        return value[: end + 1] if end > 0 else value
    name, colon, port = value.rpartition(":")
    if colon and port.isdigit() and ":" not in name:
        value = name
    elif ":" in value and _is_ip(value):  # a bare v6 address, as --host takes it
        value = f"[{value}]"
    return value[:-1] if value.endswith(".") else value


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name[1:-1] if name.startswith("[") else name)
    except ValueError:
        return False
    return True


def allowed_names(bind_host: str, extra: Iterable[str]) -> frozenset[str]:
    """``localhost``, the address or name the server was bound to, and ``--allowed-host`` names."""
    names = set(LOCAL_NAMES) | {host_name(n) for n in extra}
    if bind_host.strip() not in WILDCARDS:
        names.add(host_name(bind_host))
    return frozenset(names)


def check_allowed_host(value: str) -> str:
    """An ``--allowed-host`` value, normalized; a usage error when it cannot be a host name."""
    name = host_name(value)
    if name != "*" and (not name or any(c in name for c in " /@?#\\")):
        raise UsageError(f"--allowed-host {value!r} is not a host name", hint="give a name such as mybox.lan (any port matches)")
    return name


def check_origin(value: str) -> str:
    """A ``--cors-origin`` value as browsers send it (``scheme://host[:port]``, lowercase), or * / null."""
    origin = value.strip().rstrip("/").lower()
    scheme, sep, rest = origin.partition("://")
    if origin not in ("*", "null") and (not sep or not scheme.isalpha() or not rest or any(c in rest for c in "/?#@ ")):
        raise UsageError(f"--cors-origin {value!r} is not an origin",
                         hint="give the page's scheme://host[:port], e.g. http://localhost:3000 ('*': any page)")  # fmt: skip
    return origin


def error_body(path: str, exc: ApiError) -> dict[str, Any]:
    """An error in the shape of the protocol whose route ``path`` is: a client reads its own shape
    even for a refusal made before any route (Ollama's under /api/, Anthropic's under /v1/messages)."""
    if path.startswith("/api/"):
        from localinfer.serve.wires.ollama import chat as ollama_wire
        return ollama_wire.error_body(exc)
    if path.startswith("/v1/messages"):
        from localinfer.serve.wires import anthropic
        return anthropic.error_body(exc)
    return exc.body()


def _refuse(path: str, status: int, message: str, code: str, type: str = "permission_error") -> Response:
    exc = ApiError(status, message, type=type, code=code)
    return JSONResponse(error_body(path, exc), status_code=exc.status)


def _not_json(path: str, headers: Headers) -> Response | None:
    media = headers.get("content-type", "").partition(";")[0].strip().lower()
    if media == "application/json":
        return None
    if "content-type" not in headers and "origin" not in headers:
        # no page sent it (a browser's cross-site POST always carries Origin): litellm posts JSON
        # to Ollama's API without any Content-Type, and Ollama takes it
        return None
    got = f"got {media!r}" if media else "none was sent"
    return _refuse(path, 415, f"the body must be JSON: send 'Content-Type: application/json' ({got})", "unsupported_media_type",
                   type="invalid_request_error")  # fmt: skip


class Guard:
    """Refuses a request whose Host is not ours (403) unless a key protects the server, one from a
    web page whose origin is not named (403), and a POST whose body is not JSON (415; one with no
    Content-Type is taken as JSON when no Origin came with it); answers CORS
    for the named origins. Checks run before any route, /health included."""

    def __init__(self, app: ASGIApp, *, hosts: frozenset[str], origins: tuple[str, ...], keyed: bool) -> None:
        self.app, self.hosts, self.origins = app, hosts, origins
        self.any_host = keyed or "*" in hosts  # a page cannot send the key: with one, any Host may ask
        self.any_origin = "*" in origins

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        refusal = self._stranger(scope.get("path", ""), headers)
        if refusal is not None:
            return await refusal(scope, receive, send)
        origin = headers.get("origin")
        if origin is not None:  # a page at a named origin: CORS on every answer, refusals included
            if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
                return await self._preflight(origin, headers)(scope, receive, send)
            send = self._with_cors(origin, send)
        if scope["method"] == "POST" and (refusal := _not_json(scope.get("path", ""), headers)) is not None:
            return await refusal(scope, receive, send)
        await self.app(scope, receive, send)

    def _stranger(self, path: str, headers: Headers) -> Response | None:
        host = headers.get("host")
        if host is not None and not self.any_host and not self._our_host(host_name(host)):
            return _refuse(path, 403, f"Host {host!r} is not one this server answers to (a web page's DNS name pointed at it?): "
                                "start serve with --allowed-host NAME for a name of this machine, or with --api-key",
                           "host_not_allowed")  # fmt: skip
        origin = headers.get("origin")
        if origin is not None and not self.any_origin and origin.rstrip("/").lower() not in self.origins:
            return _refuse(path, 403, f"requests from web pages at {origin} are refused: start serve with --cors-origin {origin} to allow them",
                           "origin_not_allowed")  # fmt: skip
        return None

    def _with_cors(self, origin: str, send: Callable) -> Callable:
        async def send_with_cors(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                out = MutableHeaders(scope=message)
                out["Access-Control-Allow-Origin"] = "*" if self.any_origin else origin
                out.add_vary_header("Origin")
            await send(message)

        return send_with_cors

    def _our_host(self, name: str) -> bool:
        # A DNS rebinding attack needs a name the attacker's DNS answers; an address literal is
        # either this machine's or reaches no page of the attacker's origin.
        return name in self.hosts or _is_ip(name)

    def _preflight(self, origin: str, headers: Headers) -> Response:
        out = {
            "Access-Control-Allow-Origin": "*" if self.any_origin else origin,
            "Access-Control-Allow-Methods": "GET, POST",
            "Access-Control-Allow-Headers": headers.get("access-control-request-headers", "authorization, content-type"),
            "Access-Control-Max-Age": PREFLIGHT_MAX_AGE,
            "Vary": "Origin",
        }
        if headers.get("access-control-request-private-network") == "true":  # Chrome: a public page asks for loopback
            out["Access-Control-Allow-Private-Network"] = "true"
        return Response(status_code=204, headers=out)
