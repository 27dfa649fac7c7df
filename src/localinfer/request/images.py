"""Images in a request: bounded and checked here from their headers (Pillow), decoded only when the
engine asks for their pixels.

Every surface (``run --image``, chat's ``/image``, batch lines, serve's wires) turns what it was given
into :class:`Image` values with :func:`from_bytes`, :func:`from_file` or :func:`from_data_uri`: the
encoded bytes, and the size the header gives (nothing is decoded yet); a message that holds images
carries them in its ``"images"`` key, one for each :data:`MARKER` in its ``content``, in order
(:func:`message`, :func:`content_parts`: one rule, llama.cpp's, for where the markers go).
``engine.vision`` reads :meth:`Image.pixels` and ``sha256``.

Bounds, all checked before anything is decoded: the encoded size, each image's pixel count (from its
header: a decompression bomb is refused without being expanded), and per request (every message
together: :func:`check_request`) the number of images and their pixels. The projector check
(:func:`for_model`) also comes before any decode. Decoding reduces a large image to at most
:data:`DECODE_PIXELS` (libmtmd resizes to the projector's input anyway). A bad image is an
:class:`ImageError` (a usage error: exit 2, a 400) that names it.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple

from localinfer.errors import UsageError

MARKER = "<__media__>"  # where an image goes in a message's text (libmtmd's default marker)
MAX_IMAGE_BYTES = 20 * 1024 * 1024
MAX_PIXELS = 40_000_000  # about 6300 x 6300
MAX_SIDE = 16384
MAX_ASPECT = 100  # a 1 x 5000 strip resizes to nothing a projector can see; some preprocessors divide by it
MAX_IMAGES = 16  # per request
# Per request, all messages together, counted from the headers: 16 photos of 12 MP (4000 x 3000) pass;
# five 6000 x 6000 images (36 MP each: an 11 KB 1-bit PNG decodes to 108 MB of RGB) are the most that do.
MAX_REQUEST_PIXELS = 200_000_000
# Decoded no larger than this (JPEG's draft, then a resize): libmtmd resizes every image to its
# projector's input, a few megapixels at most by default (fixed 0.2-1 MP inputs; tiled or dynamic
# resolution ones, Qwen2-VL's, MiniCPM-V's, up to about 3 MP), so 8 MP leaves it well over twice
# that; a photo of 8 MP (3264 x 2448) or less is decoded as it is.
DECODE_PIXELS = 8_000_000
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif", "BMP": "image/bmp"}


class ImageError(UsageError):
    """An image we cannot take (not an image, too big, too many): the message names it."""


class Pixels(NamedTuple):
    """An image decoded: RGB, row by row (``width * height * 3`` bytes)."""

    width: int
    height: int
    rgb: bytes


@dataclass(frozen=True)
class Image:
    """One image as it came: its encoded bytes and the size its header gives; decoded (once, when
    the engine asks) by :meth:`pixels`."""

    name: str  # how the user named it (a file, "messages[0].content[1]")
    width: int  # as encoded (the header's): what the bounds count; pixels() may be smaller
    height: int
    data: bytes = field(repr=False)
    sha256: str = ""  # of the encoded bytes: the KV cache knows an image again by it
    format: str = "PNG"  # Pillow's name (FORMATS)

    def pixels(self) -> Pixels:
        """The image as RGB, reduced to at most DECODE_PIXELS; an ImageError if it cannot be decoded."""
        return self._decoded

    @property
    def rgb(self) -> bytes:
        return self._decoded.rgb

    @cached_property
    def _decoded(self) -> Pixels:  # kept: a chat renders its images again every turn
        return _decode(self.data, self.name)


def from_bytes(data: bytes, name: str) -> Image:
    """``data`` (PNG, JPEG, WebP, GIF's first frame, BMP) as an Image, within the bounds: only its
    header is read (the format and size), nothing is decoded."""
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(f"image {name} is {len(data)} bytes, more than the {MAX_IMAGE_BYTES} allowed")
    with _opened(data, name) as img:
        w, h = img.size
        fmt = img.format or "PNG"
        _check_size(name, w, h)
    import hashlib  # not at import: OpenSSL's load is a start-up cost of every run

    return Image(name, w, h, data, hashlib.sha256(data).hexdigest(), fmt)


def _opened(data: bytes, name: str) -> Any:
    """Pillow's lazy image (the header read), or an ImageError naming ``name``."""
    from PIL import Image as PILImage

    PILImage.MAX_IMAGE_PIXELS = MAX_PIXELS  # Pillow's own bomb check, for any path we do not cover
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PILImage.DecompressionBombWarning)  # refused by _check_size, by name
            return PILImage.open(io.BytesIO(data), formats=FORMATS)
    except PILImage.DecompressionBombError:
        raise ImageError(f"image {name} is too large to decode (a decompression bomb?)") from None
    except Exception as exc:  # Pillow's errors are many (UnidentifiedImageError, OSError, SyntaxError...)
        raise ImageError(f"{name} is not an image we can read (PNG, JPEG, WebP, GIF or BMP): {_first_line(exc)}") from None


