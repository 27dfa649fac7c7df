"""Embeddings without a model: the input lines of `localinfer embed`, the records it writes (through
a fake backend), /v1/embeddings' request checks and its base64 encoding, and the normalization."""

from __future__ import annotations

import base64
import math
import struct

import pytest

from localinfer.embed import embedding
from localinfer.backends import Backend
from localinfer.embed.embedding import Embedding, parse_lines
from localinfer.errors import ContextOverflowError, UsageError


def test_text_lines_are_inputs_numbered_by_line_and_blank_lines_are_skipped():
    items = parse_lines(b"first text\n\n  \nsecond {not json}\r\n")
    assert [(i.id, i.line, i.text, i.error) for i in items] == [(1, 1, "first text", None), (4, 4, "second {not json}", None)]


def test_jsonl_takes_text_or_input_and_names_each_bad_line():
    data = b"\n".join([
        b'{"id": "a", "text": "hello"}',
        b'{"input": "no id"}',
        b'{"id": "b", "text": 3}',
        b'{"id": "c", "text": "x", "input": "y"}',
        b'{"id": "d", "text": ""}',
        b'{"id": "e", "prompt": "p"}',
        b"[1, 2]",
        b"{broken",
        b'{"id": true, "text": "t"}',
    ])  # fmt: skip
    items = parse_lines(data)
    assert [(i.id, i.text) for i in items[:2]] == [("a", "hello"), (2, "no id")]
    errors = {i.line: (i.id, i.error) for i in items if i.error}
    assert errors[3] == ("b", "'text' must be a string")
    assert errors[4] == ("c", "a line needs exactly one of 'text' or 'input'")
    assert errors[5] == ("d", "'text' is empty: nothing to embed")
    assert errors[6][0] == "e" and "unknown field 'prompt'" in errors[6][1]
    assert errors[7][1].startswith("a line must be a JSON object")
    assert errors[8][1].startswith("not valid JSON")
    assert errors[9][1] == "'id' must be a string or an integer"
    assert len(items) == 9


def test_the_format_can_be_forced_and_bad_utf8_is_an_error_line():
    assert parse_lines(b'{"text": "a"}', "text")[0].text == '{"text": "a"}'
    bad = parse_lines(b"ok\n\xff\xfe\n")
    assert bad[0].text == "ok" and bad[1].error == "not valid UTF-8 (byte 1)"


class VectorBackend(Backend):
    """Embeds a text as [len, 1.0]; refuses texts containing 'LONG' as too long."""

    name = "fake"

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def embeddings(self, inputs, *, normalize=True, pooling=None, truncate=False, n_ctx=None, on_done=None):
        self.calls.append(list(inputs))
        out = []
        for text in inputs:
            if "LONG" in text and not truncate:
                exc = ContextOverflowError(f"the input is 999 tokens; the embedding context holds {n_ctx or 512}")
                out.append(Embedding(None, error=str(exc), exc=exc))
            else:
                out.append(Embedding([float(len(text)), 1.0], len(text.split()), 3 if "LONG" in text else 0))
        if on_done is not None:
            on_done(len(inputs))
        return out


def test_run_writes_one_record_per_line_in_input_order_with_error_records(monkeypatch):
    monkeypatch.setattr(embedding, "CHUNK", 2)  # several chunks: the order holds across them
    items = parse_lines(b'{"id": "x", "text": "one two"}\n{"id": 5}\n{"id": "y", "text": "a LONG one"}\n{"text": "last"}\n')
    backend, out, done = VectorBackend(), [], []
    summary = embedding.run(items, backend, out.append, n_ctx=64, on_done=done.append)
    assert out == [
        {"id": "x", "embedding": [7.0, 1.0], "tokens": 2},
        {"id": 5, "line": 2, "error": "a line needs exactly one of 'text' or 'input'"},
        {"id": "y", "line": 3, "error": "the input is 999 tokens; the embedding context holds 64"},
        {"id": 4, "embedding": [4.0, 1.0], "tokens": 1},
    ]
    assert backend.calls == [["one two"], ["a LONG one", "last"]]  # bad lines never reach the backend
    assert (summary.inputs, summary.embedded, summary.errors, summary.tokens) == (4, 2, 2, 3)
    assert sum(done) == 4


