"""Images on serve's other wires (Anthropic's blocks, Ollama's ``images``, the Responses API's
``input_image``): read here (their headers: nothing is decoded before the whole request is counted),
each naming its own field in a 400 (a RuleError, which every wire turns into its own error shape), and
handed on as image parts in OpenAI-style messages, which ``rules.message`` reads
(localinfer.request.images.content_parts)."""

from __future__ import annotations

from typing import Any

from localinfer.request.images import MAX_IMAGES, ImageError, from_base64, from_data_uri
from localinfer.request.rules import RuleError


def wire_error(exc: ImageError, field: str) -> RuleError:
    """An ImageError as the wires' RuleError, its message kept whole."""
    err = RuleError(field, str(exc))
    err.args = (str(exc),)
    return err


def _read(field: str, read: Any, *args: Any) -> dict[str, Any]:
    try:
        return {"type": "image", "image": read(*args, field)}
    except ImageError as exc:
        raise wire_error(exc, field) from None


def url_part(where: str, url: Any) -> dict[str, Any]:
    """The Responses API's ``input_image`` (its ``image_url``: a data: URI)."""
    return _read(where, from_data_uri, url)


def anthropic_part(where: str, block: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic ``image`` block (``source``: base64 with its media type; a URL is refused)."""
    src = block.get("source")
    if not isinstance(src, dict) or src.get("type") != "base64":
        kind = src.get("type") if isinstance(src, dict) else src
        raise wire_error(ImageError(f"{where}.source must be base64 image data, not {kind!r} (this server fetches no URLs)"), where)
    return _read(f"{where}.source.data", from_base64, src.get("data"))


def base64_parts(where: str, images: Any) -> list[dict[str, Any]]:
    """Ollama's ``images``: base64 strings (data: URIs taken too)."""
    if not isinstance(images, list):
        raise wire_error(ImageError(f"{where} must be a list of base64 images"), where)
    if len(images) > MAX_IMAGES:
        raise wire_error(ImageError(f"{len(images)} images in one request: at most {MAX_IMAGES} are allowed"), where)
    return [_read(f"{where}[{k}]", from_data_uri if isinstance(i, str) and i.startswith("data:") else from_base64, i)
            for k, i in enumerate(images)]  # fmt: skip


def with_images(text: Any, parts: list[dict[str, Any]]) -> Any:
    """A message's content: ``text`` alone, or the image parts then the text."""
    return [*parts, {"type": "text", "text": text}] if parts else text
