"""Image files a batch line names: ``file://`` URLs in OpenAI ``image_url`` parts, read only under the
directory the job names (``batch --image-dir DIR``) - llama-server's convention (``file://`` URLs
relative to its ``--media-path``).

A path that leads outside DIR (``..``, a symlink out, an absolute path elsewhere), a file that is not
an image, or a ``file://`` URL without ``--image-dir`` is that line's error; the job goes on. A part
read here becomes the image part ``rules.message`` takes from the wires that read their own
(``{"type": "image", "image": Image}``), so the rest of the line is checked as any other.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from localinfer.request.rules import RuleError

SCHEME = "file://"


def read_file_parts(messages: Any, image_dir: Path | None) -> Any:
    """``messages`` (a line's JSON) with each ``file://`` image part read (its header: decoded later, by the engine); as given
    where it names none (and where it is not a list of messages: the rules name what is wrong)."""
    if not isinstance(messages, list):
        return messages
    named = [(i, j) for i, m in enumerate(messages) if isinstance(m, dict) and isinstance(m.get("content"), list)
             for j, part in enumerate(m["content"]) if _file_url(part) is not None]  # fmt: skip
    if not named:
        return messages
    from localinfer.request.images import MAX_IMAGES

    if len(named) > MAX_IMAGES:  # counted before any file is read
        raise RuleError("messages", f"names {len(named)} image files: at most {MAX_IMAGES} images in one request are allowed")
    out = [dict(m) if isinstance(m, dict) else m for m in messages]
    for i, j in named:
        where = f"messages[{i}].content[{j}].image_url"
        out[i]["content"] = list(out[i]["content"])
        out[i]["content"][j] = {"type": "image", "image": read_image(where, _file_url(messages[i]["content"][j]) or "", image_dir)}
    return out


def _file_url(part: Any) -> str | None:
    if not isinstance(part, dict) or part.get("type") != "image_url":
        return None
    ref = part.get("image_url")
    url = ref.get("url") if isinstance(ref, dict) else ref
    return url if isinstance(url, str) and url.startswith(SCHEME) else None


def read_image(where: str, url: str, image_dir: Path | None) -> Any:
    """The image ``url`` (``file://PATH``, PATH relative to ``image_dir``) names, as an Image."""
    from localinfer.request.images import ImageError, from_bytes, read_bounded

    name = url[len(SCHEME) :]
    if image_dir is None:
        raise RuleError(where, f"names a file ({url}): image files are read only under the directory the job names; "
                               "pass --image-dir DIR (paths are relative to it)")  # fmt: skip
    if not name or "\0" in name:
        raise RuleError(where, f"{url} names no file")
    root = Path(os.path.realpath(image_dir))
    path = Path(os.path.realpath(root / name))  # every link followed: where the bytes really are
    if path != root and root not in path.parents:
        raise RuleError(where, f"{name} is outside --image-dir {image_dir}: only files under it are read")
    try:
        return from_bytes(read_bounded(path, name), name)
    except ImageError as exc:
        raise RuleError(where, str(exc)) from None
