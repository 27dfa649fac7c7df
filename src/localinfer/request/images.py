"""Images in a request: decoded (Pillow), bounded and checked here, before the engine sees them.

Every surface (``run --image``, chat's ``/image``, batch lines, serve's wires) turns what it was given
into :class:`Image` values with :func:`from_bytes`, :func:`from_file` or :func:`from_data_uri`; a
message that holds images carries them in its ``"images"`` key, one for each :data:`MARKER` in its
``content``, in order (:func:`message`, :func:`content_parts`). ``engine.vision`` reads ``rgb``,
``width``, ``height`` and ``sha256``.

Bounds: the encoded size, the pixel count (checked from the header before decoding: a decompression
bomb is refused without being expanded) and the images per request. A bad image is an
:class:`ImageError` (a usage error: exit 2, a 400) that names it.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localinfer.errors import UsageError

MARKER = "<__media__>"  # where an image goes in a message's text (libmtmd's default marker)
MAX_IMAGE_BYTES = 20 * 1024 * 1024
MAX_PIXELS = 40_000_000  # about 6300 x 6300
MAX_SIDE = 16384
MAX_ASPECT = 100  # a 1 x 5000 strip resizes to nothing a projector can see; some preprocessors divide by it
MAX_IMAGES = 16  # per request
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")


class ImageError(UsageError):
    """An image we cannot take (not an image, too big, too many): the message names it."""


@dataclass(frozen=True)
class Image:
    """One decoded image: RGB pixels, row by row (``width * height * 3`` bytes)."""

    name: str  # how the user named it (a file, "messages[0].content[1]")
    width: int
    height: int
    rgb: bytes = field(repr=False)
    sha256: str = ""  # of the encoded bytes: the KV cache knows an image again by it


def from_bytes(data: bytes, name: str) -> Image:
    """Decode ``data`` (PNG, JPEG, WebP, GIF's first frame, BMP) to RGB, within the bounds."""
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(f"image {name} is {len(data)} bytes, more than the {MAX_IMAGE_BYTES} allowed")
    from PIL import Image as PILImage

    PILImage.MAX_IMAGE_PIXELS = MAX_PIXELS  # Pillow's own bomb check, for any path we do not cover
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PILImage.DecompressionBombWarning)  # refused below, by name
            img = PILImage.open(io.BytesIO(data), formats=FORMATS)
        with img:
            w, h = img.size
            _check_size(name, w, h)
            img.seek(0)
            rgb = img.convert("RGB")
            pixels = rgb.tobytes()
    except ImageError:
        raise
    except PILImage.DecompressionBombError:
        raise ImageError(f"image {name} is too large to decode (a decompression bomb?)") from None
    except Exception as exc:  # Pillow's errors are many (UnidentifiedImageError, OSError, SyntaxError...)
        raise ImageError(f"{name} is not an image we can read (PNG, JPEG, WebP, GIF or BMP): {_first_line(exc)}") from None
    import hashlib  # not at import: OpenSSL's load is a start-up cost of every run

    return Image(name, w, h, pixels, hashlib.sha256(data).hexdigest())


def _check_size(name: str, w: int, h: int) -> None:
    if w <= 0 or h <= 0 or w > MAX_SIDE or h > MAX_SIDE or w * h > MAX_PIXELS:
        raise ImageError(f"image {name} is {w}x{h} pixels: at most {MAX_SIDE} a side and {MAX_PIXELS} in all are allowed")
    if max(w, h) > MAX_ASPECT * min(w, h):
        raise ImageError(f"image {name} is {w}x{h} pixels: one side is more than {MAX_ASPECT} times the other")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def from_file(path: str | Path) -> Image:
    """An image file (``-`` and URLs are refused: we never read an image from elsewhere silently)."""
    text = str(path)
    if text == "-":
        raise ImageError("--image - : images are not read from stdin; give a file")
    if "://" in text:
        raise ImageError(f"--image {text}: URLs are not fetched; download the image and give the file")
    return from_bytes(read_bounded(Path(text).expanduser(), f"image {text}"), text)


def read_bounded(path: Path, label: str) -> bytes:
    """The bytes of the image file ``path`` (a regular file of at most MAX_IMAGE_BYTES); ImageError
    naming it as ``label`` otherwise."""
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise ImageError(f"{label} is not a file")
        if size > MAX_IMAGE_BYTES:
            raise ImageError(f"{label} is {size} bytes, more than the {MAX_IMAGE_BYTES} allowed")
        return path.read_bytes()
    except OSError as exc:
        raise ImageError(f"cannot read {label}: {exc.strerror or exc}") from None


def from_base64(data: Any, name: str) -> Image:
    """Base64 text (Anthropic's and Ollama's images)."""
    if not isinstance(data, str) or not data:
        raise ImageError(f"{name} must be base64 image data")
    if len(data) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise ImageError(f"image {name} is more than the {MAX_IMAGE_BYTES} bytes allowed")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError(f"{name} is not valid base64") from None
    return from_bytes(raw, name)


def from_data_uri(uri: Any, name: str) -> Image:
    """``data:image/png;base64,...``; a remote URL is refused (we do not fetch)."""
    if not isinstance(uri, str):
        raise ImageError(f"{name} must be a data: URI")
    if uri.startswith(("http://", "https://")):
        raise ImageError(f"{name}: remote image URLs are refused (nothing is fetched); send the image as a data: URI")
    head, comma, body = uri.partition(",")
    if not head.startswith("data:") or not comma or not head.endswith(";base64"):
        raise ImageError(f"{name} must be a data: URI with base64 data (data:image/png;base64,...)")
    return from_base64(body, name)


