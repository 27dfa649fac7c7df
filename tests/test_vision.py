"""Images in (issue 41): decoding and bounds (localinfer.request.images, no model), then the real libmtmd with
a projector the tests make (tests/projector.py: random weights, SmolLM2's width) on SmolLM2-135M -
through the engine, `pull --mmproj` / `run --image`, and bad inputs as one line."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
from pathlib import Path

import pytest
from conftest import run_cli as _run_cli
from fakehub import fake_hub, hub_env  # noqa: F401 - fixtures
from projector import bomb_png, image_tokens, png, wide_png, write_projector

from localinfer.request import images
from localinfer.request.images import ImageError


def run_cli(*args: str):
    return _run_cli(*args, text=True)


@pytest.fixture(scope="session")
def projector_file(tmp_path_factory):
    return write_projector(tmp_path_factory.mktemp("projector") / "mmproj-test.gguf")


# -- decoding and bounds (no model) ---------------------------------------------------------------
def test_an_image_decodes_to_rgb_with_its_digest():
    img = images.from_bytes(png(1, (48, 40)), "a.png")
    assert (img.width, img.height, len(img.rgb)) == (48, 40, 48 * 40 * 3)
    assert img.sha256 != images.from_bytes(png(2, (48, 40)), "b.png").sha256


@pytest.mark.parametrize("data, needle", [
    (b"hello, not an image", "not an image"),
    (wide_png(), "100000x1 pixels"),
    (bomb_png(), "decompression bomb"),
    (bomb_png(7000), "7000x7000 pixels"),
    (wide_png(5000, 1), "more than 100 times"),
])  # fmt: skip
def test_bad_images_are_refused_by_name(data, needle):
    with pytest.raises(ImageError, match=needle) as exc:
        images.from_bytes(data, "upload.png")
    assert "upload.png" in str(exc.value)


def test_data_uris_base64_and_counts():
    uri = "data:image/png;base64," + base64.b64encode(png(3)).decode()
    assert images.from_data_uri(uri, "x").width == 48
    with pytest.raises(ImageError, match="remote image URLs are refused"):
        images.from_data_uri("https://example.com/cat.png", "messages[0].content[1]")
    with pytest.raises(ImageError, match="not valid base64"):
        images.from_base64("!!!", "images[0]")
    with pytest.raises(ImageError, match="100 images in one request"):
        images.check_count(100)


def test_images_go_before_the_text_unless_it_places_them():
    img = images.from_bytes(png(1), "a.png")
    m = images.message("user", "describe it", [img, img])
    assert m["content"] == f"{images.MARKER}{images.MARKER}describe it" and len(m["images"]) == 2  # as llama.cpp's
    placed = images.message("user", f"first {images.MARKER} then", [img])
    assert placed["content"] == f"first {images.MARKER} then"
    with pytest.raises(ImageError, match="places 2 images"):
        images.message("user", images.MARKER * 2, [img])


def test_the_memory_preflight_counts_the_projector():
    from localinfer.system.hardware import MemoryBudget
    from localinfer.system.preflight import less_projector

    budget = MemoryBudget(ram_available=1 << 30, ram_total=2 << 30)
    small, big = less_projector(budget, 1 << 20), less_projector(budget, 600 << 20)
    assert budget.ram_available - small.ram_available == (1 << 20) + (64 << 20)  # at least 64 MiB of compute
    assert budget.ram_available - big.ram_available == 900 << 20 and "projector" in big.notes[-1]


# -- the engine, on the real libmtmd ----------------------------------------------------------------
@pytest.fixture(scope="module")
def vision(smollm2_path, projector_file):
    from localinfer.engine.types import LoadOptions
    from localinfer.generate.loading import load
    from localinfer.store.resolve import resolve_model

    resolved = dataclasses.replace(resolve_model(str(smollm2_path)), mmproj=projector_file)
    loaded = load(resolved, LoadOptions(n_ctx=1024, n_threads=2))
    yield loaded
    loaded.close()


def _ask(loaded, pictures, text="What is in this picture?", *, fresh=True):
    from localinfer.request.sampling import SamplingOptions
    from localinfer.generate.run import generate
    from localinfer.request.request import build

    if fresh:
        loaded.model.reset()
    req = build(messages=[images.message("user", text, pictures)], sampling=SamplingOptions(temperature=0), max_tokens=12)
    return generate(loaded, req, lambda _t: None)


def test_an_image_is_in_the_prompt_and_steers_the_answer(vision):
    one, two = (images.from_bytes(png(s), f"{s}.png") for s in (1, 2))
    a, again, b = _ask(vision, [one]), _ask(vision, [one]), _ask(vision, [two])
    text_only = _ask(vision, [])
    n = image_tokens()
    assert a.stats.image_tokens == n and text_only.stats.image_tokens == 0
    assert n <= a.stats.prompt_tokens - text_only.stats.prompt_tokens <= n + 2  # the image, and its newline
    assert a.stats.image_encode_s > 0 and a.text
    assert again.text == a.text  # deterministic at temperature 0
    assert b.text != a.text  # another picture, another answer
    j = a.to_json()
    assert j["usage"]["image_tokens"] == n and j["timings"]["image_encode_ms"] > 0


def test_the_cache_is_reused_across_the_same_image(vision):
    one, two = (images.from_bytes(png(s), f"{s}.png") for s in (1, 2))
    _ask(vision, [one])
    same = _ask(vision, [one], fresh=False)
    assert same.stats.cached_tokens == same.stats.prompt_tokens - 1 and same.stats.image_encode_s == 0
    other = _ask(vision, [two], fresh=False)  # the prefix before the image is kept, not the image
    assert 0 < other.stats.cached_tokens < other.stats.prompt_tokens - image_tokens()
    assert other.stats.image_encode_s > 0


def test_an_image_to_a_text_model_names_the_model(vision):
    text_model = dataclasses.replace(vision, projector=None, name="plain-model")
    with pytest.raises(ImageError, match="model plain-model takes no images"):
        _ask(text_model, [images.from_bytes(png(1), "a.png")])


def test_a_projector_of_another_width_is_refused_at_load(vision, tmp_path):
    from localinfer.engine.vision import Projector
    from localinfer.errors import UsageError

    wrong = write_projector(tmp_path / "mmproj-640.gguf", out_width=640)
    with pytest.raises(UsageError, match="gives 640-wide embeddings but .* takes 576"):
        Projector(vision.model, wrong)


def test_a_projector_whose_markers_the_vocabulary_lacks_is_refused_not_aborted(vision, tmp_path):
    from localinfer.engine.vision import Projector
    from localinfer.errors import UsageError

    # SmolVLM's (idefics3) projector wraps images in <fake_token_around_image>, which SmolLM2 lacks:
    # libmtmd emits token -1 for it, on which llama_decode would assert and abort the process
    smolvlm = Projector(vision.model, write_projector(tmp_path / "mmproj-idefics3.gguf", kind="idefics3"))
    try:
        with pytest.raises(UsageError, match="needs marker tokens that .* vocabulary lacks"):
            smolvlm.prompt(f"{images.MARKER}\nhi", [images.from_bytes(png(1), "a.png")])
    finally:
        smolvlm.close()
    assert _ask(vision, [images.from_bytes(png(1), "a.png")]).text  # the model answers on


def test_chat_attaches_an_image_to_the_next_turn_and_saves_it(vision, tmp_path):
    from localinfer.chat.conversation import Conversation
    from localinfer.chat.settings import ChatSettings
    from localinfer.request.sampling import SamplingOptions

    vision.model.reset()
    conv = Conversation(vision, settings=ChatSettings(sampling=SamplingOptions(temperature=0), max_tokens=6))
    conv.images.append(images.from_bytes(png(1), "a.png"))
    first = conv.ask("What is in this picture?", lambda _t: None)
    assert first.stats.image_tokens == image_tokens() and conv.images == []
    second = conv.ask("Say more.", lambda _t: None)  # the image stays in the conversation, and in the cache
    assert second.stats.image_tokens == image_tokens() and second.stats.cached_tokens > first.stats.prompt_tokens
    saved = conv.save(tmp_path / "chat.json")
    again = Conversation(vision)
    assert again.load(saved) == 4
    assert again.history[0]["images"][0].rgb == images.from_bytes(png(1), "a.png").rgb  # PNG: lossless


# -- the CLI --------------------------------------------------------------------------------------
def test_pull_with_a_projector_then_run_with_images(smollm2_path, projector_file, tmp_path):
    p = run_cli("pull", str(smollm2_path), "--name", "smolvis", "--mmproj", str(projector_file))
    assert p.returncode == 0, p.stderr
    listed = run_cli("list", "--json")
    row = next(m for m in json.loads(listed.stdout)["models"] if m["name"] == "smolvis")
    assert row["vision"] is True
    pic = tmp_path / "pic.png"
    pic.write_bytes(png(1))
    r = run_cli("run", "-m", "smolvis", "--image", str(pic), "What is in this picture?", "--temperature", "0", "-n", "8", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["usage"]["image_tokens"] == image_tokens() and out["text"]
    bad = tmp_path / "notes.png"
    bad.write_text("not an image")
    for args, needle in [
        (["--image", str(bad)], f"{bad} is not an image"),
        (["--image", "https://example.com/a.png"], "URLs are not fetched"),
        (["--image", "-"], "not read from stdin"),
        (["--image", str(pic)] * 17, "17 images in one request"),
    ]:
        r = run_cli("run", "-m", "smolvis", *args, "hi")
        assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = run_cli("run", "-m", str(smollm2_path), "--image", str(pic), "hi")
    assert r.returncode == 2 and "takes no images" in r.stderr and "Traceback" not in r.stderr, r.stderr
    jobs = tmp_path / "jobs.jsonl"
    lines = [{"id": i, "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": _uri(png(seed))}}, {"type": "text", "text": "What is in this picture?"}]}]}
        for i, seed in enumerate((1, 2, 1))]  # fmt: skip
    lines.append({"id": 3, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}]}]})
    for i, url in ((4, "file://pic.png"), (5, "file://../secret.png")):  # files under --image-dir (batch.images)
        lines.append({**lines[0], "id": i, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is in this picture?"}]}]})  # fmt: skip
    jobs.write_text("".join(json.dumps(x) + "\n" for x in lines))
    b = run_cli("batch", "-m", "smolvis", str(jobs), "-o", str(tmp_path / "out.jsonl"), "-np", "2", "--image-dir", str(tmp_path))
    assert "4 answered · 2 errors" in b.stderr, b.stderr  # the URL line, the file outside the directory
    out = {d["id"]: d for d in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())}
    assert "remote image URLs are refused" in out[3]["error"] and "outside --image-dir" in out[5]["error"]
    assert out[0]["text"] != out[1]["text"] and out[0]["text"].split()[:5] == out[2]["text"].split()[:5]
    assert out[4]["text"].split()[:5] == out[0]["text"].split()[:5]  # the same picture, read from its file
    gone = run_cli("rm", "smolvis")
    assert gone.returncode == 0 and str(projector_file) in gone.stdout + gone.stderr


def test_pull_refuses_a_projector_that_is_not_one(smollm2_path, tmp_path):
    r = run_cli("pull", str(smollm2_path), "--name", "x", "--mmproj", str(smollm2_path))
    assert r.returncode != 0 and "is not a projector" in r.stderr and "'llama'" in r.stderr, r.stderr


# -- serve ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vision_server(smollm2_path, projector_file, tmp_path_factory):
    from test_serve_model import ServeProcess

    home = tmp_path_factory.mktemp("vision-home")
    pulled = _run_cli("pull", str(smollm2_path), "--name", "smolvis", "--mmproj", str(projector_file), text=True,
                      env={"LOCALINFER_HOME": str(home)})  # fmt: skip
    assert pulled.returncode == 0, pulled.stderr
    with ServeProcess("smolvis", "-np", "2", "-c", "1024", home=home) as s:
        yield s


def _uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _chat(server, *pictures: bytes, text: str = "What is in this picture?") -> tuple[int, dict]:
    parts = [{"type": "image_url", "image_url": {"url": p if isinstance(p, str) else _uri(p)}} for p in pictures]
    body = {"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}],
            "temperature": 0, "max_tokens": 12}  # fmt: skip
    return server.json("POST", "/v1/chat/completions", body)


def test_serve_takes_image_parts_on_the_openai_route(vision_server):
    assert vision_server.json("GET", "/v1/models")[1]["data"][0]["meta"]["vision"] is True
    assert "vision" in vision_server.json("POST", "/api/show", {"model": "smolvis"})[1]["capabilities"]
    code, a = _chat(vision_server, png(1))
    assert code == 200, a
    _, again = _chat(vision_server, png(1))
    _, b = _chat(vision_server, png(2))
    _, plain = _chat(vision_server)
    assert a["usage"]["prompt_tokens"] >= plain["usage"]["prompt_tokens"] + image_tokens()
    assert a["usage"]["image_tokens"] == image_tokens() and a["timings"]["image_encode_ms"] > 0
    assert "image_tokens" not in plain["usage"]
    assert a["choices"][0]["message"]["content"] == again["choices"][0]["message"]["content"]
    assert a["choices"][0]["message"]["content"] != b["choices"][0]["message"]["content"]


def test_run_and_the_openai_wire_render_one_prompt(vision, vision_server):
    """`run --image A -p Q` (images.message) and serve's [image_url A, text Q]: the same tokens, the
    same greedy answer (issue 52: run put a newline after the marker)."""
    local = _ask(vision, [images.from_bytes(png(1), "p.png")], "Describe the image.")
    code, served = _chat(vision_server, png(1), text="Describe the image.")
    assert code == 200, served
    assert served["usage"]["prompt_tokens"] == local.stats.prompt_tokens
    assert served["choices"][0]["message"]["content"].split()[:5] == local.text.split()[:5]


def test_images_go_through_endpoint_as_data_uris(vision_server, tmp_path):
    """`run --image` and batch's image files, sent to a server (--endpoint) as OpenAI data URIs: the
    server's answer to the same picture sent to it directly."""
    pic = tmp_path / "pic.png"
    pic.write_bytes(png(1))
    _, direct = _chat(vision_server, png(1))
    words = direct["choices"][0]["message"]["content"].split()[:5]
    ep = ("--endpoint", vision_server.base + "/v1", "-m", "smolvis", "--no-log")
    r = run_cli("run", *ep, "--image", str(pic), "--temperature", "0", "-n", "12", "--json", f"{images.MARKER}What is in this picture?")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["text"].split()[:5] == words and out["usage"]["image_tokens"] == image_tokens()  # as the server counted
    assert out["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"] > image_tokens()
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"id": 0, "temperature": 0, "max_tokens": 12, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "file://pic.png"}}, {"type": "text", "text": "What is in this picture?"}]}]}) + "\n")  # fmt: skip
    b = run_cli("batch", *ep, str(jobs), "--image-dir", str(tmp_path), "-o", str(tmp_path / "out.jsonl"))
    assert b.returncode == 0, b.stderr
    assert json.loads((tmp_path / "out.jsonl").read_text())["text"].split()[:5] == words