def test_truncated_inputs_say_how_many_tokens_were_cut():
    out = []
    embedding.run(parse_lines(b"a LONG text\n"), VectorBackend(), out.append, truncate=True)
    assert out == [{"id": 1, "embedding": [11.0, 1.0], "tokens": 3, "truncated_tokens": 3}]


def test_backend_embed_gives_vectors_and_raises_the_first_bad_inputs_error():
    b = VectorBackend()
    assert b.embed(["ab", "c"]) == [[2.0, 1.0], [1.0, 1.0]]
    with pytest.raises(ContextOverflowError, match="999 tokens"):
        b.embed(["ok", "LONG"])
    with pytest.raises(UsageError, match="list of texts"):
        b.embed("one string")


def test_l2_normalized_has_unit_length_and_leaves_zero_alone():
    from localinfer.engine.embed import l2_normalized

    v = l2_normalized([3.0, 4.0])
    assert v == pytest.approx([0.6, 0.8]) and math.isclose(sum(x * x for x in v), 1.0)
    assert l2_normalized([0.0, 0.0]) == [0.0, 0.0]


# -- /v1/embeddings' request ----------------------------------------------------------------------
def _parse(body):
    from localinfer.serve.wires.embeddings import parse

    return parse(body)


def test_every_shape_of_input_openai_takes():
    assert _parse({"input": "one"}).inputs == ("one",)
    assert _parse({"input": ["a", "b"]}).inputs == ("a", "b")
    assert _parse({"input": [1, 2, 3]}).inputs == ((1, 2, 3),)
    assert _parse({"input": [[1, 2], [3]]}).inputs == ((1, 2), (3,))
    r = _parse({"input": "x", "encoding_format": "base64", "model": "m", "user": "u", "dimensions": 8})
    assert (r.base64, r.model, r.dimensions) == (True, "m", 8)


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({}, "input", "'input' is required"),
        ({"input": []}, "input", "must not be an empty list"),
        ({"input": ["a"] * 10_000}, "input", "10000 items; a request may have 2048"),
        ({"input": ["a", 3]}, "input[1]", "must be a non-empty string"),
        ({"input": ["a", ""]}, "input[1]", "empty string"),
        ({"input": [[1, -2]]}, "input[0]", "token ids"),
        ({"input": {"text": "a"}}, "input", "must be a string or a list"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format", "float or base64"),
        ({"input": "a", "dimensions": 0}, "dimensions", "positive integer"),
        ({"input": "a", "pooling": "mean"}, "pooling", "unknown field"),
    ],
)
def test_bad_requests_are_a_400_naming_the_field(body, param, words):
    from localinfer.serve.wires.openai import ApiError

    with pytest.raises(ApiError) as err:
        _parse(body)
    assert err.value.status == 400 and err.value.param == param and words in err.value.message


def test_base64_is_little_endian_float32_as_the_openai_client_decodes_it():
    from localinfer.serve.wires.embeddings import EmbeddingRequest, response
    from localinfer.serve.scheduler.worker import EmbedOutcome

    vec = [0.5, -0.25, 1.0]
    body = response("m", EmbeddingRequest(None, ("x",), base64=True), EmbedOutcome([vec], 4, 0.0, 0.0))
    raw = base64.b64decode(body["data"][0]["embedding"])
    assert list(struct.unpack("<3f", raw)) == vec
    assert body["usage"] == {"prompt_tokens": 4, "total_tokens": 4} and body["object"] == "list"
    plain = response("m", EmbeddingRequest(None, ("x",)), EmbedOutcome([vec], 4, 0.0, 0.0))
    assert plain["data"] == [{"object": "embedding", "index": 0, "embedding": vec}]


# -- the server's engine thread -------------------------------------------------------------------
class FakeEmbedder:
    """Two inputs per decode; ``during``: called with each decode's inputs (a request arriving then)."""

    def __init__(self) -> None:
        self.calls: list[list[list[int]]] = []
        self.during = lambda inputs: None

    def batch_end(self, inputs, first):
        return min(first + 2, len(inputs))

    def embed(self, inputs):
        assert len(inputs) <= 2, "one decode at a time"
        self.calls.append(inputs)
        self.during(inputs)
        return [[float(len(t))] for t in inputs]


def _engine(max_queue: int = 4):
    from types import SimpleNamespace

    from localinfer.serve.scheduler.worker import Engine

    loaded = SimpleNamespace(name="m", model=SimpleNamespace(n_ctx_seq=64), template=None)
    engine = Engine(loaded, 2, max_queue=max_queue)  # type: ignore[arg-type]
    engine._embedder = FakeEmbedder()  # type: ignore[assignment]
    return engine


