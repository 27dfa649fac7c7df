"""Images are counted and bounded before anything decodes them (issue 52): small-on-the-wire PNGs
that decode to 108 MB each are refused on every wire, across messages, without a decode (a spy on
Pillow's decoder); a model without a projector refuses images before decoding; large images decode
reduced; and every entry renders an image and its text into one prompt (llama.cpp's rule)."""

from __future__ import annotations

import base64
import io
from types import SimpleNamespace
from typing import Any

import pytest
from projector import png

from localinfer.request import images
from localinfer.request.images import MARKER, ImageError

pytest.importorskip("starlette")

from test_serve import FakeEngine, _state, call  # noqa: E402 - after the skip

Q = "Describe the image."


def bomb(side: int = 6000) -> bytes:
    """A 1-bit PNG of ``side`` x ``side``: some KB on the wire, ``side``² x 3 bytes as RGB."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("1", (side, side)).save(buf, "PNG", optimize=True)
    return buf.getvalue()


@pytest.fixture
def decodes(monkeypatch) -> list[Any]:
    """Every decode of an image file (Pillow's ImageFile.load), as it happens."""
    from PIL import ImageFile

    seen: list[Any] = []
    load = ImageFile.ImageFile.load

    def spy(self: Any) -> Any:
        seen.append(self.size)
        return load(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", spy)
    return seen


class VisionEngine(FakeEngine):
    """A model with a projector: preparing decodes the request's images, as the engine's tokenizer does."""

    vision = True
    loaded = SimpleNamespace(template=object())  # Ollama's routes ask whether the model has a chat template

    def prepare(self, request: Any, clamp: bool = False) -> Any:
        for img in images.gather(request.request.messages):
            img.pixels()
        return super().prepare(request)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _uri(data: bytes) -> str:
    return "data:image/png;base64," + _b64(data)


def _bodies(turns: list[list[bytes]]) -> list[tuple[str, dict]]:
    """The same user turns (each: its pictures, then the question) on every wire that takes images."""
    oai = [{"role": "user", "content": [*({"type": "image_url", "image_url": {"url": _uri(p)}} for p in t), {"type": "text", "text": Q}]}
           for t in turns]  # fmt: skip
    claude = [{"role": "user", "content": [*({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _b64(p)}}
                                             for p in t), {"type": "text", "text": Q}]} for t in turns]  # fmt: skip
    claude = [m for pair in zip(claude, [{"role": "assistant", "content": "ok"}] * len(claude)) for m in pair][:-1]
    responses = [{"role": "user", "content": [*({"type": "input_image", "image_url": _uri(p)} for p in t), {"type": "input_text", "text": Q}]}
                 for t in turns]  # fmt: skip
    ollama = [{"role": "user", "content": Q, "images": [_b64(p) for p in t]} for t in turns]
    out = [("/v1/chat/completions", {"messages": oai, "max_tokens": 4}),
           ("/v1/messages", {"model": "m", "max_tokens": 4, "messages": claude}),
           ("/v1/messages/count_tokens", {"model": "m", "messages": claude}),
           ("/v1/responses", {"model": "m", "input": responses, "max_output_tokens": 4}),
           ("/api/chat", {"model": "m", "stream": False, "messages": ollama})]  # fmt: skip
    if len(turns) == 1:
        out.append(("/api/generate", {"model": "m", "stream": False, "prompt": Q, "images": [_b64(p) for p in turns[0]]}))
    return out


@pytest.mark.parametrize("turns, needle", [
    ([[bomb()] * 6], "pixels: at most 200000000"),  # 6 x 36 MP: past the request's pixels, 6 images are few
    ([[bomb()] * 2] * 3, "pixels: at most 200000000"),  # across messages, each within any per-message bound
    ([[png(1)] * 9, [png(2)] * 8], "17 images in one request"),  # 16 per message was the only bound on some wires
])  # fmt: skip
def test_every_wire_refuses_a_request_past_its_image_bounds_before_decoding_any(turns, needle, decodes):
    state = _state(VisionEngine())
    for path, body in _bodies(turns):
        status, _, raw = call(state, "POST", path, body)
        assert status == 400 and needle in raw.decode(), (path, raw[:300])
        assert decodes == [], path  # nothing was decoded: the bounds come first


def test_a_request_within_the_bounds_is_decoded_reduced(decodes):
    state = _state(VisionEngine())
    status, _, raw = call(state, "POST", "/v1/chat/completions", _bodies([[bomb()] * 2])[0][1])
    assert status == 200, raw
    assert decodes == [(6000, 6000)] * 2  # once each, by the engine
    px = images.from_bytes(bomb(), "b.png").pixels()
    assert px.width == px.height and px.width * px.height <= images.DECODE_PIXELS < 4 * px.width * px.height
    assert len(px.rgb) == px.width * px.height * 3
    small = images.from_bytes(png(1, (48, 40)), "a.png")  # small images are decoded as they are
    assert (small.width, small.height) == small.pixels()[:2] == (48, 40)


@pytest.mark.parametrize("parse", ["openai", "anthropic"])
def test_a_model_without_a_projector_refuses_images_before_decoding(parse, decodes):
    from localinfer.serve.wires import anthropic
    from localinfer.serve.wires.openai import parse_request

    body = dict(_bodies([[png(1)]]))["/v1/chat/completions" if parse == "openai" else "/v1/messages"]
    env = parse_request(body, "chat") if parse == "openai" else anthropic.parse(body)
    text_model = SimpleNamespace(projector=None, name="plain-model")
    with pytest.raises(ImageError, match="model plain-model takes no images"):
        images.for_model(text_model, env.request)
    assert decodes == []


def test_run_and_every_wire_render_an_image_and_its_text_as_one_prompt():
    """run --image, chat's /image (images.message) and each wire's parts (rules.message): one content,
    llama.cpp's - the marker then the text, nothing between (mtmd-cli and llama-server agree)."""
    from localinfer.serve.wires import anthropic
    from localinfer.serve.wires.ollama import chat as ollama_wire
    from localinfer.serve.wires import responses as responses_api
    from localinfer.serve.wires.openai import parse_request

    img = images.from_bytes(png(1), "p.png")
    expected = MARKER + Q
    assert images.message("user", Q, [img])["content"] == expected
    bodies = dict(_bodies([[png(1)]]))
    got = {
        "openai": parse_request(bodies["/v1/chat/completions"], "chat").request.messages[-1],
        "anthropic": anthropic.parse(bodies["/v1/messages"]).request.messages[-1],
        "responses": responses_api.parse(bodies["/v1/responses"]).request.messages[-1],
        "ollama chat": ollama_wire.parse_chat(bodies["/api/chat"], "m").request.request.messages[-1],
        "ollama generate": ollama_wire.parse_generate(bodies["/api/generate"], "m", templated=True).request.request.messages[-1],
    }
    for wire, m in got.items():
        assert (m["content"], [i.sha256 for i in m["images"]]) == (expected, [img.sha256]), wire


def test_a_message_with_images_crosses_the_wire_as_it_is():
    """--endpoint and saved chats: the images' own bytes (not decoded, the same sha256), the content
    read back as it was."""
    from localinfer.request import rules

    a, b = images.from_bytes(png(1), "a.png"), images.from_bytes(png(2), "b.png")
    for m in (images.message("user", Q, [a, b]), images.message("user", f"Is {MARKER} like {MARKER}?", [a, b])):
        back = rules.message("m", images.openai_message(m))
        assert back["content"] == m["content"] and [i.sha256 for i in back["images"]] == [a.sha256, b.sha256]


def test_run_counts_its_images_pixels_before_decoding(decodes, tmp_path):
    from localinfer.request.request import build

    files = []
    for i in range(6):
        files.append(tmp_path / f"{i}.png")
        files[-1].write_bytes(bomb())
    req = build(messages=[{"role": "user", "content": Q}])
    with pytest.raises(ImageError, match="pixels: at most"):
        images.attach(req, images.read_files([str(f) for f in files]))
    assert decodes == []
