"""Log probabilities: the rules and shapes without a model, then the engine, `run --json`, batch,
`serve` (the official ``openai`` client, streamed and whole) and llama.cpp's llama-server as the
reference for the numbers (greedy, top_logprobs 3: the same tokens, each logprob within 0.05)."""

from __future__ import annotations

import json
import math

import pytest
from conftest import run_cli
from test_remote_server import llama_server  # noqa: F401 - the reference server, started from the test

from localinfer.request import rules
from localinfer.batch.io import parse_input
from localinfer.engine.logprobs import trim
from localinfer.errors import UsageError
from localinfer.remote.sse import choice_logprobs
from localinfer.request.request import build
from localinfer.serve.wires.openai import ApiError, parse_request
from localinfer.serve.wires.chat_completions import legacy_logprobs

HI = [{"role": "user", "content": "Name three colors."}]
TOO_MANY = "'top_logprobs' must be an integer between 0 and 20, not 21"


def _entry(token: str, logprob: float = -0.5, top: tuple[tuple[str, float], ...] = ()) -> dict:
    alts = [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in top]
    return {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": alts}


# -- rules, one message everywhere -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("logprobs", "top", "legacy", "expected"),
    [(None, None, False, None), (False, None, False, None), (True, None, False, 0), (True, 3, False, 3),
     (False, 0, False, None), (4, None, True, 4), (0, None, True, 0), (True, 20, True, 20)],
)  # fmt: skip
def test_the_two_fields_become_one_top_n(logprobs, top, legacy, expected):
    assert rules.logprobs_fields(logprobs, top, legacy=legacy) == expected


@pytest.mark.parametrize(
    ("logprobs", "top", "legacy", "field", "message"),
    [(True, 21, False, "top_logprobs", TOO_MANY), (True, -1, False, "top_logprobs", None),
     (True, 2.5, False, "top_logprobs", None), (None, 2, False, "top_logprobs", "'top_logprobs' needs 'logprobs': true"),
     (3, None, False, "logprobs", "'logprobs' must be true or false, not 3"), (21, None, True, "logprobs", None),
     (3, 2, True, "top_logprobs", None), (True, "3", False, "top_logprobs", None)],
)  # fmt: skip
def test_bad_values_are_refused_by_name(logprobs, top, legacy, field, message):
    with pytest.raises(rules.RuleError) as info:
        rules.logprobs_fields(logprobs, top, legacy=legacy)
    assert info.value.field == field
    if message:
        assert str(info.value) == message


def test_serve_batch_and_the_api_refuse_21_with_the_same_words():
    with pytest.raises(ApiError) as info:
        parse_request({"messages": HI, "logprobs": True, "top_logprobs": 21}, "chat")
    assert info.value.status == 400 and info.value.param == "top_logprobs" and info.value.message == TOO_MANY
    (line,) = parse_input('{"id": "a", "prompt": "x", "logprobs": true, "top_logprobs": 21}\n', "jsonl")
    assert line.reason == TOO_MANY and line.id == "a"
    with pytest.raises(UsageError, match="'logprobs' must be an integer between 0 and 20, not 21"):
        build("x", logprobs=21)
    assert build("x", logprobs=3).logprobs == 3 and build("x").logprobs is None


def test_requests_carry_the_top_n():
    assert parse_request({"messages": HI, "logprobs": True, "top_logprobs": 3}, "chat").request.logprobs == 3
    assert parse_request({"messages": HI, "logprobs": True}, "chat").request.logprobs == 0
    assert parse_request({"messages": HI}, "chat").request.logprobs is None
    assert parse_request({"prompt": "x", "logprobs": 2}, "text").request.logprobs == 2
    chat, legacy, off = parse_input(
        '{"prompt": "a", "logprobs": true, "top_logprobs": 2}\n{"prompt": "b", "logprobs": 5}\n{"prompt": "c"}\n', "jsonl"
    )
    assert (chat.logprobs, legacy.logprobs, off.logprobs) == (2, 5, None)


