"""Which GGUF file(s) of a Hub repository a ``repo:QUANT`` name means."""

from __future__ import annotations

from localinfer.errors import ModelNotFoundError, UsageError
from localinfer.store.names import quant_of, split_info, split_names

_SKIP_FILES = ("mmproj", "imatrix")  # projectors and importance matrices are not models


def gguf_groups(files: list[str]) -> dict[str, list[str]]:
    """GGUF model files of a listing, split shards grouped: first-shard name -> all shard names."""
    out: dict[str, list[str]] = {}
    for f in sorted(files):
        base = f.rsplit("/", 1)[-1].lower()
        if not base.endswith(".gguf") or any(s in base for s in _SKIP_FILES):
            continue
        info = split_info(f)
        if info is None:
            out[f] = [f]
        elif info[1] == 1:
            out[f] = split_names(f)
    return out


def choose_quant(repo: str, quant: str, listing: list[str]) -> list[str]:
    """The file (or split shards) of ``repo`` carrying ``quant``; clear errors on no match / ambiguity."""
    groups = gguf_groups(listing)
    if not groups:
        raise ModelNotFoundError(f"{repo} has no GGUF model files", hint="is this a GGUF repository?")
    tagged = {first: quant_of(first) for first in groups}
    available = sorted({q for q in tagged.values() if q})
    exact = [f for f, q in tagged.items() if q == quant]
    chosen = exact or [f for f, q in tagged.items() if q and q.startswith(quant + "_")]
    avail_text = ", ".join(available) if available else "(no quantization tags in the file names)"
    if not chosen:
        raise ModelNotFoundError(
            f"no GGUF file in {repo} matches {quant!r}; available: {avail_text}",
            hint=f"pick one, e.g. 'localinfer pull {repo}:{available[0]}'" if available else f"name the file: {repo}/<file>.gguf",
        )
    if len(chosen) > 1:
        listed = ", ".join(f"{f} ({tagged[f]})" for f in chosen)
        raise UsageError(
            f"{quant!r} is ambiguous in {repo}: {listed}; available: {avail_text}",
            hint=f"give the exact quant (e.g. {repo}:{tagged[chosen[0]]}) or the file: {repo}/{chosen[0]}",
        )
    return groups[chosen[0]]
