"""Serve's sequences keep what they held, and what an idle sequence would lose goes to host memory
(engine.prompt_cache, `serve --cache-ram`): an agent's session survives an unrelated request that took
the only sequence, a second session with the same system prompt evaluates only what differs, a
cancelled request's retry finds what it evaluated - and the answers are those of a fresh cache."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest
from test_serve_model import _loaded

from localinfer.engine.batch import BatchDecoder, SeqJob
from localinfer.engine.prompt_cache import MIN_TOKENS
from localinfer.engine.rows import EXACT_ROWS
from localinfer.request.sampling import SamplingOptions

pytestmark = pytest.mark.slow
GREEDY = SamplingOptions(temperature=0.0)
MB = 1 << 20


@pytest.fixture(scope="module")
def loaded(smollm2_path):
    model = _loaded(smollm2_path, 1, 2048)
    yield model
    model.close()


def _one_at_a_time(jobs: list[SeqJob]) -> Any:
    """Each job once the one before has ended: turns of a session, a request between them."""
    done: dict[str, Any] = {}

    def source():
        for job in jobs:
            yield job
            while job.key not in done:
                yield None

    return source, done


def _run(model: Any, jobs: list[SeqJob], **kw: Any) -> tuple[dict[str, Any], BatchDecoder]:
    source, done = _one_at_a_time(jobs)
    with BatchDecoder(model, 1, keep_cache=True, **kw) as decoder:
        for r in decoder.run(source()):
            done[r.key] = r
    return done, decoder


def test_a_session_survives_an_unrelated_request_on_the_only_sequence(loaded):
    model = loaded.model
    rng = random.Random(7)
    system = [model.bos_token] + [rng.randrange(1000, 40000) for _ in range(700)]  # an agent's system prompt and tools
    turn1 = system + model.tokenize(" First question:", add_special=False)
    other = [model.bos_token] + [rng.randrange(1000, 40000) for _ in range(400)]  # a title call, another agent
    turn2 = turn1 + model.tokenize(" And a second question:", add_special=False)
    second_session = system + model.tokenize(" Another session asks:", add_special=False)
    jobs = [SeqJob(k, t, GREEDY, max_tokens=4, ignore_eos=True)
            for k, t in (("turn1", turn1), ("other", other), ("turn2", turn2), ("other2", other), ("second", second_session))]  # fmt: skip
    cached, decoder = _run(model, jobs, cache_bytes=256 * MB)
    plain, _ = _run(model, jobs)  # no host cache: the sequence kept only the last prompt
    with BatchDecoder(model, 1) as fresh:
        alone = {r.key: r for r in fresh.run(jobs)}  # nothing reused at all
    # only its new tokens evaluated, and at least its last EXACT_ROWS: as a cold prompt evaluates them
    assert cached["turn2"].stats.cached_tokens == min(len(turn1), len(turn2) - EXACT_ROWS) > 600
    assert cached["second"].stats.cached_tokens == min(len(system), len(second_session) - EXACT_ROWS) > 600  # the shared system prompt and tools
    assert plain["turn2"].stats.cached_tokens <= 1 and plain["second"].stats.cached_tokens <= 1  # the BOS it shares with "other"
    assert cached["other2"].stats.cached_tokens == len(other) - EXACT_ROWS  # the title call came back too
    assert {k: r.text for k, r in cached.items()} == {k: r.text for k, r in alone.items()}, "the same greedy answers"
    stats = decoder.prompt_cache.stats
    assert stats.hits == 3 and stats.tokens_restored == sum(cached[k].stats.cached_tokens for k in ("turn2", "second", "other2"))
    assert 0 < stats.bytes <= 256 * MB and stats.entries >= 1


def test_the_cache_keeps_within_its_bound_least_recently_used_out_first(loaded):
    model = loaded.model
    rng = random.Random(3)
    prompts = {f"p{i}": [model.bos_token] + [rng.randrange(1000, 40000) for _ in range(MIN_TOKENS + 50)] for i in range(3)}
    jobs = [SeqJob(k, t, GREEDY, max_tokens=2, ignore_eos=True) for k, t in prompts.items()]
    _, first = _run(model, jobs[:2], cache_bytes=512 * MB)  # p0 saved when p1 took the sequence
    one = first.prompt_cache.stats.bytes
    assert first.prompt_cache.stats.entries == 1 and one > 0
    # room for one entry: p0 goes when p1 is saved (p2 takes the sequence), p1 stays
    again = [*jobs, SeqJob("p1 again", prompts["p1"] + [42], GREEDY, max_tokens=2, ignore_eos=True),
             SeqJob("p0 again", prompts["p0"] + [42], GREEDY, max_tokens=2, ignore_eos=True)]  # fmt: skip
    done, decoder = _run(model, again, cache_bytes=one + one // 2)
    assert done["p0 again"].stats.cached_tokens <= 1  # the BOS the sequence's last prompt shares
    assert done["p1 again"].stats.cached_tokens == len(prompts["p1"]) + 1 - EXACT_ROWS
    assert decoder.prompt_cache.stats.bytes <= one + one // 2
    # short prompts are evaluated again rather than copied: nothing kept for them
    short = [SeqJob(f"s{i}", [model.bos_token] + [rng.randrange(1000, 40000) for _ in range(40)], GREEDY, max_tokens=2) for i in range(3)]
    _, small = _run(model, short, cache_bytes=512 * MB)
    assert small.prompt_cache.stats.entries == 0


def test_a_cancelled_requests_retry_finds_what_it_evaluated(smollm2_path):
    # Claude Code drops a stream silent for 300 s and retries at once: the retry used to be admitted to
    # another (empty) sequence before the cancelled one was freed, and evaluated everything again
    loaded = _loaded(smollm2_path, 2, 1024)
    try:
        model = loaded.model
        prompt = model.tokenize("Once upon a time, in a land far away, there lived a" + " king, and a queen, and a dragon" * 10)
        cancel, pieces = threading.Event(), []
        retry_ready = threading.Event()

        def on_text(text: str) -> None:
            pieces.append(text)
            if len(pieces) == 2:
                cancel.set()  # the client went away...
                retry_ready.set()  # ...and its retry arrives in the same step

        def source():
            yield SeqJob("cancelled", prompt, GREEDY, max_tokens=200, ignore_eos=True, on_text=on_text, cancel=cancel)
            while not retry_ready.is_set():
                yield None
            yield SeqJob("retry", prompt, GREEDY, max_tokens=4, ignore_eos=True)

        with BatchDecoder(model, 2, keep_cache=True) as decoder:
            results = {r.key: r for r in decoder.run(source())}
    finally:
        loaded.close()
    assert results["cancelled"].stats.finish_reason == "interrupted"
    assert results["retry"].stats.cached_tokens == len(prompt) - EXACT_ROWS > 0, "the retry found the cancelled request's cells"


def test_serve_keeps_a_session_through_another_request_and_counts_it(smollm2_path, tmp_path):
    from test_serve_model import ServeProcess

    system = "You are a careful assistant. " + " ".join(f"Rule {i}: answer in plain words about topic {i}." for i in range(60))
    turn1 = [{"role": "system", "content": system}, {"role": "user", "content": "Say hi."}]
    other = [{"role": "user", "content": " ".join(f"Title {i} of an unrelated chat." for i in range(60))}]
    turn2 = [*turn1, {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Again."}]
    with ServeProcess(smollm2_path, "-np", "1", "-c", "2048", "--cache-ram", "256", home=tmp_path) as s:
        usage = {}
        for key, messages in (("turn1", turn1), ("other", other), ("turn2", turn2)):
            status, body = s.json("POST", "/v1/chat/completions", {"messages": messages, "max_tokens": 2, "temperature": 0})
            assert status == 200, body
            usage[key] = body["usage"]
        m = s.metrics()
        assert "prompt cache: up to 256 MiB of host memory per model (--cache-ram)" in s.stderr
    cached = usage["turn2"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == usage["turn2"]["prompt_tokens"] - EXACT_ROWS > 800, usage  # the session came back from host memory
    assert m["localinfer_prompt_cache_hits_total"] == 1 and m["localinfer_prompt_cache_tokens_total"] == cached
    assert m["localinfer_prompt_cache_entries"] >= 1 and 0 < m["localinfer_prompt_cache_bytes"] <= 256 << 20


def test_a_sessions_turns_keep_one_copy_not_one_each(loaded):
    # each turn shares all of the last one but its answer (an agent re-renders it): kept whole, every
    # turn added another copy of the session (agent_session.py: 10 entries, 750 MiB for one 4k session)
    model = loaded.model
    rng = random.Random(11)
    turn = [model.bos_token] + [rng.randrange(1000, 40000) for _ in range(600)]
    other = [model.bos_token] + [rng.randrange(1000, 40000) for _ in range(300)]
    jobs, turns = [], []
    for i in range(4):
        turn = turn + [rng.randrange(1000, 40000) for _ in range(EXACT_ROWS + 16)]  # the answer as re-rendered, and a question
        turns.append(turn)
        jobs += [SeqJob(f"turn{i}", turn, GREEDY, max_tokens=3, ignore_eos=True), SeqJob(f"other{i}", other, GREEDY, max_tokens=2)]
    done, decoder = _run(model, jobs, cache_bytes=512 * MB)
    for i in range(1, 4):
        assert done[f"turn{i}"].stats.cached_tokens == len(turns[i - 1]), i  # each turn found the last one
    stats = decoder.prompt_cache.stats
    assert stats.entries == 2, "the session's latest turn and the other prompt"
    with BatchDecoder(model, 1, keep_cache=True, cache_bytes=512 * MB) as one:
        list(one.run([SeqJob("t", turns[-1], GREEDY, max_tokens=3, ignore_eos=True), SeqJob("o", other, GREEDY, max_tokens=2)]))
        assert stats.bytes <= 2 * one.prompt_cache.stats.bytes, "about one copy of the session, not four"


def test_a_prompt_found_in_the_cache_gives_an_empty_caches_answer_to_the_last_bit(loaded):
    # llama.cpp's flash attention evaluates a row otherwise in a ubatch of fewer than 64 rows of its
    # sequence (benchmarks/split_logits.py: the last token's logits 0.4-0.7 apart): a prompt found whole
    # in the cache used to have its last token evaluated alone, a turn its few new ones, and a 530-token
    # prompt ended in a ubatch of 18 - a greedy answer could change with the cache (a forced tool call's
    # {"a":1} became {"a":17}). Every one of these is evaluated as an empty cache evaluates it.
    model = loaded.model
    text = " ".join(f"Item {i}: the {c} box holds {i * 3} marbles." for i, c in enumerate(["red", "blue", "green", "white"] * 8))
    prompt = model.tokenize(text + " The box with the most marbles is the")
    assert 300 < len(prompt) < 512
    question = model.tokenize(" Say it again: the box with the most marbles is the", add_special=False)
    rng = random.Random(5)
    long = [model.bos_token] + [rng.randrange(1000, 40000) for _ in range(529)]  # a ubatch and 18 rows
    keys = {"cold": prompt, "again": prompt, "turn": prompt + question, "long": long, "long again": long,
            "long+": long + question}  # fmt: skip
    jobs = [SeqJob(k, t, GREEDY, max_tokens=8, ignore_eos=True, logprobs=3) for k, t in keys.items()]
    cached, _ = _run(model, jobs, cache_bytes=256 * MB)
    with BatchDecoder(model, 1) as fresh:
        alone = {r.key: r for r in fresh.run(jobs)}
    assert cached["again"].stats.cached_tokens == len(prompt) - EXACT_ROWS  # its last rows evaluated, as a cold prompt's
    for key in ("turn", "long again", "long+"):  # each a prompt whose start the cache holds
        assert cached[key].stats.cached_tokens == len(keys[key]) - EXACT_ROWS, key
    for key in keys:
        assert alone[key].stats.cached_tokens == 0
        assert cached[key].text == alone[key].text, key
        assert cached[key].stats.logprobs == alone[key].stats.logprobs, key  # every top logprob, bit for bit
