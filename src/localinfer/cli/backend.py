"""How `run`, `chat` and `batch` get the model that answers them: ``--endpoint`` makes a server's
backend (nothing is loaded here, no load flag is read), else the model is resolved and loaded."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localinfer.backends import Backend, Note
    from localinfer.engine.types import LoadOptions
    from localinfer.remote.connection import Endpoint
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
) -> Backend:
    """The backend for the command's flags. ``load_options``: the load flags, given the model (only
    called for a model loaded here). ``on_model``: told which model the request goes to as soon as
    that is known, so that a failure later is recorded against it."""
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
        from localinfer.render.progress import make_progress
        from localinfer.store import resolve_model

        resolved = resolve_model(model, offline=offline, pull_progress=make_progress())
        tell(resolved)
        backend = backends.load(resolved, load_options(resolved), force=force, on_note=on_note, chat_only=chat_only)
    tell(backend)
    return backend