@pytest.mark.parametrize("picture, needle", [
    (b"not an image", "is not an image"),
    ("https://example.com/cat.png", "remote image URLs are refused"),
    (wide_png(), "100000x1 pixels"),
    (bomb_png(), "decompression bomb"),
])  # fmt: skip
def test_serve_refuses_bad_images_with_a_400_and_keeps_serving(vision_server, picture, needle):
    code, body = _chat(vision_server, picture)
    assert code == 400 and needle in body["error"]["message"], body
    code, body = _chat(vision_server, *[png(1)] * 17)
    assert code == 400 and "more than 16 images" in body["error"]["message"], body
    code, _ = _chat(vision_server, png(1))
    assert code == 200


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _wires(picture: bytes) -> list[tuple[str, dict]]:
    """The same question with ``picture`` on Anthropic's, Ollama's and the Responses API's routes."""
    q = "What is in this picture?"
    return [
        ("/v1/messages", {"model": "smolvis", "max_tokens": 12, "temperature": 0, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _b64(picture)}},
            {"type": "text", "text": q}]}]}),
        ("/api/chat", {"model": "smolvis", "stream": False, "options": {"temperature": 0, "num_predict": 12},
                       "messages": [{"role": "user", "content": q, "images": [_b64(picture)]}]}),
        ("/api/generate", {"model": "smolvis", "stream": False, "options": {"temperature": 0, "num_predict": 12},
                           "prompt": q, "images": [_b64(picture)]}),
        ("/v1/responses", {"model": "smolvis", "max_output_tokens": 12, "temperature": 0, "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": _uri(picture)}, {"type": "input_text", "text": q}]}]}),
    ]  # fmt: skip


