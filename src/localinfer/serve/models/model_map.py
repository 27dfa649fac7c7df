"""``serve --map-model PATTERN=MODEL``: which served model answers a name no installed model has.

Agents name models the user never installed (Claude Code's background and subagent calls ask for
``claude-haiku-…``); without a mapping those are a 404 and the agent waits or fails. Patterns are
fnmatch's (``*``, ``?``, ``[…]``), matched without regard to case, first match wins; an installed
model's own name always wins over every pattern.
"""

from __future__ import annotations

import fnmatch

ModelMap = tuple[tuple[str, str], ...]  # (pattern, model), in the order given


def parse(specs: list[str] | None) -> ModelMap:
    """``PATTERN=MODEL`` strings as pairs; a UsageError names a malformed one."""
    from localinfer.errors import UsageError

    pairs = []
    for spec in specs or ():
        pattern, sep, model = spec.rpartition("=")
        if not sep or not pattern.strip() or not model.strip():
            raise UsageError(f"--map-model {spec!r}: expected PATTERN=MODEL, such as 'claude-*=smollm2-135m'")
        pairs.append((pattern.strip(), model.strip()))
    return tuple(pairs)


def target(model_map: ModelMap, name: str, names: list[str]) -> str | None:
    """The served model (one of ``names``) that answers ``name``, or None (then: a 404)."""
    lowered = name.lower()
    for pattern, model in model_map:
        if fnmatch.fnmatchcase(lowered, pattern.lower()):
            return next((n for n in (model, f"{model}:latest", model.removesuffix(":latest")) if n in names), None)
    return None


def lines(model_map: ModelMap) -> list[str]:
    """serve's log, one line per mapping."""
    return [f"  a model named {pattern!r} that is not installed is answered by {model} (--map-model)" for pattern, model in model_map]
