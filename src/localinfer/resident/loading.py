"""What the resident server's ``/resident/load`` does to a model: the model a spec names, resolved
as installed (:class:`Resolver`), what the request wants loaded (:func:`want_of`), the load itself as
``run`` or ``batch`` loads it (:func:`load_model`), and the first request's model loaded from the
server's start (:class:`Preload`)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from localinfer.serve.models import pool
from localinfer.serve.models.pool import Want


class Resolver:
    """The model a spec names, as installed (never pulled here: the command pulls, with its
    progress; a file path only as :func:`check_known_file` allows); remembered while its file is
    unchanged, so a resident answer skips the store."""

    def __init__(self) -> None:
        self._resolved: dict[str | None, tuple[Any, Any]] = {}  # spec -> (ResolvedModel, its file's identity)

    def __call__(self, spec: str | None) -> Any:
        from localinfer.paths import file_identity
        from localinfer.store import resolve_model

        known = self._resolved.get(spec)
        if known is not None and file_identity(known[0].path) == known[1]:
            return known[0]
        if spec is not None:
            check_known_file(spec)
        resolved = resolve_model(spec, offline=True, auto_pull=False)
        self._resolved[spec] = (resolved, file_identity(resolved.path))
        return resolved


def check_known_file(spec: str) -> None:
    """A file path is loaded only where the store already knows that file as it is now (its digest
    cache: size, mtime, inode unchanged since a command of this user hashed it as it checked it):
    the server never opens a file it is merely handed. ModelNotFoundError otherwise, which the
    command answers by checking the file itself, as a local run does, and asking again
    (``resident.backend``). A name (registry, installed, Hub) passes: the store resolves it."""
    from localinfer.errors import ModelNotFoundError
    from localinfer.store.manifest import Store
    from localinfer.store.names import parse_spec

    parsed = parse_spec(spec)
    if parsed.kind != "path" or parsed.path is None:
        return
    if Store().cached_digest(parsed.path.resolve()) is None:
        raise ModelNotFoundError(f"{spec}: the resident server loads installed models, and files that localinfer "
                                 "has checked, never a file path it is handed")  # fmt: skip


def want_of(body: dict[str, Any], resolved: Any) -> Want:
    """What a load request needs, for the model it resolved to."""
    asked = body.get("ctx_per_seq")
    # the projector too: a file loaded under a name with one does not answer its path (without), nor back
    options = {**pool.load_fields(body["options"]), "mmproj": os.fspath(resolved.mmproj) if resolved.mmproj else None}
    return Want(key=os.fspath(resolved.path.resolve()), options=options,
                sequences=int(body.get("sequences", 1)), ctx_per_seq=int(asked or _default_ctx(resolved)))  # fmt: skip


class Preload:
    """The first request's model, loaded on a thread from the server's start (the command hands it
    the request on stdin): llama.cpp loads while uvicorn and Starlette are imported."""

    def __init__(self, body: dict[str, Any], resolve: Callable[[str | None], Any]) -> None:
        self.body, self.resolve = body, resolve
        self.done = threading.Event()
        self.result: tuple[Any, Want, Any] | None = None
        self.error: BaseException | None = None
        threading.Thread(target=self._run, name="localinfer-preload", daemon=True).start()

    def _run(self) -> None:
        try:
            resolved = self.resolve(self.body.get("spec"))
            want = want_of(self.body, resolved)
            loaded = load_model(resolved, want, default_ctx=self.body.get("ctx_per_seq") is None, force=bool(self.body.get("force")))
            self.result = (resolved, want, loaded)
        except BaseException as exc:  # the request that asked for it gets the error (loading again)
            self.error = exc
        finally:
            self.done.set()

    def discard(self) -> None:
        self.done.wait()
        if self.result is not None:
            self.result[2].close()


def _default_ctx(resolved: Any) -> int:
    from localinfer.batch.job import default_ctx_per_seq

    return default_ctx_per_seq(resolved)


def load_model(resolved: Any, want: Want, *, default_ctx: bool, force: bool) -> Any:
    """The model as ``run`` (one sequence, its -c or the default context) or ``batch`` loads it."""
    from localinfer.generate import loading
    from localinfer.batch import job as batchjob
    from localinfer.engine.types import LoadOptions

    base = LoadOptions(**{k: v for k, v in want.options.items() if k != "mmproj"})  # the projector: resolved's
    if want.sequences == 1 and default_ctx:
        options = base  # the pre-flight sizes the context exactly as a local run's
    else:
        options = batchjob.batch_load_options(base, parallel=want.sequences, ctx_per_seq=want.ctx_per_seq)
    loaded = loading.load(resolved, options, force=force)
    try:
        batchjob.check_template(loaded)
    except BaseException:
        loaded.close()
        raise
    return loaded
