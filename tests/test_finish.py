"""localinfer.generate.finish: raw pieces in, typed steps out, one finished answer; a stream fed piece by piece
finishes to the same answer as its whole text fed at once."""

from __future__ import annotations

from localinfer.engine.types import GenerationStats
from localinfer.generate.finish import CallArgs, CallStart, Finish, Finished, Text, Thought, plain
from localinfer.request.reasoning import FAMILIES, Splitter
from localinfer.request.toolcalls import families as F
from localinfer.request.toolcalls.plan import ToolPlan
from localinfer.request.toolcalls.spec import ToolChoice, tools

THINK = next(m for m in FAMILIES if m.open == "<think>")
ADD = tools("tools", [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}])
TEXT = '<think>Add them.</think>Sure. <tool_call>{"name":"add","arguments":{"a":1,"b":2}}</tool_call>'


def _fed(text: str, size: int, **kw) -> tuple[list, object]:
    f = Finish(Splitter(THINK), ToolPlan(F.HERMES, ADD, ToolChoice()), **kw)
    steps = [s for i in range(0, len(text), size) for s in f.feed(text[i : i + size])] + f.close()
    return steps, f.result("stop", GenerationStats(completion_tokens=30))


def of_text(text: str, finish_reason: str, **kw) -> Finished:
    """A whole answer's text, finished at once (what a stream of the same text assembles to)."""
    f = Finish(**kw)
    f.feed(text)
    f.close()
    return f.result(finish_reason)


def test_steps_come_in_order_and_assemble_to_the_answer():
    steps, done = _fed(TEXT, 3)
    kinds = [type(s) for s in steps]
    assert kinds.index(Thought) < kinds.index(Text) < kinds.index(CallStart) < kinds.index(CallArgs)
    assert "".join(s.text for s in steps if isinstance(s, Thought)) == done.reasoning == "Add them."
    assert "".join(s.text for s in steps if isinstance(s, Text)) == done.text == "Sure. "
    (call,) = done.tool_calls
    assert (call.name, call.arguments) == ("add", '{"a":1,"b":2}') == (
        next(s.name for s in steps if isinstance(s, CallStart)), "".join(s.text for s in steps if isinstance(s, CallArgs)))
    assert done.finish_reason == "tool_calls" and 0 < done.reasoning_tokens <= 30
    assert done.t_reasoning is not None and done.t_text is not None and done.t_reasoning <= done.t_text


def test_a_stream_finishes_as_its_whole_text():
    whole = of_text(TEXT, "stop", splitter=Splitter(THINK), tools=ToolPlan(F.HERMES, ADD, ToolChoice()))
    for size in (1, 5, len(TEXT)):
        _, done = _fed(TEXT, size)
        assert (done.text, done.reasoning, done.finish_reason) == (whole.text, whole.reasoning, whole.finish_reason)
        assert [(c.name, c.arguments) for c in done.tool_calls] == [(c.name, c.arguments) for c in whole.tool_calls]


def test_a_call_cut_short_stays_length_and_plain_text_is_itself():
    cut = of_text(TEXT[:-20], "length", splitter=Splitter(THINK), tools=ToolPlan(F.HERMES, ADD, ToolChoice()))
    assert cut.finish_reason == "length" and cut.tool_calls
    f = Finish()
    assert plain(None, None) and not plain(None, ToolPlan(F.HERMES, ADD, ToolChoice()))
    assert f.feed("Hel") == [Text("Hel")] and f.feed("") == [] and f.close() == []
    done = f.result("stop")
    assert (done.text, done.reasoning, done.tool_calls, done.finish_reason) == ("Hel", None, (), "stop")
    assert plain(None, ToolPlan(F.HERMES, ADD, ToolChoice("none")))  # "none": no calls are parsed


def _entry(token: str) -> dict:
    return {"token": token, "logprob": -0.1, "bytes": list(token.encode()), "top_logprobs": []}


def test_the_reason_the_times_and_the_logprobs_are_decided_once():
    # a stop string that cut a constrained document: length on every entry (it does not parse)
    stats = GenerationStats(completion_tokens=3, finish_reason="stop", document="incomplete")
    f = Finish()
    f.fill('{"a"')
    f.close()
    done = f.result(stats=stats, t0=10.0, t_end=12.0, t_first=10.5)
    assert done.finish_reason == stats.finish_reason == "length"
    assert (done.ttft_s, done.total_s) == (0.5, 2.0)  # fed whole: TTFT is the engine's first token, from t0
    # the logprobs are the answer text's: not the thinking's, not a stop string's cut from the text
    tokens = ["<think>", "hm", "</think>", "Hi", "!"]
    stats = GenerationStats(completion_tokens=5, finish_reason="stop", logprobs=[_entry(t) for t in tokens])
    f = Finish(Splitter(THINK))
    steps = [s for piece in tokens[:-1] for s in f.feed(piece)] + f.close()
    done = f.result(stats=stats, t0=0.0)
    assert (done.text, done.reasoning, done.finish_reason) == ("Hi", "hm", "stop")
    assert [e["token"] for e in done.logprobs] == ["Hi"] and len(steps) == 2
    assert 0 < done.reasoning_ttft_s <= done.ttft_s  # fed piece by piece: timed as the steps came