# -- shapes ------------------------------------------------------------------------------------------
def test_trim_keeps_the_tokens_that_begin_in_the_text():
    entries = [_entry("Hello"), _entry(","), _entry(" wor"), _entry("ld"), _entry("\n\nUser")]
    assert trim(entries, "Hello, world") == entries[:4]
    assert trim(entries, "Hello, world\n") == entries  # a stop string began inside the last token
    assert trim(entries, "") == [] and trim(None, "x") is None
    split = [{"token": "", "logprob": -1.0, "bytes": [0xC3], "top_logprobs": []},
             {"token": "", "logprob": -1.0, "bytes": [0xA9], "top_logprobs": []}]  # fmt: skip
    assert trim(split, "é") == split  # two tokens of one character


def test_the_completions_api_gets_the_legacy_shape_and_the_client_maps_it_back():
    entries = [_entry("Hi", -0.1, (("Hi", -0.1), ("Hey", -2.5))), _entry(" there", -0.7, ((" there", -0.7), ("!", -1.0)))]
    legacy = legacy_logprobs(entries, offset=5)
    assert legacy == {"tokens": ["Hi", " there"], "token_logprobs": [-0.1, -0.7],
                      "top_logprobs": [{"Hi": -0.1, "Hey": -2.5}, {" there": -0.7, "!": -1.0}], "text_offset": [5, 7]}  # fmt: skip
    assert choice_logprobs({"text": "Hi there", "logprobs": legacy}) == entries
    assert choice_logprobs({"delta": {"content": "Hi"}, "logprobs": {"content": entries}}) == entries
    assert choice_logprobs({"delta": {"content": "Hi"}, "logprobs": None}) is None


class _LogprobEngine:
    """The HTTP layer's engine, scripted: two pieces, each with its entries."""

    n_ctx_seq, parallel, running, queued, cells_used, cells_total = 512, 2, 0, 0, 0, 1024
    prompt_cache = None  # the figures of a host prompt cache: none here

    def __init__(self) -> None:
        self.asked: list = []

    def prepare(self, request, clamp=False):
        from localinfer.serve.scheduler.worker import Prepared

        self.asked.append(request.request.logprobs)
        return Prepared(request, [1, 2, 3], ())

    def submit(self, prepared, on_text, on_end, on_logprobs=None, **_):
        import threading

        from localinfer.engine.types import GenerationStats
        from localinfer.serve.scheduler.worker import Ended

        pieces = [("Hel", [_entry("Hel", -0.2)]), ("lo", [_entry("lo", -0.3)])]

        def run() -> None:
            for text, entries in pieces:
                if on_logprobs is not None:
                    on_logprobs(text, entries)
                elif on_text is not None:
                    on_text(text)
            stats = GenerationStats(prompt_tokens=3, completion_tokens=2, logprobs=[e for _, es in pieces for e in es])
            on_end(Ended("Hello", "length", stats, queue_s=0.0, ttft_s=0.01, total_s=0.02, logprobs=stats.logprobs))

        threading.Thread(target=run).start()
        return self

    def cancel(self) -> None:
        pass


