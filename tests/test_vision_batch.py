"""Images in serve's batch engine (issue 41): an image is encoded on engine/vision_encode.py's worker
while the other sequences keep decoding, then decoded into its sequence - on the real libmtmd, with
the projector tests/projector.py makes, on SmolLM2-135M. The encode is wrapped so that the tests
decide when it ends: what they assert is the order of events, never a time."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
from projector import image_tokens, png, qwen2vl_text_model, write_projector

from localinfer.engine import vision
from localinfer.engine.batch import BatchDecoder
from localinfer.engine.types import SeqJob
from localinfer.errors import GenerationError
from localinfer.request import images
from localinfer.request.request import build
from localinfer.request.sampling import SamplingOptions

GREEDY = SamplingOptions(temperature=0)
PATIENCE_S = 60.0  # how long a wrapped encode waits for what the test expects before giving up (a failure)


@pytest.fixture(scope="module")
def loaded(smollm2_path, tmp_path_factory):
    from localinfer.engine.types import LoadOptions
    from localinfer.generate.loading import load
    from localinfer.store.resolve import resolve_model

    projector = write_projector(tmp_path_factory.mktemp("projector") / "mmproj-test.gguf")
    resolved = dataclasses.replace(resolve_model(str(smollm2_path)), mmproj=projector)
    model = load(resolved, LoadOptions(n_ctx=2048, n_threads=2, n_seq_max=2))
    yield model
    model.close()


def _tokens(loaded, text: str, *pictures: bytes):
    from localinfer.generate.prepare import build_prompt

    shown = [images.from_bytes(p, f"{i}.png") for i, p in enumerate(pictures)]
    req = build(messages=[images.message("user", text, shown)], sampling=GREEDY)
    return build_prompt(loaded, req, n_ctx=loaded.model.n_ctx_seq)[0]


class Events:
    """What happened, in order, from any thread: ("text", piece), ("encode", "start"/"end"), ..."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []

    def add(self, kind: str, what: str = "") -> None:
        self.log.append((kind, what))

    def texts(self) -> int:
        return sum(k == "text" for k, _ in self.log)

    def until(self, done, why: str) -> None:
        deadline = time.monotonic() + PATIENCE_S
        while not done():
            if time.monotonic() > deadline:
                self.add("gave up", why)
                return
            time.sleep(0.001)

    def between(self, first: tuple[str, str], last: tuple[str, str]) -> list[tuple[str, str]]:
        return self.log[self.log.index(first) + 1 : self.log.index(last)]


def _wrap_encode(monkeypatch, events: Events, hold) -> None:
    """Each encode logs its start, runs ``hold()`` (on the worker thread) and logs its end."""
    real = vision.encode_copy

    def encode(projector, chunk):
        assert threading.current_thread().name == "localinfer-image-encode"
        events.add("encode", "start")
        hold()
        out = real(projector, chunk)
        events.add("encode", "end")
        return out

    monkeypatch.setattr(vision, "encode_copy", encode)


def _streaming(loaded, events: Events, n: int = 40) -> SeqJob:
    return SeqJob("text", _tokens(loaded, "Tell me a long story about the sea."), GREEDY, n, ignore_eos=True,
                  on_text=lambda piece: events.add("text", piece))  # fmt: skip


def test_a_text_stream_keeps_decoding_while_an_image_is_encoded(loaded, monkeypatch):
    events = Events()

    def hold() -> None:  # the encode ends once the other sequence has streamed 4 pieces more: were the
        n = events.texts()  # engine thread encoding, none would come, and it would give up
        events.until(lambda: events.texts() >= n + 4, "no text streamed")

    _wrap_encode(monkeypatch, events, hold)
    picture = SeqJob("image", _tokens(loaded, "What is in this picture?", png(1)), GREEDY, 8)
    with BatchDecoder(loaded.model, 2, keep_cache=True) as decoder:
        results = {r.key: r for r in decoder.run([_streaming(loaded, events), picture])}
    assert ("gave up", "no text streamed") not in events.log
    during = events.between(("encode", "start"), ("encode", "end"))
    assert sum(k == "text" for k, _ in during) >= 4, events.log
    img, text = results["image"], results["text"]
    assert img.error is None and img.text and img.stats.image_tokens == image_tokens()
    assert img.stats.image_encode_s > 0 and img.stats.prompt_tokens == len(picture.tokens)
    assert text.error is None and text.stats.completion_tokens == 40 and text.stats.finish_reason == "length"


