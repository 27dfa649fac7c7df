"""What `localinfer serve` was asked for, as plain values (the CLI builds it from its flags)."""

from __future__ import annotations

from dataclasses import dataclass

LOOPBACK = ("127.0.0.1", "::1", "localhost")
DEFAULT_MAX_BODY = 4 * 1024 * 1024  # a long conversation is well under this; a megabyte-sized JSON error is not


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8080  # 0: any free port (the one chosen is printed)
    parallel: int = 4  # sequences decoding together
    api_key: str | None = None
    max_body: int = DEFAULT_MAX_BODY  # bytes; a larger request body is a 413
    max_queue: int = 64  # requests waiting for a sequence; more are a 503 with Retry-After
    embedding_ctx: int = 512  # /v1/embeddings: tokens per decode, and so the longest input
    drain_s: float = 30.0  # on SIGTERM / Ctrl-C: how long running requests may finish before they are cancelled
    allowed_hosts: tuple[str, ...] = ()  # Host names answered besides localhost and --host ("*": any)
    cors_origins: tuple[str, ...] = ()  # web page origins allowed to call the API ("*": any page)
    max_connections: int = 1024  # open at once (fewer if the file limit is lower)
    header_timeout_s: float = 10.0  # a request's head must arrive whole within this
    no_log: bool = False  # do not record requests in the usage history
    verbose: bool = False  # uvicorn's access log and llama.cpp's log
    chat_template_kwargs: dict | None = None  # the template's variables; a request's chat_template_kwargs win
    model_map: tuple[tuple[str, str], ...] = ()  # --map-model: (fnmatch pattern, served model) for names not installed
    cache_ram: int = 0  # bytes of host memory per model for idle sequences' cells (engine.prompt_cache; 0: none)
    n_predict: int = -1  # -n: the cap of an answer whose request names none (-1 or 0: what the context leaves)

    @property
    def public(self) -> bool:
        """Bound beyond this machine's loopback interface."""
        return self.host not in LOOPBACK
