"""Start loading the model before the command line is even parsed.

A cold ``run`` is Python start-up (interpreter, Typer, our modules: ~200 ms) followed by llama.cpp
loading the weights (~100 ms for SmolLM2, in C, with the GIL released). ``cli.prescan`` reads which
model ``run``'s argv names and calls ``start``: if that model is installed and verified already
(``store.resolve.resolve_installed``: no hashing, assembling or downloading), its header validated,
the engine starts loading its weights on a thread (``engine.llama.preload_model``) while Typer is
imported and parses the options. ``Model`` then takes that load if it asks for the same file with
the same parameters, and frees it otherwise; the context is always created with the real options.
Where the answer may be long, the AMX decoding twin's weights start loading too (``engine.twin``).

Resolving takes ~45 ms of that start-up (the registry, the manifest, the GGUF header and their
imports), during which nothing loads. So ``run`` remembers what it last resolved each model name
(or path) to (``remember``: the file, and its size, times, inode and device as they were once
verified) in ``preload-hints.json``; while the file is still exactly that one, the load starts at
once and the resolving happens afterwards, beside it. A hint never decides what is used: the real
resolution does, and ``Model`` frees a load ahead that is not of the file it asks for, as that file
is now, or not with its parameters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - typing only
    from localinfer.hardware import MemoryBudget
    from localinfer.store.types import ResolvedModel

# (spec as given, its resolution (None: started from a hint), the memory measured before loading
# began): at most one
_started: list[tuple[str | None, ResolvedModel | None, MemoryBudget]] = []
HINTS_FILE = "preload-hints.json"  # in paths.data_dir()
MAX_HINTS = 32  # model names and paths noted, the most recently resolved


def start(spec: str | None, max_tokens: int | None = None) -> None:
    """Resolve ``spec`` (None: the default model) if that needs no work, and start loading it; and,
    unless ``max_tokens`` caps the answer too short for it, its AMX decoding twin (``engine.twin``).
    With a hint (``remember``) still true of its file, the load starts before resolving."""
    if _started:
        return
    try:
        resolution: ResolvedModel | None = None
        hint = _hint(spec)
        if hint is None:
            from localinfer.store.resolve import resolve_installed

            resolution = resolve_installed(spec)
            if resolution is None:
                return
            path, file_size = resolution.path, resolution.info.file_size
            vocab = (resolution.info.architecture, resolution.info.vocab_size or 0)
        else:
            path, file_size, vocab = hint
        from localinfer.hardware import memory_budget

        # Measured before the weights start loading, and used by the real pre-flight too: a load in
        # progress (repacked weights are new memory) would make memory look smaller. A model whose
        # weights alone take most of the memory is not loaded ahead: the pre-flight decides first.
        budget = memory_budget()
        if file_size > 0.75 * budget.ram_available:
            return
        from localinfer.engine import twin
        from localinfer.engine.llama import preload_model

        # The twin's weights alone must fit its share of memory (twin.wanted checks exactly later).
        long_answer = max_tokens is None or max_tokens >= twin.MIN_TOKENS
        fits = twin.fits(file_size, budget)
        if preload_model(path, twin_budget=budget if long_answer and fits else None, twin_vocab=vocab):
            _started.append((spec, resolution, budget))
    except Exception:  # noqa: BLE001 - only a head start: the real resolve and load report problems
        return


def remember(spec: str | None, resolution: ResolvedModel) -> None:
    """Note what ``spec`` resolved to (verified: ``run`` calls this after resolving), for the next
    ``start`` to begin loading it before resolving. Written only when it changed. Not noted: a model
    in several files (only its first file's identity would be checked)."""
    try:
        import os

        from localinfer.paths import boot_id, data_dir, file_identity
        from localinfer.store.names import parse_spec

        identity = file_identity(resolution.path)
        if (resolution.info.split_count or 1) > 1 or identity is None:
            return
        is_path = spec is not None and parse_spec(spec).kind == "path"
        key = _path_key(spec) if is_path else _key(spec)  # a path: as resolved from this directory
        note = {
            "path": os.path.abspath(resolution.path),
            "identity": list(identity),
            "boot": boot_id(),
            "architecture": resolution.info.architecture,
            "vocab_size": resolution.info.vocab_size or 0,
        }
        hints = _read_hints()
        if hints.get(key) == note:
            return
        hints.pop(key, None)
        hints[key] = note  # the newest last: the oldest go first past MAX_HINTS
        for old in list(hints)[: max(0, len(hints) - MAX_HINTS)]:
            del hints[old]
        from localinfer.store.fsutil import atomic_write_json

        atomic_write_json(data_dir() / HINTS_FILE, hints, sort_keys=False)  # oldest first
    except Exception:  # noqa: BLE001 - a hint is an optimisation: a run never fails for it
        return


def _hint(spec: str | None) -> tuple[str, int, tuple[str, int]] | None:
    """(path, size, (architecture, vocabulary size)) that ``remember`` noted for ``spec``, if that
    file is still the one noted (``paths.file_identity``) and the machine has not restarted since (a
    file written just before a crash may be torn: the store hashes it again then, and so waits)."""
    from localinfer.paths import boot_id, file_identity

    hints = _read_hints()
    note = hints.get(_key(spec))
    if note is None and spec is not None:  # a path, noted as such
        note = hints.get(_path_key(spec))
    if not isinstance(note, dict):
        return None
    path, vocab_size, identity = note.get("path"), note.get("vocab_size"), note.get("identity")
    if not isinstance(path, str) or not isinstance(vocab_size, int) or not isinstance(identity, list):
        return None
    now = file_identity(path)
    if now is None or list(now) != identity or note.get("boot") != boot_id():
        return None
    return path, now[0], (str(note.get("architecture") or ""), vocab_size)


def _key(spec: str | None) -> str:
    return "" if spec is None else f"spec:{spec}"


def _path_key(spec: str) -> str:
    import os

    return "path:" + os.path.abspath(os.path.expanduser(spec))


def _read_hints() -> dict:
    import json

    from localinfer.paths import data_dir

    try:
        with open(data_dir() / HINTS_FILE, encoding="utf-8") as fh:
            hints = json.load(fh)
    except (OSError, ValueError):
        return {}
    return hints if isinstance(hints, dict) else {}


def resolved(spec: str | None) -> ResolvedModel | None:
    """The resolution ``start`` made of ``spec``, if it started one for exactly ``spec``."""
    for given, res, _budget in _started:
        if given == spec:
            return res
    return None


def budget() -> MemoryBudget | None:
    """The memory measured before the load ahead began (for the pre-flight), if one began."""
    return _started[0][2] if _started else None


def settle() -> None:
    """Wait for a load still running ahead, before the process exits."""
    if _started:
        from localinfer.engine.llama import settle_preload

        settle_preload()