def test_serve_answers_carry_logprobs_whole_and_per_chunk():
    from test_serve import _state, call

    engine = _LogprobEngine()
    state = _state(engine)
    status, _, body = call(state, "POST", "/v1/chat/completions", {"messages": HI, "logprobs": True, "top_logprobs": 1})
    assert status == 200
    content = json.loads(body)["choices"][0]["logprobs"]["content"]
    assert [(e["token"], e["logprob"]) for e in content] == [("Hel", -0.2), ("lo", -0.3)]
    status, _, body = call(state, "POST", "/v1/chat/completions", {"messages": HI, "logprobs": True, "stream": True})
    events = [json.loads(e[6:]) for e in body.decode().split("\n\n") if e.startswith("data: {")]
    streamed = [(c["delta"].get("content"), c["logprobs"]) for e in events for c in e["choices"] if c["logprobs"]]
    assert "".join(t for t, _ in streamed) == "Hello"
    assert [e["token"] for _, lp in streamed for e in lp["content"]] == ["Hel", "lo"]
    status, _, body = call(state, "POST", "/v1/completions", {"prompt": "x", "logprobs": 1, "stream": True})
    events = [json.loads(e[6:]) for e in body.decode().split("\n\n") if e.startswith("data: {")]
    legacy = [c["logprobs"] for e in events for c in e["choices"] if c["logprobs"]]
    assert [o for lp in legacy for o in lp["text_offset"]] == [0, 3]  # offsets run on across chunks
    assert [t for lp in legacy for t in lp["tokens"]] == ["Hel", "lo"]
    status, _, body = call(state, "POST", "/v1/chat/completions", {"messages": HI, "logprobs": True, "top_logprobs": 21})
    assert status == 400 and json.loads(body)["error"]["param"] == "top_logprobs"
    assert engine.asked == [1, 0, 1]


# -- a real model ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model(smollm2_path):
    from localinfer.engine.model import LlamaModel
    from localinfer.engine.types import LoadOptions

    m = LlamaModel(smollm2_path, LoadOptions(n_ctx=1024, n_threads=2, n_seq_max=2))
    yield m
    m.close()


def _prompt(model) -> list[int]:
    return model.tokenize("<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n", parse_special=True)


def _greedy(model, top: int | None, **kw):
    from localinfer.engine.types import GenerationStats
    from localinfer.request.sampling import SamplingOptions

    model.reset()
    stats = GenerationStats()
    text = "".join(s.text for s in model.generate(_prompt(model), SamplingOptions(temperature=0), stats, max_tokens=12,
                                                  logprobs=top, **kw))  # fmt: skip
    return text, stats


@pytest.mark.slow
def test_the_engine_reports_the_raw_distribution_of_each_sampled_token(model):
    text, stats = _greedy(model, 3)
    entries = stats.logprobs
    assert len(entries) == stats.completion_tokens >= 8  # the model ends its list itself
    assert b"".join(bytes(e["bytes"]) for e in entries).decode() == text
    for e in entries:
        tops = [t["logprob"] for t in e["top_logprobs"]]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and all(v <= 0 for v in tops)
        assert e["top_logprobs"][0]["token"] == e["token"] and e["logprob"] == pytest.approx(tops[0], abs=1e-6)  # greedy
        assert sum(math.exp(v) for v in tops) <= 1 + 1e-5
    plain, off = _greedy(model, None)
    assert plain == text and off.logprobs is None  # asking changes nothing else


@pytest.mark.slow
def test_a_hot_sampler_does_not_change_the_reported_distribution(model):
    from localinfer.engine.batch import BatchDecoder, SeqJob
    from localinfer.request.sampling import SamplingOptions

    _, greedy = _greedy(model, 2)
    # the same first token's distribution, reported before temperature and penalties
    hot = SamplingOptions(temperature=1.5, repeat_penalty=1.3, seed=1)
    with BatchDecoder(model, 2) as dec:
        (res,) = dec.run([SeqJob("k", _prompt(model), hot, max_tokens=1, logprobs=2)])
    first = res.stats.logprobs[0]
    assert [t["token"] for t in first["top_logprobs"]] == [t["token"] for t in greedy.logprobs[0]["top_logprobs"]]
    for a, b in zip(first["top_logprobs"], greedy.logprobs[0]["top_logprobs"]):
        assert a["logprob"] == pytest.approx(b["logprob"], abs=1e-3)


