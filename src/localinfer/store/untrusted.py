"""Checks for values that come from outside: the Hub's answers and the manifest on disk.

Such a value names files in the store (a digest), goes into URLs (a commit) or reaches the terminal
(any text), so it is checked for its exact shape before any of that, and escaped when shown.
"""

from __future__ import annotations

import re
from typing import Any

_SHA256 = re.compile(r"[0-9a-f]{64}")
_COMMIT = re.compile(r"[0-9a-f]{40}")  # a git commit id, as the Hub (and huggingface_hub) give it
MAX_FILE_SIZE = 10**18  # no model file is an exabyte: a bigger size is a lie, not a model
REFUSED_HINT = "nothing was downloaded; the repository, or the server at HF_ENDPOINT, sent values that cannot be used"


def is_sha256(value: Any) -> bool:
    """64 lowercase hex digits, nothing else (``re.fullmatch``: no trailing newline either)."""
    return isinstance(value, str) and _SHA256.fullmatch(value) is not None


def is_commit(value: Any) -> bool:
    return isinstance(value, str) and _COMMIT.fullmatch(value) is not None


def is_size(value: Any) -> bool:
    """A byte count: a non-negative int (not a bool, not a float, not a string) within reason."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_FILE_SIZE


def shown(value: Any, limit: int = 80) -> str:
    """``value`` as it may be printed: shortened, every non-printable character escaped (ESC, CSI, bidi)."""
    text = value if isinstance(value, str) else repr(value)
    safe = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text[:limit])
    return safe + ("..." if len(text) > limit else "")


def projector_problem(rec: Any) -> str | None:
    """What is wrong with a manifest entry's ``mmproj`` record (store.projector), or None."""
    if rec is None:
        return None
    if not isinstance(rec, dict) or not is_sha256(rec.get("sha256")) or not isinstance(rec.get("filename"), str):
        return "a projector without a valid sha256 or name"
    if rec.get("path") is not None and not isinstance(rec.get("path"), str):
        return "a projector with a bad path"
    return None
