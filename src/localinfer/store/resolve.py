"""Turn what the user typed into a verified GGUF on disk: :func:`resolve_model`."""

from __future__ import annotations

from localinfer.errors import ChecksumError, ModelNotFoundError
from localinfer.store.install import hub_offline, install_from_package, read_local_file, resolve_entry
from localinfer.store.loadable import ensure_in_place
from localinfer.store.manifest import Store
from localinfer.store.names import ModelSpec, parse_spec
from localinfer.store.types import ProgressSink, ResolvedModel


def _resolve_path(spec: ModelSpec, store: Store, progress: ProgressSink | None) -> ResolvedModel:
    path, info = read_local_file(spec)
    digest = ensure_in_place(store, path.resolve(), info, progress)  # llama.cpp tried on it once, in a child
    return ResolvedModel(
        name=spec.raw,
        path=path,
        sha256=digest,
        source="local",
        chat_format=None,
        info=info,
    )


def _not_installed(spec: ModelSpec, why: str) -> ModelNotFoundError:
    return ModelNotFoundError(f"model {spec.name!r} is not installed{why}", hint=f"localinfer pull {spec.raw}")


def resolve_model(
    spec: str | None,
    *,
    offline: bool = False,
    auto_pull: bool = True,
    pull_progress: ProgressSink | None = None,
) -> ResolvedModel:
    """Find (and if needed fetch) the model ``spec`` names, verified, ready to load.

    ``None`` means the registry default. Paths are used in place; registry models shipped in a package
    are verified in place (or assembled once into the store); anything else comes from the store, or is
    pulled from the Hub when ``auto_pull`` and not ``offline``/``HF_HUB_OFFLINE``. A pull reports to
    ``pull_progress`` (None: nowhere); checking what is installed stays silent, so a run starts quietly.
    """
    from localinfer.store.registry import load_registry

    parsed = parse_spec(spec) if spec is not None else None
    if parsed is not None and parsed.kind == "path":  # a file needs no registry (nor a readable one)
        return _resolve_path(parsed, Store(), None)  # checking a file stays silent, as for installed ones
    registry = load_registry()
    if parsed is None:
        parsed = parse_spec(registry.default)
    store = Store()

    entry = store.entry(parsed.name)
    can_fetch = parsed.is_hub or (parsed.name in registry and bool(registry.get(parsed.name).repo))
    if entry is not None:
        try:
            return resolve_entry(store, entry, registry=registry)
        except (ModelNotFoundError, ChecksumError):
            # A broken copy in the store is rebuilt (assembled again, or pulled again) when possible.
            from localinfer.store.sources.packages import is_installed

            in_store = entry.get("kind") == "store"
            reg = registry.entries.get(parsed.name) if parsed.kind == "name" else None
            from_package = reg is not None and bool(reg.package) and is_installed(reg.package)
            from_hub = in_store and can_fetch and auto_pull and not hub_offline(offline)
            if not (from_package or from_hub):
                raise
    if parsed.kind == "name":
        reg = registry.get(parsed.name)  # unknown name -> ModelNotFoundError with suggestions
        from localinfer.store.sources.packages import is_installed

        if reg.package and is_installed(reg.package):
            entry = install_from_package(store, reg)
            return resolve_entry(store, entry, registry=registry)
        if not reg.repo:
            raise ModelNotFoundError(
                f"model {reg.name!r} is shipped by the package {reg.package}, which is not installed",
                hint=f"pip install {str(reg.package).replace('_', '-')}",
            )
    if hub_offline(offline):
        raise _not_installed(parsed, " (offline: not downloading)")
    if not auto_pull:
        raise _not_installed(parsed, "")
    from localinfer.store.pull import pull_model

    entry = pull_model(parsed.raw, progress=pull_progress)
    return resolve_entry(store, entry, registry=registry)