@pytest.mark.slow
def test_batch_decoder_matches_one_sequence_and_trims_at_a_stop(model):
    from localinfer.engine.batch import BatchDecoder, SeqJob
    from localinfer.request.sampling import SamplingOptions

    text, stats = _greedy(model, 3)
    stop = text[text.index("\n") + 1 :][:2]  # the second line's start: cut from the text returned
    jobs = [SeqJob("all", _prompt(model), SamplingOptions(temperature=0), max_tokens=12, logprobs=3),
            SeqJob("stop", _prompt(model), SamplingOptions(temperature=0), max_tokens=12, stop=(stop,), logprobs=3),
            SeqJob("off", _prompt(model), SamplingOptions(temperature=0), max_tokens=12)]  # fmt: skip
    with BatchDecoder(model, 2) as dec:
        results = {r.key: r for r in dec.run(jobs)}
    assert results["all"].text == text and results["off"].stats.logprobs is None
    for a, b in zip(results["all"].stats.logprobs, stats.logprobs, strict=True):
        assert a["token"] == b["token"] and a["logprob"] == pytest.approx(b["logprob"], abs=1e-3)
    cut = results["stop"]
    assert cut.text == text[: text.index(stop)]
    assert b"".join(bytes(e["bytes"]) for e in cut.stats.logprobs).decode() == cut.text


@pytest.mark.slow
def test_run_json_and_the_api_carry_the_same_list(smollm2_path):
    res = run_cli("run", "--json", "--logprobs", "2", "-m", str(smollm2_path), "--temperature", "0", "-n", "6",
                  "--offline", "-t", "2", "Name three colors.")  # fmt: skip
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert "".join(e["token"] for e in out["logprobs"]) == out["text"]
    assert all(len(e["top_logprobs"]) == 2 and set(e) == {"token", "logprob", "bytes", "top_logprobs"} for e in out["logprobs"])
    import localinfer

    with localinfer.load(str(smollm2_path), n_ctx=512, n_threads=2, offline=True) as m:
        r = m.generate("Name three colors.", temperature=0, max_tokens=6, logprobs=2)
    assert r.text == out["text"] and r.logprobs is not None
    assert [(e["token"], round(e["logprob"], 3)) for e in r.logprobs] == [(e["token"], round(e["logprob"], 3)) for e in out["logprobs"]]
    bad = run_cli("run", "--logprobs", "2", "-m", str(smollm2_path), "--offline", "hi")
    assert bad.returncode == 2 and "--logprobs needs --json" in bad.stderr.decode()
    bad = run_cli("run", "--json", "--logprobs", "21", "-m", str(smollm2_path), "--offline", "hi")
    assert bad.returncode == 2 and "between 0 and 20" in bad.stderr.decode()


@pytest.mark.slow
def test_batch_lines_carry_logprobs(smollm2_path, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"id": "a", "prompt": "Name three colors.", "logprobs": true, "top_logprobs": 1}\n'
                   '{"id": "b", "prompt": "Name three colors."}\n'
                   '{"id": "c", "prompt": "x", "top_logprobs": 21, "logprobs": true}\n')  # fmt: skip
    res = run_cli("batch", str(inp), "-m", str(smollm2_path), "--temperature", "0", "-n", "6", "--offline", "-t", "2", "--keep-order")
    out = {r["id"]: r for r in map(json.loads, res.stdout.decode().splitlines())}
    assert "".join(e["token"] for e in out["a"]["logprobs"]) == out["a"]["text"]
    assert all(len(e["top_logprobs"]) == 1 for e in out["a"]["logprobs"])
    assert "logprobs" not in out["b"] and out["b"]["text"] == out["a"]["text"]
    assert out["c"]["error"] == TOO_MANY


# -- serve, the openai client, and llama-server as the reference -----------------------------------------
@pytest.fixture(scope="module")
def serve(smollm2_path, tmp_path_factory):
    from test_serve_model import ServeProcess

    with ServeProcess(smollm2_path, "-np", "2", "-c", "1024", "-t", "2", home=tmp_path_factory.mktemp("serve-home")) as s:
        yield s


def _client(base: str):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=base, api_key="none", max_retries=0)


