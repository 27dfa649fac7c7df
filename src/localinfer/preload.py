"""Start loading the model before the command line is even parsed.

A cold ``run`` is Python start-up (interpreter, Typer, our modules: ~200 ms) followed by llama.cpp
loading the weights (~100 ms for SmolLM2, in C, with the GIL released). ``cli.prescan`` reads which
model ``run``'s argv names and calls ``start``: if that model is installed and verified already
(``store.resolve.resolve_installed``: no hashing, assembling or downloading), its header validated,
the engine starts loading its weights on a thread (``engine.llama.preload_model``) while Typer is
imported and parses the options. ``Model`` then takes that load if it asks for the same file with
the same parameters, and frees it otherwise; the context is always created with the real options.
Where the answer may be long, the AMX decoding twin's weights start loading too (``engine.twin``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - typing only
    from localinfer.hardware import MemoryBudget
    from localinfer.store.types import ResolvedModel

# (spec as given, its resolution, the memory measured before loading began): at most one
_started: list[tuple[str | None, ResolvedModel, MemoryBudget]] = []


def start(spec: str | None, max_tokens: int | None = None) -> None:
    """Resolve ``spec`` (None: the default model) if that needs no work, and start loading it; and,
    unless ``max_tokens`` caps the answer too short for it, its AMX decoding twin (``engine.twin``)."""
    if _started:
        return
    try:
        from localinfer.store.resolve import resolve_installed

        resolved = resolve_installed(spec)
        if resolved is None:
            return
        from localinfer.hardware import memory_budget

        # Measured before the weights start loading, and used by the real pre-flight too: a load in
        # progress (repacked weights are new memory) would make memory look smaller. A model whose
        # weights alone take most of the memory is not loaded ahead: the pre-flight decides first.
        budget = memory_budget()
        if resolved.info.file_size > 0.75 * budget.ram_available:
            return
        from localinfer.engine import twin
        from localinfer.engine.llama import preload_model

        # The twin's weights alone must fit its share of memory (twin.wanted checks exactly later).
        long_answer = max_tokens is None or max_tokens >= twin.MIN_TOKENS
        fits = twin.fits(resolved.info.file_size, budget)
        vocab = (resolved.info.architecture, resolved.info.vocab_size or 0)
        if preload_model(resolved.path, twin_budget=budget if long_answer and fits else None, twin_vocab=vocab):
            _started.append((spec, resolved, budget))
    except Exception:  # noqa: BLE001 - only a head start: the real resolve and load report problems
        return


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
