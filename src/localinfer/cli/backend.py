"""How `run`, `chat` and `batch` get the model that answers them: ``--endpoint`` makes a server's
backend (nothing is loaded here, no load flag is read), else the model is resolved and loaded."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localinfer.backends import Backend, Note
    from localinfer.engine.types import LoadOptions
    from localinfer.remote.connection import Endpoint
    from localinfer.resident.place import KeepAlive
    from localinfer.store import ResolvedModel
    from localinfer.usage.recorder import Named


def open_backend(
    *,
    endpoint: Endpoint | None,
    model: str | None,
    load_options: Callable[[ResolvedModel], LoadOptions],
    offline: bool = False,
    force: bool = False,
    on_note: Note | None = None,
    on_model: Callable[[Named], None] | None = None,
    chat_only: bool = False,
    pool: int = 1,
    retries: int = 4,
    keep_alive: KeepAlive | None = None,
    chat: bool = True,
) -> Backend:
    """The backend for the command's flags. ``load_options``: the load flags, given the model (only
    called for a model loaded here). ``on_model``: told which model the request goes to as soon as
    that is known, so that a failure later is recorded against it. ``keep_alive``: the model is
    loaded (or found) in this user's resident server, which answers; where none can run, here.
    ``chat``: False where only plain completions will be asked (`run --raw`, `embed`)."""
    from localinfer import backends
    from localinfer.usage.recorder import ModelId

    tell = on_model or (lambda _named: None)
    if endpoint:
        remote = backends.connect(endpoint, pool=pool, retries=retries)
        try:
            if model:
                tell(ModelId(model, endpoint=remote.endpoint))
            backend: Backend = remote.choose(model)
        except BaseException:
            remote.close()
            raise
    else:
        def resolve() -> ResolvedModel:
            from localinfer.render.progress import make_progress
            from localinfer.store import resolve_model

            resolved = resolve_model(model, offline=offline, pull_progress=make_progress())
            tell(resolved)
            return resolved

        backend = None
        if keep_alive is not None:
            backend = _resident(model, load_options, keep_alive, resolve, force=force, on_note=on_note, retries=retries,
                                chat_only=chat_only, tell=tell)  # fmt: skip
        if backend is None:
            resolved = resolve()
            backend = backends.load(resolved, load_options(resolved), force=force, on_note=on_note, chat_only=chat_only,
                                    chat=chat)  # fmt: skip
    tell(backend)
    return backend


def _resident(model: str | None, load_options: Callable[[ResolvedModel], LoadOptions], keep_alive: KeepAlive,
              resolve: Callable[[], ResolvedModel], *, tell: Callable[[Named], None], **kw: Any) -> Backend | None:
    """The resident server's backend (None: run here). ``load_options(None)`` succeeds where the flags
    alone decide the load (run, chat): the model is then resolved by the server, not here."""
    from localinfer.render.stats import warn
    from localinfer.resident.backend import open_resident
    from localinfer.usage.recorder import ModelId

    try:
        options = load_options(None)  # type: ignore[arg-type]
    except AttributeError:  # the load is sized by the model (batch): resolved here first
        options = None
    if options is not None and options.draft_model is not None:  # the resident server batches sequences
        from localinfer.errors import UsageError

        raise UsageError("--keep-alive does not take --draft-model yet: a draft model serves one sequence here", hint="leave out --keep-alive")
    if model:
        tell(ModelId(model))
    return open_resident(model, options, keep_alive=keep_alive.seconds, max_models=keep_alive.max_models, resolve=resolve,
                         load_options=load_options, warn=warn, **kw)  # fmt: skip
