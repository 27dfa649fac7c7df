"""The resident server's model as a Backend: a RemoteBackend on the private socket whose answers
read as a local run's (no endpoint, load 0): the server sends each answer whole (``answer.finished.Finished``,
the engine's stats included) and the model's load facts, so ``--json``, the warnings, the stats line
and the usage history are those of a model loaded here."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from localinfer.backends.remote import RemoteBackend
from localinfer.errors import GenerationError, LocalInferError
from localinfer.remote.connection import RemoteError

if TYPE_CHECKING:
    from localinfer.answer.answer import Answer, Received
    from localinfer.answer.finished import Finished
    from localinfer.engine.types import LoadOptions
    from localinfer.request.request import Messages, Request
    from localinfer.resident.client import UnixClient
    from localinfer.resident.start import Place
    from localinfer.store import ResolvedModel

Note = Callable[[str], None]


class ResidentBackend(RemoteBackend):
    """A model loaded in the resident server (``info``: what ``/resident/load`` said of it)."""

    def __init__(self, client: UnixClient, name: str, info: dict[str, Any], place: Place, *, retries: int = 4) -> None:
        super().__init__(client, name, retries=retries)
        self.info, self.place = info, place
        self.sha256 = info.get("sha256")

    @property
    def endpoint(self) -> str | None:
        return None  # answered on this machine, by this user's own server

    @property
    def can_chat(self) -> bool:
        return bool(self.info.get("can_chat"))

    def request(self, prompt: str | Messages, *, raw: bool = False, **fields: Any) -> Request:
        from localinfer.backends import Backend

        return Backend.request(self, prompt, raw=raw, **fields)  # the local default limit of plain completion stays

    def body(self, request: Request) -> dict[str, Any]:
        """A server's request body, with what only this server is sent: the conversation whole (past
        calls, their results, past thinking) and the tools, as a local run would use them."""
        import dataclasses

        body = super().body(dataclasses.replace(request, tools=(), tool_choice=None))
        if request.max_tokens is None and request.default_max_tokens is not None:
            body["max_tokens"] = request.default_max_tokens
        if "messages" in body:
            from localinfer.request.images import wire_messages

            body["messages"] = wire_messages(request.messages)  # images as data URIs, as any server takes them
        if request.tools or request.tool_choice is not None:
            body["tools"] = [t.to_openai() for t in request.tools]
            choice = request.tool_choice
            if choice is not None:
                body["tool_choice"] = {"type": "function", "function": {"name": choice.name}} if choice.mode == "function" else choice.mode
            body["parallel_tool_calls"] = request.parallel_tool_calls
        return body

    def _answer(self, got: Received, request: Request, seed: bool = True) -> Answer:
        """The answer the server finished and sent whole (``answer.finished.Finished``), made an
        ``Answer`` as a local run makes it, timed here as a local run times it (TTFT, total: as the
        user saw them); an answer cut short (Ctrl-C) has only what came: its stats from ``timings``."""
        from localinfer.answer.answer import Answer
        from localinfer.answer.finished import Finished

        done = Finished.from_wire(got.whole) if got.whole is not None else self._partial(got, request, seed)
        load_s, self.info["load_s"] = float(self.info.get("load_s") or 0.0), 0.0  # loaded for this request, or resident
        ttft = got.ttft_s if got.ttft_s is not None else done.ttft_s  # no text came (calls): the server's
        return Answer.of_finished(done, self.name, ttft_s=ttft, total_s=got.total_s, load_s=load_s, mode=request.mode,
                                  peak_rss=int(self.info.get("rss") or 0), resident=not load_s,
                                  facts=self.info.get("facts"))  # fmt: skip

    def _partial(self, got: Received, request: Request, seed: bool) -> Finished:
        from localinfer.answer.finished import Finished
        from localinfer.engine.types import GenerationStats

        t = got.server_timings or {}
        prompt, completion = got.prompt_tokens or 0, got.completion_tokens or 0
        stats = GenerationStats(
            prompt_tokens=prompt, cached_tokens=got.cached_tokens or 0, completion_tokens=completion,
            prefill_s=(t.get("prompt_ms") or 0.0) / 1000.0, decode_s=(t.get("predicted_ms") or 0.0) / 1000.0,
            first_token_s=got.ttft_s, finish_reason=got.finish_reason, n_ctx=int(self.info.get("n_ctx") or 0),
            context_used=prompt + completion,
        )  # fmt: skip
        if seed and request.sampling.seed is not None:
            stats.extra["seed"] = request.sampling.seed
        return Finished(got.text, got.finish_reason, stats, reasoning=got.reasoning or None,
                        reasoning_tokens=got.reasoning_tokens, logprobs=got.logprobs)  # fmt: skip

    def answer(self, request: Request, on_text: Any = None, *, on_reasoning: Any = None) -> Answer:
        try:
            return super().answer(request, on_text, on_reasoning=on_reasoning)
        except RemoteError as exc:
            raise self._died(exc) from None

    def _died(self, exc: RemoteError) -> LocalInferError:
        """The server failing mid-answer is a runtime failure here (exit 1), as the engine's would be."""
        return GenerationError(f"the resident server failed during the answer: {exc}",
                               hint=f"see {self.place.log}; the next command starts a new server")  # fmt: skip

    def switch(self, name: str) -> ResidentBackend:
        raise LocalInferError("/model is not available with --keep-alive", hint="start chat again with -m NAME")