def check_count(n: int) -> None:
    if n > MAX_IMAGES:
        raise ImageError(f"{n} images in one request: at most {MAX_IMAGES} are allowed")


def message(role: str, text: str, images: list[Image] | tuple[Image, ...], *, where: str = "the prompt") -> dict[str, Any]:
    """A message with images: those ``text`` does not place (with :data:`MARKER`) go before it."""
    placed = text.count(MARKER)
    if placed > len(images):
        raise ImageError(f"{where} places {placed} images ({MARKER}) but {len(images)} were given")
    before = "".join(MARKER + "\n" for _ in range(len(images) - placed))
    return {"role": role, "content": before + text, "images": tuple(images)}


def gather(messages: Any) -> tuple[Image, ...]:
    """The images of a conversation, in order (the order of the markers in the rendered prompt)."""
    out: list[Image] = []
    for m in messages:
        if isinstance(m, dict) and m.get("images"):
            out.extend(m["images"])
    check_count(len(out))
    return tuple(out)


def text_without_marker(text: str, where: str) -> str:
    """Text from a wire: the marker is ours, so text that holds it is refused (it would move an image)."""
    if MARKER in text:
        raise ImageError(f"{where} contains {MARKER}, which marks images here: remove it")
    return text


def attach(request: Any, images: list[Image] | tuple[Image, ...]) -> Any:
    """``request`` (a core Request) with ``images`` in its last message (``run --image``)."""
    import dataclasses

    if not images:
        return request
    if request.raw_text is not None:
        raise ImageError("images go through the chat template: not with --raw, nor to a model without one")
    check_count(len(images))
    last = request.messages[-1]
    messages = (*request.messages[:-1], message(last["role"], str(last.get("content") or ""), images))
    return dataclasses.replace(request, messages=messages)


def read_files(paths: list[str]) -> list[Image]:
    """``--image`` files, counted before any is read."""
    check_count(len(paths))
    return [from_file(p) for p in paths]


def for_model(loaded: Any, request: Any) -> tuple[Image, ...]:
    """A core Request's images, refused where the model (a generate.LoadedModel) takes none."""
    if request.raw_text is not None or not any("images" in m for m in request.messages):
        return ()
    images = gather(request.messages)
    if images and loaded.projector is None:
        raise ImageError(f"model {loaded.name} takes no images (it has no projector)",
                         hint="pull it with its projector: localinfer pull MODEL --mmproj FILE")  # fmt: skip
    return images


def content_parts(where: str, content: list[Any], check_text: Any, fail: Any) -> tuple[str, tuple[Image, ...]]:
    """Content parts - text (``check_text(field, value)``: rules.text), OpenAI's ``image_url`` (a data:
    URI; remote URLs refused) and the ``{"type": "image", "image": Image}`` parts the other wires
    decoded (made by serve.image_parts, never read from JSON, which holds no Image) - as the text with
    a :data:`MARKER` where each image was, and the images. A bad part: ``fail(field, message)``
    (rules.RuleError, which does not import this module)."""

    def refused(field: str, message: str) -> Exception:
        err = fail(field, message)
        err.args = (message,)  # the message names what it is about already
        return err

    def decoded(field: str, decode: Any, value: Any) -> Any:
        try:
            return decode(value, field)
        except ImageError as exc:
            raise refused(field, str(exc)) from None

    texts: list[str] = []
    pictures: list[Image] = []
    for j, part in enumerate(content):
        w = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and not set(part) - {"type", "text"}:
            texts.append(decoded(w, text_without_marker, check_text(f"{w}.text", part.get("text"))))
            continue
        if kind == "image" and isinstance(part.get("image"), Image):
            pictures.append(part["image"])
        elif kind == "image_url" and not set(part) - {"type", "image_url"} and part.get("image_url") is not None:
            ref = part["image_url"]
            pictures.append(decoded(f"{w}.image_url", from_data_uri, ref.get("url") if isinstance(ref, dict) else ref))
        else:
            raise fail(w, 'must be a text part {"type": "text", "text": ...} or an image part '
                          '{"type": "image_url", "image_url": {"url": "data:image/...;base64,..."}}')  # fmt: skip
        texts.append(MARKER)
        if len(pictures) > MAX_IMAGES:
            raise refused(where, f"more than {MAX_IMAGES} images in one request")
    return "".join(texts), tuple(pictures)


def openai_message(m: dict[str, Any]) -> dict[str, Any]:
    """A message holding images as OpenAI's content parts (text, and PNG data URIs where the markers
    were): how a chat is saved, and read back by rules.message."""
    if not m.get("images"):
        return m
    import io

    from PIL import Image as PILImage

    parts: list[dict[str, Any]] = []
    texts = str(m.get("content") or "").split(MARKER)
    for i, text in enumerate(texts):
        if text:
            parts.append({"type": "text", "text": text})
        if i < len(m["images"]) and i < len(texts) - 1:
            img = m["images"][i]
            buf = io.BytesIO()
            PILImage.frombytes("RGB", (img.width, img.height), img.rgb).save(buf, "PNG")
            parts.append({"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()}})
    return {**{k: v for k, v in m.items() if k != "images"}, "content": parts}


def wire_messages(messages: Any) -> list[dict[str, Any]]:
    """A conversation as it crosses to a server (``--endpoint``, the resident server's private
    socket): images as OpenAI's ``image_url`` parts (:func:`openai_message`: PNG data URIs, the same
    pixels), every other message and key as given; serve reads them back with ``rules.message``."""
    return [openai_message(dict(m)) for m in messages]