def one_after_another(ended: list[str], *jobs: SeqJob):
    """The decoder's job source: each job once the one before it has ended (``ended``: the keys the
    caller saw end), None while waiting."""
    for job in jobs:
        yield job
        while job.key not in ended:
            yield None


def test_the_answer_to_an_image_and_the_cache_across_it_are_kept(loaded):
    """Encoded off the engine thread, an image answers the same each time; the same prompt again is
    taken from the slot's cache (its placeholders come from the image's hash): nothing to encode."""
    job = SeqJob("a", _tokens(loaded, "What is in this picture?", png(1)), GREEDY, 8)
    other = SeqJob("c", _tokens(loaded, "What is in this picture?", png(2)), GREEDY, 8)
    ended: list[str] = []

    with BatchDecoder(loaded.model, 2, keep_cache=True) as decoder:
        first = next(iter(decoder.run([job])))
        results = []
        for r in decoder.run(one_after_another(ended, job, dataclasses.replace(job, key="b"), other)):
            ended.append(r.key)
            results.append(r)
    a, b, c = results
    assert a.text == first.text == b.text and a.stats.image_encode_s > 0
    assert b.stats.cached_tokens == b.stats.prompt_tokens - 1 and b.stats.image_encode_s == 0
    assert c.text != a.text and c.stats.image_encode_s > 0  # another image: encoded, another answer


def test_a_request_cancelled_while_its_image_encodes_ends_at_once(loaded, monkeypatch):
    events = Events()
    release = threading.Event()
    _wrap_encode(monkeypatch, events, lambda: release.wait(PATIENCE_S))
    cancel = threading.Event()
    picture = SeqJob("image", _tokens(loaded, "What is in this picture?", png(2)), GREEDY, 8, cancel=cancel)
    stream = dataclasses.replace(_streaming(loaded, events), on_text=lambda piece: (
        events.add("text", piece), events.texts() >= 2 and cancel.set()))  # fmt: skip
    with BatchDecoder(loaded.model, 2, keep_cache=True) as decoder:
        results = {}
        for r in decoder.run([stream, picture]):
            results[r.key] = r
            events.add("result", r.key)
            if r.key == "image":
                release.set()  # the encode is let go only once the cancelled request has ended
        after = list(decoder.run([SeqJob("again", picture.tokens, GREEDY, 8)]))  # the worker still serves
    assert results["image"].stats.finish_reason == "interrupted"
    assert events.log.index(("encode", "start")) < events.log.index(("result", "image"))
    assert events.log.index(("result", "image")) < events.log.index(("encode", "end"))
    assert results["text"].stats.finish_reason == "length" and results["text"].stats.completion_tokens == 40
    assert after[0].error is None and after[0].text and after[0].stats.image_tokens == image_tokens()


def test_an_image_that_fails_to_encode_fails_its_request_only(loaded, monkeypatch):
    def broken(projector, chunk):
        raise GenerationError("libmtmd could not encode an image")

    monkeypatch.setattr(vision, "encode_copy", broken)
    events = Events()
    picture = SeqJob("image", _tokens(loaded, "What is in this picture?", png(1)), GREEDY, 8)
    with BatchDecoder(loaded.model, 2, keep_cache=True) as decoder:
        results = {r.key: r for r in decoder.run([_streaming(loaded, events, 12), picture])}
    assert results["image"].error == "libmtmd could not encode an image" and results["image"].text == ""
    assert results["text"].error is None and results["text"].stats.completion_tokens == 12


