"""The pip command that adds one of localinfer's optional extras, for the way this copy was installed:
from a checkout (`pip install .` or `-e .`) the name `localinfer[serve]` means nothing to pip, but
the checkout's path does."""

from __future__ import annotations

import shlex


def pip_install(extra: str) -> str:
    """``pip install 'localinfer[EXTRA]'``, or ``pip install -e '/path/to/checkout[EXTRA]'``."""
    import importlib.metadata
    import json
    from urllib.parse import unquote, urlparse

    try:
        direct = json.loads(importlib.metadata.distribution("localinfer").read_text("direct_url.json") or "null")
    except (importlib.metadata.PackageNotFoundError, ValueError):
        direct = None
    url = urlparse(direct.get("url", "")) if isinstance(direct, dict) else None
    if url is not None and url.scheme == "file" and isinstance(direct.get("dir_info"), dict):
        editable = "-e " if direct["dir_info"].get("editable") else ""
        return f"pip install {editable}{shlex.quote(f'{unquote(url.path)}[{extra}]')}"
    return f"pip install {shlex.quote(f'localinfer[{extra}]')}"
