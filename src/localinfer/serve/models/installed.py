"""The names ``serve`` without one -m answers (the installed models and the package-shipped default),
read again only when the store's manifest changed: a model pulled (or removed) while the server runs
is servable (or not) at its next request, for the price of a ``stat`` per request otherwise.

Also what each name resolves to (``resolved``), dropped when its manifest entry changed.
"""

from __future__ import annotations

from typing import Any

# what an entry's use writes (`list`'s "last used"): a load's own touch must not make it resolve again
_USE_FIELDS = ("last_used",)


class Installed:
    """The servable names, rechecked when the manifest's file identity changes (writes are renames)."""

    def __init__(self) -> None:
        self.resolved: dict[str, Any] = {}  # name -> ResolvedModel, while its entry is unchanged
        self._stamp: Any = ()  # the manifest's file identity when last read; () before the first read
        self._names: list[str] = []
        self._entries: dict[str, Any] = {}

    def names(self) -> list[str]:
        from localinfer.paths import file_identity
        from localinfer.store.manifest import Store

        store = Store()
        stamp = file_identity(store.manifest_path)
        if stamp != self._stamp or stamp is None:  # no manifest yet: the default may be all there is
            entries = _entries(store)
            for name in [n for n in list(self.resolved) if _kept(entries.get(n)) != _kept(self._entries.get(n))]:
                self.resolved.pop(name, None)  # resolve runs on worker threads: two may drop one name
            self._names, self._entries, self._stamp = sorted(set(entries) | _default()), entries, stamp
        return self._names


def _entries(store: Any) -> dict[str, Any]:
    from localinfer.errors import LocalInferError

    try:
        return dict(store.entries())
    except (OSError, LocalInferError):
        return {}


def _kept(entry: Any) -> Any:
    return {k: v for k, v in entry.items() if k not in _USE_FIELDS} if isinstance(entry, dict) else entry


def _default() -> set[str]:
    """The registry default, when its package is installed."""
    from localinfer.errors import LocalInferError
    from localinfer.store.registry import load_registry
    from localinfer.store.sources.packages import is_installed

    try:
        registry = load_registry()
        package = registry.get(registry.default).package if registry.default in registry else None
        return {registry.default} if package and is_installed(package) else set()
    except LocalInferError:
        return set()