@pytest.fixture(scope="module")
def qwen(smollm2_path, tmp_path_factory):
    """SmolLM2 as a ``qwen2vl`` text model with a Qwen2-VL (M-RoPE) projector: an image of 3 x 3
    merged patches is 9 tokens but 3 positions (libmtmd's ``max(rows, columns)``)."""
    from localinfer.engine.types import LoadOptions
    from localinfer.generate.loading import load
    from localinfer.store.resolve import resolve_model

    tmp = tmp_path_factory.mktemp("qwen2vl")
    text = qwen2vl_text_model(smollm2_path, tmp / "qwen2vl-test.gguf")
    projector = write_projector(tmp / "mmproj-qwen2vl.gguf", kind="qwen2vl_merger", image_size=64, patch=8)
    model = load(dataclasses.replace(resolve_model(str(text)), mmproj=projector), LoadOptions(n_ctx=2048, n_threads=2, n_seq_max=2))
    assert model.projector.mrope
    yield model
    model.close()


def test_m_rope_images_take_libmtmds_positions_in_run_and_in_the_batch_engine(qwen):
    """Positions after an M-RoPE image are not token counts: the run path and the batch engine both
    give each cell libmtmd's position (the KV cache shows it), and so answer alike."""
    from localinfer.engine.backend import llama_cpp
    from localinfer.generate.prepare import build_prompt
    from localinfer.generate.run import generate

    def last_position(seq: int) -> int:
        return int(llama_cpp.llama_memory_seq_pos_max(qwen.model._mem, seq))

    answers = {}
    for seed in (1, 2):
        req = build(messages=[images.message("user", "What is in this picture?", [images.from_bytes(png(seed), "p.png")])],
                    sampling=GREEDY, max_tokens=8)  # fmt: skip
        prompt = build_prompt(qwen, req, n_ctx=qwen.model.n_ctx_seq)[0]
        assert prompt.image_tokens == 9 and prompt.shift == 3 - 9  # 3 positions for 9 tokens
        qwen.model.reset()
        alone = generate(qwen, req, lambda _t: None)
        assert alone.stats.image_tokens == 9 and alone.stats.prompt_tokens == len(prompt)
        # the cache's last position: the prompt's and every generated token but the last, shifted
        assert last_position(0) == len(prompt) + alone.stats.completion_tokens - 2 + prompt.shift
        seen: list[int] = []
        job = SeqJob("image", prompt, GREEDY, 8, on_text=lambda _p: seen.append(last_position(1)))
        with BatchDecoder(qwen.model, 2, keep_cache=True) as decoder:
            results = {r.key: r for r in decoder.run([_streaming(qwen, Events(), 16), job])}
        batched = results["image"]
        assert batched.error is None and batched.stats.image_tokens == 9
        assert seen[0] == len(prompt) - 1 + prompt.shift  # the prompt's last token, at libmtmd's position
        assert batched.text == alone.text  # the same positions, the same answer
        answers[seed] = alone.text
    assert answers[1] != answers[2]  # the image steers it


def test_the_batch_engine_reuses_an_m_rope_prompt_only_before_its_image(qwen):
    """Dropping cells goes by position: a cached M-RoPE prompt is kept up to its image only."""
    req = build(messages=[images.message("user", "What is in this picture?", [images.from_bytes(png(1), "p.png")])],
                sampling=GREEDY, max_tokens=4)  # fmt: skip
    from localinfer.generate.prepare import build_prompt

    prompt = build_prompt(qwen, req, n_ctx=qwen.model.n_ctx_seq)[0]
    first_image = next(start for start, _n, chunk in prompt.pieces if chunk is not None)
    ended: list[str] = []

    with BatchDecoder(qwen.model, 2, keep_cache=True) as decoder:
        results = []
        for r in decoder.run(one_after_another(ended, SeqJob("a", prompt, GREEDY, 4), SeqJob("b", prompt, GREEDY, 4))):
            ended.append(r.key)
            results.append(r)
    a, b = results
    assert b.stats.cached_tokens == first_image and b.stats.image_encode_s > 0
    assert a.text == b.text