def _text(path: str, body: dict) -> str:
    if path == "/v1/messages":
        return body["content"][0]["text"]
    if path == "/api/chat":
        return body["message"]["content"]
    if path == "/api/generate":
        return body["response"]
    return body["output"][-1]["content"][0]["text"]


def test_every_wire_takes_images_and_refuses_bad_ones_in_its_own_shape(vision_server):
    _, ref = _chat(vision_server, png(1))
    answer = ref["choices"][0]["message"]["content"]
    for (path, good), (_, other), (_, bad) in zip(_wires(png(1)), _wires(png(2)), _wires(b"not an image")):
        code, body = vision_server.json("POST", path, good)
        # the same prompt as the OpenAI route's: the same start (the cache may make the last digits differ)
        assert code == 200 and _text(path, body).split()[:5] == answer.split()[:5], (path, body)
        first = _text(path, body)
        code, body = vision_server.json("POST", path, other)
        assert code == 200 and _text(path, body) != first, (path, body)
        code, body = vision_server.json("POST", path, bad)
        assert code == 400 and "is not an image" in json.dumps(body), (path, body)
        if path == "/v1/messages":
            assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        elif path.startswith("/api/"):
            assert isinstance(body["error"], str)
        else:
            assert "message" in body["error"]


# -- Hub pulls (tests/fakehub.py) ------------------------------------------------------------------
def test_a_hub_pull_fetches_the_projector_asked_for(fake_hub, projector_file, smollm2_path, monkeypatch, tmp_path):  # noqa: F811
    from typer.testing import CliRunner

    from localinfer.cli.main import build_app

    monkeypatch.setenv("LOCALINFER_PROBE", "0")  # the store's mechanics: llama.cpp's test load is not the point
    repo = "acme/Vis-GGUF"
    fake_hub.add_file(repo, "vis-Q4_1.gguf", smollm2_path)
    fake_hub.add_file(repo, "mmproj-vis-f16.gguf", projector_file)
    fake_hub.add_file(repo, "mmproj-vis-Q4_1.gguf", write_projector(tmp_path / "q4.gguf", seed=7))  # the quant's own wins
    fake_hub.add_file(repo, "mmproj-broken-f16.gguf", smollm2_path)  # a llama model, not a projector

    def invoke(*args: str):
        return CliRunner().invoke(build_app(), list(args), catch_exceptions=False)

    r = invoke("pull", f"{repo}/vis-Q4_1.gguf", "--mmproj", "auto")
    assert r.exit_code == 0 and "with its projector" in r.stderr, r.stderr
    shown = json.loads(invoke("show", f"{repo}/vis-Q4_1.gguf", "--json").stdout)
    assert shown["vision"] is True and shown["projector"].endswith(fake_hub.repos[repo].files["mmproj-vis-Q4_1.gguf"].sha256)
    bad = invoke("pull", f"{repo}/vis-Q4_1.gguf", "--name", "broken", "--mmproj", "mmproj-broken-f16.gguf")
    assert bad.exit_code != 0 and "is not a projector" in bad.stderr and "Traceback" not in bad.stderr
    missing = invoke("pull", f"{repo}/vis-Q4_1.gguf", "--name", "nope", "--mmproj", "mmproj-nope.gguf")
    assert missing.exit_code != 0 and "projectors there: mmproj-broken-f16.gguf, mmproj-vis-Q4_1.gguf, mmproj-vis-f16.gguf" in missing.stderr
    gone = invoke("rm", f"{repo}/vis-Q4_1.gguf")
    assert gone.exit_code == 0
    blobs = Path(os.environ["LOCALINFER_HOME"]) / "models" / "blobs"
    assert not blobs.is_dir() or not any(blobs.iterdir())  # the model's blob and its projector's