@pytest.mark.slow
def test_serve_and_llama_server_agree_token_by_token(serve, llama_server):  # noqa: F811
    args = {"model": "m", "messages": HI, "temperature": 0, "max_tokens": 16, "logprobs": True, "top_logprobs": 3}
    ours = _client(serve.base + "/v1").chat.completions.create(**args)
    theirs = _client(llama_server).chat.completions.create(**args)
    a, b = ours.choices[0].logprobs.content, theirs.choices[0].logprobs.content
    assert ours.choices[0].message.content == theirs.choices[0].message.content
    if theirs.choices[0].finish_reason == "stop" and b and not b[-1].bytes:
        b = b[:-1]  # llama-server lists the end-of-generation token too; we list the answer's tokens
    assert [bytes(e.bytes) for e in a] == [bytes(e.bytes) for e in b] and len(a) >= 8
    for x, y in zip(a, b):
        assert abs(x.logprob - y.logprob) <= 0.05, (x.token, x.logprob, y.logprob)
        theirs_top = {t.token: t.logprob for t in y.top_logprobs}
        assert len(x.top_logprobs) == 3
        for t in x.top_logprobs:  # a tie at the third place may order differently
            if t.token in theirs_top:
                assert abs(t.logprob - theirs_top[t.token]) <= 0.05
        assert x.top_logprobs[0].token == y.top_logprobs[0].token


@pytest.mark.slow
def test_serve_streams_per_chunk_what_it_answers_whole(serve):
    client = _client(serve.base + "/v1")
    args = {"model": "m", "messages": HI, "temperature": 0, "max_tokens": 10, "logprobs": True, "top_logprobs": 2}
    whole = client.chat.completions.create(**args).choices[0]
    chunks = list(client.chat.completions.create(stream=True, **args))
    streamed = [e for c in chunks for ch in c.choices if ch.logprobs and ch.logprobs.content for e in ch.logprobs.content]
    text = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
    assert text == whole.message.content == "".join(e.token for e in streamed)
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in whole.logprobs.content]
    legacy = client.completions.create(model="m", prompt="The sky is", temperature=0, max_tokens=6, logprobs=2).choices[0]
    assert "".join(legacy.logprobs.tokens) == legacy.text and len(legacy.logprobs.top_logprobs[0]) == 2
    assert legacy.logprobs.text_offset[0] == 0


@pytest.mark.slow
def test_bad_logprobs_are_400_and_the_server_keeps_serving(serve):
    openai = pytest.importorskip("openai")
    client = _client(serve.base + "/v1")
    for bad in ({"logprobs": True, "top_logprobs": 21}, {"top_logprobs": 2}, {"logprobs": "yes"}):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="m", messages=HI, max_tokens=2, **bad)
        assert info.value.status_code == 400 and "logprobs" in str(info.value)
    ok = client.chat.completions.create(model="m", messages=HI, max_tokens=2, logprobs=True)
    assert ok.choices[0].logprobs.content[0].top_logprobs == []


@pytest.mark.slow
def test_endpoint_maps_a_servers_logprobs_into_the_same_shape(serve, llama_server, smollm2_path):  # noqa: F811
    def run(*where: str) -> dict:
        res = run_cli("run", "--json", "--logprobs", "2", "--temperature", "0", "-n", "8", *where, "Name three colors.")
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    ours = run("--endpoint", serve.base + "/v1")
    theirs = run("--endpoint", llama_server)
    for out in (ours, theirs):
        assert "".join(e["token"] for e in out["logprobs"]) == out["text"]
        assert all(len(e["top_logprobs"]) == 2 for e in out["logprobs"])
    assert [e["token"] for e in ours["logprobs"]] == [e["token"] for e in theirs["logprobs"]]
    for x, y in zip(ours["logprobs"], theirs["logprobs"]):
        assert abs(x["logprob"] - y["logprob"]) <= 0.05