def _decode(data: bytes, name: str) -> Pixels:
    """Decode to RGB; an image of more than DECODE_PIXELS is reduced to about that many, keeping its
    shape (JPEG's draft decodes at 1/2-1/8 scale; the rest are decoded and resized in one step)."""
    from PIL import Image as PILImage

    with _opened(data, name) as img:
        try:
            img.seek(0)
            w, h = img.size
            _check_size(name, w, h)  # the bytes are the ones parsed: the same header
            if w * h <= DECODE_PIXELS:
                out = img.convert("RGB")
            else:
                scale = (DECODE_PIXELS / (w * h)) ** 0.5
                size = (max(1, int(w * scale)), max(1, int(h * scale)))
                img.draft("RGB", size)  # JPEG only: decoded no smaller than size
                # resize takes no 1-bit image (L keeps its one byte a pixel, RGB would triple it)
                base = img.convert("L") if img.mode == "1" else img.convert("RGB")
                out = base.resize(size, PILImage.Resampling.BICUBIC, reducing_gap=2.0).convert("RGB")
            return Pixels(out.width, out.height, out.tobytes())
        except ImageError:
            raise
        except PILImage.DecompressionBombError:
            raise ImageError(f"image {name} is too large to decode (a decompression bomb?)") from None
        except Exception as exc:
            raise ImageError(f"image {name} could not be decoded: {_first_line(exc)}") from None


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


def check_request(images: Any) -> None:
    """A request's images (every message's), counted and their pixels summed from the headers
    before any is decoded."""
    check_count(len(images))
    total = sum(i.width * i.height for i in images)
    if total > MAX_REQUEST_PIXELS:
        raise ImageError(f"the images of one request hold {total} pixels: at most {MAX_REQUEST_PIXELS} in all are allowed")


def joined(parts: Any) -> str:
    """A message's content from its parts in order (texts, and :data:`MARKER` for each image), as
    llama.cpp's server and mtmd-cli render them: no separator at a marker, before or after (one rule
    for every surface: the same image and text give the same prompt through any of them)."""
    return "".join(parts)


def message(role: str, text: str, images: list[Image] | tuple[Image, ...], *, where: str = "the prompt") -> dict[str, Any]:
    """A message with images: those ``text`` does not place (with :data:`MARKER`) go before it, as
    image parts before a text part would."""
    placed = text.count(MARKER)
    if placed > len(images):
        raise ImageError(f"{where} places {placed} images ({MARKER}) but {len(images)} were given")
    return {"role": role, "content": joined([MARKER] * (len(images) - placed) + [text]), "images": tuple(images)}


def gather(messages: Any) -> tuple[Image, ...]:
    """The images of a conversation, in order (the order of the markers in the rendered prompt),
    within the request's bounds (:func:`check_request`)."""
    out: list[Image] = []
    for m in messages:
        if isinstance(m, dict) and m.get("images"):
            out.extend(m["images"])
    check_request(out)
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
    check_request([*gather(request.messages), *images])
    last = request.messages[-1]
    messages = (*request.messages[:-1], message(last["role"], str(last.get("content") or ""), images))
    return dataclasses.replace(request, messages=messages)


def read_files(paths: list[str]) -> list[Image]:
    """``--image`` files, counted before any is read."""
    check_count(len(paths))
    return [from_file(p) for p in paths]


def for_model(loaded: Any, request: Any) -> tuple[Image, ...]:
    """A core Request's images, refused where the model (a generate.LoadedModel) takes none (before
    any is decoded: the engine decodes them as it tokenizes the prompt)."""
    if request.raw_text is not None or not any("images" in m for m in request.messages):
        return ()
    images = gather(request.messages)
    if images and loaded.projector is None:
        raise ImageError(f"model {loaded.name} takes no images (it has no projector)",
                         hint="pull it with its projector: localinfer pull MODEL --mmproj FILE")  # fmt: skip
    return images


def _refused(fail: Any, field: str, message: str) -> Exception:
    """``fail(field, message)`` (a rules.RuleError) whose message is ``message`` alone: it names what it is about."""
    err = fail(field, message)
    err.args = (message,)
    return err


def counted(where: str, messages: Any, fail: Any) -> None:
    """Every message's images counted together, none decoded yet (rules.messages: a request's
    messages); ``fail`` as content_parts'."""
    try:
        gather(messages)
    except ImageError as exc:
        raise _refused(fail, where, str(exc)) from None


def content_parts(where: str, content: list[Any], check_text: Any, fail: Any) -> tuple[str, tuple[Image, ...]]:
    """Content parts - text (``check_text(field, value)``: rules.text), OpenAI's ``image_url`` (a data:
    URI; remote URLs refused) and the ``{"type": "image", "image": Image}`` parts the other wires
    read (made by serve.wires.images, never read from JSON, which holds no Image) - as the text with
    a :data:`MARKER` where each image was (:func:`joined`), and the images. A bad part: ``fail(field, message)``
    (rules.RuleError, which does not import this module)."""

    def refused(field: str, message: str) -> Exception:
        return _refused(fail, field, message)

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
    return joined(texts), tuple(pictures)


def openai_message(m: dict[str, Any]) -> dict[str, Any]:
    """A message holding images as OpenAI's content parts (text, and data URIs of the images' own
    bytes where the markers were): how a chat is saved, and read back by rules.message."""
    if not m.get("images"):
        return m
    parts: list[dict[str, Any]] = []
    texts = str(m.get("content") or "").split(MARKER)
    for i, text in enumerate(texts):
        if text:
            parts.append({"type": "text", "text": text})
        if i < len(m["images"]) and i < len(texts) - 1:
            img = m["images"][i]  # the bytes as given: not decoded, and the same sha256 on the other side
            url = f"data:{MIME.get(img.format, 'image/png')};base64," + base64.b64encode(img.data).decode()
            parts.append({"type": "image_url", "image_url": {"url": url}})
    return {**{k: v for k, v in m.items() if k != "images"}, "content": parts}


def wire_messages(messages: Any) -> list[dict[str, Any]]:
    """A conversation as it crosses to a server (``--endpoint``, the resident server's private
    socket): images as OpenAI's ``image_url`` parts (:func:`openai_message`: data URIs of the same
    bytes), every other message and key as given; serve reads them back with ``rules.message``."""
    return [openai_message(dict(m)) for m in messages]
