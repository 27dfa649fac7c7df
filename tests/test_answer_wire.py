"""One serialisation of a finished answer and its stats (``Finished.to_wire`` / ``from_wire``,
``GenerationStats.to_wire`` / ``from_wire``): every field crosses a process whole, as JSON text, and
serve's whole answer (what the resident server sends its client) is that serialisation of its record.
A field added to either class and left off the wire fails here, without a model
(tests/test_keepalive_parity.py runs the real `--keep-alive` path)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from localinfer.answer.answer import Answer
from localinfer.answer.finished import _PLAIN, Finished
from localinfer.engine.types import GenerationStats
from localinfer.request.toolcalls.spec import ToolCall

# Finished's fields that stay in the process that made them: clock stamps (its seconds cross)
IN_PROCESS = {"t_text", "t_reasoning"}
ENTRY = {"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}


def _other(value: Any, name: str) -> Any:
    """A value unlike the field's default, of the field's kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 3
    if isinstance(value, dict):
        return {name: 1}
    if isinstance(value, list):
        return [name]
    return name  # None and strings: a string


def test_every_stats_field_crosses_as_json():
    stats = GenerationStats()
    for f in dataclasses.fields(GenerationStats):
        if f.name == "logprobs":
            setattr(stats, f.name, [ENTRY])
        else:
            setattr(stats, f.name, _other(getattr(stats, f.name), f.name))
    back = GenerationStats.from_wire(json.loads(json.dumps(stats.to_wire())))
    assert back == stats
    assert back.document == "document" and back.decode_calls_s == 3.0  # the verdict and the raw decode time


def test_every_finished_field_crosses_or_is_named_as_staying():
    names = {f.name for f in dataclasses.fields(Finished)}
    assert names == set(_PLAIN) | {"stats", "tool_calls"} | IN_PROCESS, names ^ (set(_PLAIN) | IN_PROCESS)
    plain = {"text": "Paris.", "finish_reason": "length", "ttft_s": 0.05, "total_s": 0.3, "reasoning": "hm",
             "reasoning_tokens": 3, "reasoning_ttft_s": 0.01, "logprobs": [ENTRY]}  # fmt: skip
    assert set(plain) == set(_PLAIN)  # each with a value unlike its default
    stats = GenerationStats(prompt_tokens=7, completion_tokens=5, finish_reason="length", document="incomplete")
    calls = (ToolCall("call_1", "add", '{"a": 1}'),)
    done = Finished(**plain, stats=stats, tool_calls=calls)
    back = Finished.from_wire(json.loads(json.dumps(done.to_wire())))
    for name in names - IN_PROCESS:
        assert getattr(back, name) == getattr(done, name), name
    where = {"load_s": 0.4, "mode": "raw", "peak_rss": 123456, "facts": {"context": {"n_ctx": 512}}}
    # --json reads the same of the record made here and of the one read back (Answer's one constructor)
    assert Answer.of_finished(back, "m", **where).to_json() == Answer.of_finished(done, "m", **where).to_json()


def test_serve_sends_its_outcome_as_that_serialisation():
    from localinfer.serve.scheduler.outcome import Ended
    from localinfer.serve.wires.chat_completions import CompletionWriter

    stats = GenerationStats(prompt_tokens=9, completion_tokens=4, decode_s=0.2, decode_calls_s=0.15, first_token_s=0.05,
                            finish_reason="tool_calls", document="complete", n_ctx=512, context_used=13,
                            logprobs=[ENTRY])  # fmt: skip
    calls = (ToolCall("call_9", "add", '{"a": 2, "b": 3}'),)
    outcome = Ended("", "tool_calls", stats, queue_s=0.0, ttft_s=0.05, total_s=0.3, reasoning="add them",
                    reasoning_tokens=2, reasoning_ttft_s=0.01, tool_calls=calls)  # fmt: skip
    chunks = CompletionWriter.new("chat", "m", include_usage=True, whole_answers=True).last_chunks(outcome)
    sent = next(json.loads(c[6:]) for c in chunks.split(b"\n\n") if c.startswith(b"data: {") and b'"localinfer"' in c)
    back = Answer.of_finished(Finished.from_wire(json.loads(json.dumps(sent["localinfer"]))), "m")
    assert back.stats is not None and back.stats.document == "complete" and back.stats.decode_calls_s == 0.15
    assert back.finish_reason == "tool_calls" and back.tool_calls == list(calls)  # the answer's reason, as a local run's
    assert (back.reasoning, back.reasoning_tokens, back.reasoning_ttft_s) == ("add them", 2, 0.01)
    assert back.stats.logprobs is None  # the record's own logprobs are the answer's (sent once)


def test_a_request_with_images_crosses_to_a_server_whole():
    """The other way: a request's images cross the body sent to a server (``--endpoint``) and to the
    resident server (its private socket) as OpenAI ``image_url`` data URIs; serve's reading of a body
    (``rules.messages``) gives back the same conversation, every image's pixels and place in it."""
    from projector import png

    from localinfer.backends.remote import RemoteBackend
    from localinfer.request import images, rules
    from localinfer.request.request import build
    from localinfer.resident.backend import ResidentBackend

    a, b = images.from_bytes(png(1), "a.png"), images.from_bytes(png(2, (20, 30)), "b.png")
    history = ({"role": "system", "content": "Be brief."}, images.message("user", f"Is {images.MARKER} like this?", [a, b]),
               {"role": "assistant", "content": "No.", "reasoning_content": "they differ"}, images.message("user", "And now?", [b]))  # fmt: skip
    request = build(messages=history, max_tokens=5)
    # a server is sent each message's role and content; this user's own resident server all of it (past thinking)
    for backend, keys in ((RemoteBackend(None, "m"), {"role", "content"}), (ResidentBackend(None, "m", {}, None), None)):  # type: ignore[arg-type]
        body = json.loads(json.dumps(backend.body(request)))
        assert body["messages"][1]["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
        back = rules.messages("messages", body["messages"])
        assert [{k: v for k, v in m.items() if k != "images"} for m in back] == [
            {k: v for k, v in m.items() if k != "images" and (keys is None or k in keys)} for m in history]  # fmt: skip
        assert [[(i.width, i.height, i.rgb) for i in m.get("images", ())] for m in back] == [
            [(i.width, i.height, i.rgb) for i in m.get("images", ())] for m in history]  # fmt: skip