def _idle():
    """An engine, its source as an idle decoder pulls it, and a chat request to queue."""
    import threading
    from types import SimpleNamespace

    engine = _engine()
    source = engine._source(SimpleNamespace(n_active=0, stats=SimpleNamespace(steps=0)))  # type: ignore[arg-type]
    return engine, source, SimpleNamespace(key="chat", job="chat-job", cancelled=threading.Event())


def test_an_idle_engine_wakes_for_an_embedding_and_then_takes_the_next_chat():
    engine, source, chat = _idle()
    ends = []
    engine.submit_embed([[1, 2, 3], [4], [5, 6]], lambda o: (ends.append(o), engine._queue.put(chat)))
    assert engine.queued == 1
    assert next(source) == "chat-job"  # the embedding ran first, decode by decode, on this (the engine's) thread
    assert [(e.vectors, e.tokens, e.error) for e in ends] == [([[3.0], [1.0], [2.0]], 6, None)]
    assert engine._embedder.calls == [[[1, 2, 3], [4]], [[5, 6]]]  # type: ignore[union-attr]
    assert engine.queued == 0


def test_a_chat_arriving_between_two_embedding_decodes_is_taken_between_them():
    engine, source, chat = _idle()
    ends = []
    engine._embedder.during = lambda inputs: engine._queue.put(chat)  # type: ignore[union-attr]
    engine.submit_embed([[1], [2], [3], [4], [5]], ends.append)
    assert next(source) == "chat-job" and ends == [], "taken after one decode of three"
    engine._embedder.during = lambda inputs: None  # type: ignore[union-attr]
    engine._before_decode()
    engine._before_decode()  # the chat's next two steps: one embedding decode before each
    assert [e.vectors for e in ends] == [[[1.0]] * 5] and len(engine._embedder.calls) == 3  # type: ignore[union-attr]


def test_a_busy_engine_runs_embeddings_before_its_next_decode_and_bounds_them():
    from localinfer.serve.scheduler.worker import Overloaded

    engine = _engine(max_queue=2)
    ends = []
    steps = []
    engine._on_step = lambda: steps.append(len(ends))
    engine.submit_embed([[1]], ends.append)
    engine.submit_embed([[1, 1]], ends.append)
    with pytest.raises(Overloaded):
        engine.submit_embed([[1]], ends.append)
    assert engine._waiting_chats() == 0  # the wake-up markers are no chat requests
    engine._before_decode()  # what the decoder calls just before each llama_decode: one embedding decode
    assert [e.vectors for e in ends] == [[[1.0]]]
    engine._before_decode()
    assert [e.vectors for e in ends] == [[[1.0]], [[2.0]]] and steps[-1] == 2
    engine.submit_embed([[5, 5]], ends.append)
    engine.cancel_all()
    engine._before_decode()
    assert ends[-1].error == "the request was cancelled" and ends[-1].vectors == []
    assert len(engine._embedder.calls) == 2  # type: ignore[union-attr]
    engine.submit_embed([[1], [2], [3]], ends.append)  # two decodes: cancelled after the first
    engine._before_decode()
    engine._embeds[0].cancel()
    engine._before_decode()
    assert ends[-1].error == "the request was cancelled" and len(engine._embedder.calls) == 3  # type: ignore[union-attr]


def test_a_served_embedding_request_is_one_usage_row_with_its_tokens(isolated_home):
    import json
    import sqlite3
    from types import SimpleNamespace

    from localinfer.serve.scheduler.worker import EmbedOutcome
    from localinfer.serve.scheduler.record import UsageWriter

    writer = UsageWriter(SimpleNamespace(sha256="abc"), "m", 2)  # type: ignore[arg-type]
    writer.add_embedding(EmbedOutcome([[0.1], [0.2], [0.3]], 17, 0.002, 0.05))
    writer.close()
    rows = sqlite3.connect(isolated_home / "history.db").execute(
        "SELECT command, model, model_sha256, prompt_tokens, completion_tokens, total_ms, extra FROM requests").fetchall()  # fmt: skip
    assert [r[:6] for r in rows] == [("serve", "m", "abc", 17, 0, 50.0)]
    assert json.loads(rows[0][6]) == {"endpoint": "embeddings", "inputs": 3, "queue_ms": 2.0}