def open_resident(
    spec: str | None, options: LoadOptions | None, *, keep_alive: float, resolve: Callable[[], ResolvedModel],
    load_options: Callable[[ResolvedModel], LoadOptions], max_models: int | None = None, force: bool = False,
    on_note: Note | None = None, warn: Note | None = None, retries: int = 4, chat_only: bool = False,
) -> ResidentBackend | None:
    """The model ``spec`` names, loaded (or found loaded) in the resident server, which is started
    if none runs; None, after one line to ``warn``, when no resident server can be had (run locally).

    ``options``: the load flags when they alone decide them (run, chat): the server then resolves the
    model itself and the client touches no store; None (batch sizes its load by the model):
    ``resolve()`` here first. A model the server does not find installed is resolved here too (a
    pull, with its progress; a file checked as a local run checks it), then asked for again. A file
    the server still does not take (``resident.loading.check_known_file``: nothing hashed it) runs locally."""
    from localinfer import paths
    from localinfer.resident.start import place, unix_sockets

    tell = warn or (lambda _m: None)
    if not unix_sockets():
        tell("--keep-alive needs Unix domain sockets, which this platform lacks: running locally")
        return None
    where = place(paths.data_dir())
    resolved = None
    if options is None:
        resolved = resolve()
        options = load_options(resolved)
    extra = {"keep_alive": -1 if keep_alive == float("inf") else keep_alive, "max_models": max_models, "force": force}
    body = _load_body(_spec(spec, resolved), options, extra)
    opened = _ask(where, body, max_models, tell)
    if opened is None:
        return None
    server, status, info = opened
    if status != 200 and resolved is None and _not_found(info):
        resolved = resolve()  # not installed: fetched here as a local run would, or its own error
        body["spec"] = _spec(spec, resolved)
        opened = _ask(where, body, max_models, tell)
        if opened is None:
            return None
        server, status, info = opened
    if status != 200 and resolved is not None and resolved.source.startswith("local") and _not_found(info):
        tell(f"the resident server keeps installed models and files localinfer has hashed, and {resolved.path} is "
             f"not one (LOCALINFER_PROBE=0 leaves it unhashed, as does a read-only store): running locally")  # fmt: skip
        return None
    if status != 200:
        raise _load_error(info)
    for note in info.get("notes", ()):
        (on_note or tell)(note)  # a reload, an unload to make room: one line each
    if "env" in info:
        _compare_env(info["env"], tell)
    name = os.path.abspath(spec) if spec and _is_path(spec) else info["name"]  # a name the server serves (not relative)
    if chat_only and not info.get("can_chat"):
        from localinfer.backends import no_template_error

        raise no_template_error(name)
    return ResidentBackend(server.route(f"/m/{info['id']}"), name, info, where, retries=retries)


def _ask(where: Place, body: dict[str, Any], max_models: int | None, tell: Note) -> tuple[UnixClient, int, Any] | None:
    """POST /resident/load, starting the server if needed (None: no server can run here)."""
    import time

    from localinfer.resident import client as rc

    for attempt in range(3):
        try:
            server = rc.find_or_start(where, max_models=max_models, preload=body)
            status, info = server.call("POST", "/resident/load", body)
        except OSError as exc:
            tell(f"cannot use a resident server in {where.folder} ({exc.strerror or exc}): running locally")
            return None
        except (rc.NoServer, RemoteError):  # it was exiting as we came: start another
            if attempt == 2:
                raise
            time.sleep(0.05)
            continue
        if status == 503 and attempt < 2:
            time.sleep(0.05)  # it removes its socket as it stops: the next try starts a new one
            continue
        return server, status, info
    raise AssertionError("unreachable")


def _not_found(info: Any) -> bool:
    from localinfer.errors import ModelNotFoundError

    return bool((info or {}).get("error", {}).get("type") == ModelNotFoundError.__name__)


def _compare_env(theirs: dict[str, str], tell: Note) -> None:
    """One line when the server's start-time environment (its first command's) is not this command's."""
    from localinfer.resident.start import runtime_env

    ours = runtime_env()
    differ = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
    if differ:
        shown = ", ".join(f"{k}={theirs.get(k, '(unset)')} there, {ours.get(k, '(unset)')} here" for k in differ)
        tell(f"the resident server keeps the environment it started with ({shown}); "
             "`localinfer stop --all` restarts it with this one")  # fmt: skip


def _is_path(spec: str) -> bool:
    return spec.lower().endswith(".gguf") or os.path.exists(spec)


def _spec(spec: str | None, resolved: ResolvedModel | None) -> str | None:
    """What the server resolves: a file by its absolute path (its working directory is not ours), as
    typed: a symbolic link is not followed, so the server names the model as this command does."""
    if resolved is not None:
        return os.path.abspath(resolved.path) if resolved.source.startswith("local") else resolved.name
    if spec is not None and _is_path(spec):
        return os.path.abspath(os.path.expanduser(spec))
    return spec


def _load_body(spec: str | None, options: LoadOptions, extra: dict[str, Any]) -> dict[str, Any]:
    from localinfer.serve.models.pool import load_fields

    sequences = max(1, options.n_seq_max)
    ctx = options.n_ctx // sequences if options.n_ctx else None  # None: the server's default for the model
    return {"spec": spec, "options": load_fields(options), "sequences": sequences, "ctx_per_seq": ctx, **extra}


def _load_error(info: Any) -> LocalInferError:
    """The server's load failure as the error a local load would have raised (same exit code)."""
    from localinfer.errors import ModelLoadError
    from localinfer.resident.client import own_error

    err = (info or {}).get("error") or {}
    return own_error(err, ModelLoadError, "the resident server could not load the model")
