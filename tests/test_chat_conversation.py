"""localinfer.chat.conversation: settings, files and, on the real SmolLM2, cache reuse across turns,
trimming to the context window, interruption, retry, /clear and model switching."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from localinfer.chat.settings import ChatSettings
from localinfer.chat.session import block_open, split_command, unwrap_block
from localinfer.chat.conversation import Conversation
from localinfer.chat.files import parse_messages
from localinfer.engine.types import LoadOptions
from localinfer.request.sampling import SamplingOptions
from localinfer.errors import ContextOverflowError, UsageError

GREEDY = SamplingOptions(temperature=0.0)


# -- no model needed ---------------------------------------------------------------------------------


def test_settings_parse_validate_and_alias():
    s = ChatSettings()
    s = s.with_value("temperature", "0")
    assert s.sampling.temperature == 0.0 and s.sampling.greedy
    s = s.with_value("top-p", "0.5").with_value("top_k", "7").with_value("min_p", "0.1")
    s = s.with_value("repeat_penalty", "1.1").with_value("repeat-last-n", "-1")
    assert (s.sampling.top_p, s.sampling.top_k, s.sampling.min_p) == (0.5, 7, 0.1)
    assert (s.sampling.repeat_penalty, s.sampling.repeat_last_n) == (1.1, -1)
    s = s.with_value("seed", "42").with_value("max_tokens", "3")
    assert s.sampling.seed == 42 and s.max_tokens == 3
    s = s.with_value("seed", "random").with_value("max_tokens", "none").with_value("temp", "0.7")
    assert s.sampling.seed is None and s.max_tokens is None and s.sampling.temperature == 0.7
    s = s.with_value("stop", '"END"').with_value("stop", "###")
    assert s.stop == ("END", "###")
    assert s.with_value("stop", "none").stop == ()
    shown = dict(s.items())
    assert shown["temperature"] == "0.7" and shown["seed"] == "random" and shown["stop"] == "'END', '###'"


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("temperature", "-1", "between 0 and 2"),
        ("top_p", "1.5", "between 0 and 1"),
        ("top_k", "many", "an integer"),
        ("max_tokens", "0", ">= 1"),
        ("seed", "4294967295", "between 0 and 4294967294"),
        ("temperature", "nan", "number"),
        ("temperature", "", "needs a value"),
    ],
)
def test_settings_bad_values_say_what_is_valid(key, value, words):
    with pytest.raises(UsageError) as info:
        ChatSettings().with_value(key, value)
    assert words in str(info.value)


def test_settings_unknown_key_lists_the_keys():
    with pytest.raises(UsageError) as info:
        ChatSettings().with_value("creativity", "11")
    assert "creativity" in str(info.value) and "temperature" in info.value.hint and "max_tokens" in info.value.hint


def test_multiline_blocks_and_commands():
    assert block_open('"""') and block_open('"""first line') and block_open('"""\nsome\nlines')
    assert not block_open('"""one line"""') and not block_open('"""\na\nb\n"""') and not block_open("hello")
    assert unwrap_block('"""\nline one\nline two\n"""') == "line one\nline two"
    assert unwrap_block('"""inline"""') == "inline"
    assert unwrap_block('"""unclosed\nrest') == "unclosed\nrest"
    assert unwrap_block("plain") == "plain"
    assert split_command("/set  temperature 0 ") == ("set", "temperature 0")
    assert split_command("/EXIT") == ("exit", "")


def test_parse_messages_accepts_openai_shapes_and_rejects_others():
    msgs, marks = parse_messages(
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": "ok"},
            ],
            "interrupted": [2],
        }
    )
    assert msgs == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "ok"},
    ]
    assert marks == {2}
    assert parse_messages([{"role": "user", "content": "hi"}])[0] == [{"role": "user", "content": "hi"}]
    for bad in ({"msgs": []}, [{"role": "robot", "content": "x"}], [{"role": "user", "content": 3}],
                [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "text"):
        with pytest.raises(UsageError):
            parse_messages(bad)


# -- on the real model -------------------------------------------------------------------------------


def _conv(smollm2_path, *, n_ctx=1024, system=None, sampling=GREEDY, max_tokens=24, notes=None):
    from localinfer.generate import loading
    from localinfer.store import resolve_model

    resolved = resolve_model(str(smollm2_path))
    loaded = loading.load(resolved, LoadOptions(n_ctx=n_ctx, n_threads=1))
    notify = notes.append if notes is not None else None
    return Conversation(
        loaded, system=system, settings=ChatSettings(sampling=sampling, max_tokens=max_tokens), notify=notify
    )


def _collect():
    parts: list[str] = []
    return parts, parts.append


@pytest.mark.slow
def test_second_turn_evaluates_only_the_new_tokens(smollm2_path):
    conv = _conv(smollm2_path, system="You are terse.")
    try:
        parts, write = _collect()
        r1 = conv.ask("What is the capital of France?", write)
        assert r1.text == "".join(parts) and r1.text.strip()
        assert r1.stats.cached_tokens == 0 and r1.stats.evaluated_tokens == r1.stats.prompt_tokens
        in_cache = len(conv.model.cached_tokens)
        assert in_cache >= r1.stats.prompt_tokens + r1.stats.completion_tokens - 1
        r2 = conv.ask("And of Italy?", lambda _t: None)
        # Everything from turn 1 (prompt and answer) is reused; only the new message is evaluated.
        assert r2.stats.cached_tokens == in_cache
        assert r2.stats.evaluated_tokens < 20
        assert [m["role"] for m in conv.history] == ["user", "assistant", "user", "assistant"]
        assert conv.history[1]["content"] == r1.text and conv.history[3]["content"] == r2.text
        assert conv.totals.turns == 2 and conv.totals.cached_tokens == in_cache
    finally:
        conv.close()


@pytest.mark.slow
def test_sampled_tokens_are_reused_even_when_not_canonical(smollm2_path):
    """At temperature 1.3 with no top-k, answers often contain token sequences the tokenizer would
    merge differently; re-tokenizing the history would lose the cache inside the answer."""
    wild = SamplingOptions(temperature=1.3, top_k=0, top_p=1.0, min_p=0.0)
    diverged = 0
    for seed in range(3):
        conv = _conv(smollm2_path, sampling=SamplingOptions(**{**wild.__dict__, "seed": seed}), max_tokens=40)
        try:
            conv.ask("Write a poem with emojis 😀 and code `x=1`.", lambda _t: None)
            cache = conv.model.cached_tokens
            follow_up = "Now in French: été, où?"
            canonical = conv._tokenize(conv._render(conv.context_messages() + [{"role": "user", "content": follow_up}]))
            diverged += canonical[: len(cache)] != cache
            conv.set("max_tokens", "1")
            r2 = conv.ask(follow_up, lambda _t: None)
            assert r2.stats.cached_tokens == len(cache), f"seed {seed}"
        finally:
            conv.close()
    assert diverged, "no answer was tokenized non-canonically: this test did not exercise the splice"


@pytest.mark.slow
def test_overflow_drops_oldest_turns_and_keeps_the_system_prompt(smollm2_path):
    notes: list[str] = []
    system = "You are Captain Hook, a pirate. Answer in one short sentence."
    conv = _conv(smollm2_path, n_ctx=256, system=system, max_tokens=16, notes=notes)
    try:
        assert conv.n_ctx == 256
        filler = "Tell me about the sea, the ships, the wind, the waves, the treasure and the islands. " * 2
        results = [conv.ask(f"Question {i}: {filler}", lambda _t: None) for i in range(5)]
        assert notes and all("dropped" in n and "system prompt is kept" in n and "256-token" in n for n in notes)
        assert conv.start > 0 and conv.totals.dropped_turns == conv.start
        assert all(r.stats.prompt_tokens + r.stats.completion_tokens <= 256 for r in results)
        # What the model saw last starts with the system prompt, and that prefix came from the cache.
        seen = "".join(conv.model.token_text(t) for t in conv.model.cached_tokens)
        assert seen.startswith(f"<|im_start|>system\n{system}<|im_end|>")
        trimmed = next(i for i, r in enumerate(results) if i and r.stats.cached_tokens < results[i - 1].stats.context_used)
        assert results[trimmed].stats.cached_tokens >= len(conv.model.tokenize(system, add_special=False))
        # The full transcript is still there for /save; the next turns reuse the cache again.
        assert len(conv.history) == 10 and conv.to_json()["messages"][0] == {"role": "system", "content": system}
        before = len(notes)
        r = conv.ask("Ok?", lambda _t: None)
        if len(notes) == before:
            assert r.stats.cached_tokens > 0
    finally:
        conv.close()


@pytest.mark.slow
def test_a_message_too_long_for_the_context_is_refused_and_nothing_is_lost(smollm2_path):
    conv = _conv(smollm2_path, n_ctx=256, system="Be brief.", max_tokens=8)
    try:
        conv.ask("Hi", lambda _t: None)
        history = [dict(m) for m in conv.history]
        with pytest.raises(ContextOverflowError) as info:
            conv.ask("word " * 400, lambda _t: None)
        assert "256-token context" in str(info.value) and "--ctx-size" in info.value.hint
        assert conv.history == history and conv.start == 0
        r = conv.ask("Bye", lambda _t: None)
        assert r.stats.cached_tokens > 0
    finally:
        conv.close()


@pytest.mark.slow
def test_interrupted_answer_stays_marked_and_the_next_turn_reuses_it(smollm2_path):
    conv = _conv(smollm2_path, sampling=SamplingOptions(seed=5), max_tokens=None)
    try:
        got: list[str] = []

        def write(text: str) -> None:
            if len(got) == 6:
                raise KeyboardInterrupt
            got.append(text)

        r = conv.ask("Write a long story about a dragon.", write)
        assert r.finish_reason == "interrupted" and r.text == "".join(got) and r.stats.completion_tokens >= 6
        assert r.stats.context_used == len(conv.model.cached_tokens) > r.stats.prompt_tokens
        assert conv.history[-1] == {"role": "assistant", "content": r.text, "interrupted": True}
        assert conv.to_json()["interrupted"] == [1]
        in_cache = len(conv.model.cached_tokens)
        conv.set("max_tokens", "8")
        r2 = conv.ask("Shorter, please.", lambda _t: None)
        assert r2.finish_reason in ("stop", "length")
        assert r2.stats.cached_tokens >= in_cache - 1
        assert conv.totals.interrupted == 1

        # Interrupted before the first word: the message is dropped with it.
        def stop_at_once(text: str) -> None:
            raise KeyboardInterrupt

        n = len(conv.history)
        r3 = conv.ask("Another one.", stop_at_once)
        assert r3.finish_reason == "interrupted" and r3.text == "" and len(conv.history) == n
    finally:
        conv.close()


@pytest.mark.slow
def test_retry_regenerates_and_clear_empties_the_cache(smollm2_path):
    conv = _conv(smollm2_path, system="You are terse.", max_tokens=12)
    try:
        r1 = conv.ask("Name a color.", lambda _t: None)
        r2 = conv.retry(lambda _t: None)
        assert r2.text == r1.text  # greedy: the same answer again
        assert len(conv.history) == 2 and conv.history[1]["content"] == r2.text
        # Greedy, so promised the same: evaluated as the first answer was (from the same position, in
        # the same batches). Evaluating only the last token, all else cached, gave other logits and,
        # on near-ties, another answer (issue 31).
        assert (r2.stats.cached_tokens, r2.stats.evaluated_tokens) == (r1.stats.cached_tokens, r1.stats.evaluated_tokens)
        conv.set("temperature", "1.5")
        conv.set("seed", "9")
        r3 = conv.retry(lambda _t: None)
        assert len(conv.history) == 2 and conv.history[1]["content"] == r3.text
        assert r3.stats.cached_tokens == r1.stats.cached_tokens  # a fixed seed promises the same too
        assert conv.retry(lambda _t: None).text == r3.text
        conv.set("seed", "random")
        r5 = conv.retry(lambda _t: None)
        assert r5.stats.cached_tokens == r5.stats.prompt_tokens - 1  # no promise: the prompt comes from the cache
        conv.clear()
        assert conv.history == [] and conv.model.cached_tokens == [] and conv.system == "You are terse."
        with pytest.raises(UsageError):
            conv.retry(lambda _t: None)
        r4 = conv.ask("Name a color.", lambda _t: None)
        assert r4.stats.cached_tokens == 0
    finally:
        conv.close()


@pytest.mark.slow
def test_save_and_load_round_trip(smollm2_path, tmp_path):
    conv = _conv(smollm2_path, system="You are terse.", max_tokens=10)
    try:
        a1 = conv.ask("Hello!", lambda _t: None).text
        a2 = conv.ask("How are you?", lambda _t: None).text
        path = conv.save(tmp_path / "chat.json")
        data = json.loads(path.read_text())
        assert data == {
            "model": str(smollm2_path),
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Hello!"},
                {"role": "assistant", "content": a1},
                {"role": "user", "content": "How are you?"},
                {"role": "assistant", "content": a2},
            ],
        }
        in_cache = len(conv.model.cached_tokens)
        conv.set_system(None)
        conv.history = []
        assert conv.load(path) == 5
        assert conv.system == "You are terse." and conv.to_json() == data
        r = conv.ask("Bye.", lambda _t: None)
        assert r.stats.cached_tokens == in_cache  # loading the same conversation keeps the KV cache useful
        (tmp_path / "bad.json").write_text("{not json")
        with pytest.raises(UsageError, match="not valid JSON"):
            conv.load(tmp_path / "bad.json")
        with pytest.raises(UsageError, match="cannot read"):
            conv.load(tmp_path / "missing.json")
        with pytest.raises(UsageError, match="cannot save"):
            conv.save(tmp_path / "no-such-dir" / "x.json")
        assert len(conv.history) == 6
    finally:
        conv.close()


@pytest.mark.slow
def test_a_greedy_retry_of_a_later_turn_replays_its_evaluation(smollm2_path):
    conv = _conv(smollm2_path, system="You are terse.", max_tokens=12)
    try:
        conv.ask("Name a color.", lambda _t: None)
        r1 = conv.ask("And a fruit?", lambda _t: None)
        assert r1.stats.cached_tokens > 0  # the first turn came from the cache
        r2 = conv.retry(lambda _t: None)
        assert r2.text == r1.text and (r2.stats.cached_tokens, r2.stats.evaluated_tokens) == (
            r1.stats.cached_tokens, r1.stats.evaluated_tokens)  # fmt: skip
        assert len(conv.history) == 4 and conv.history[3]["content"] == r2.text
    finally:
        conv.close()


@pytest.mark.slow
def test_a_long_loaded_conversation_is_fitted_in_log_n_renders_keeping_the_same_turns(smollm2_path, tmp_path):
    notes: list[str] = []
    conv = _conv(smollm2_path, n_ctx=512, max_tokens=4, notes=notes)
    try:
        messages = [{"role": ("user", "assistant")[i % 2], "content": f"message {i}"} for i in range(2000)]
        (tmp_path / "long.json").write_text(json.dumps({"messages": messages}))
        assert conv.load(tmp_path / "long.json") == 2000
        conv.history.append({"role": "user", "content": "And now?"})
        # What dropping the oldest turns one by one keeps: the first user message from which the prompt
        # fits. Found here from the end (each step renders a short context) so the test stays cheap.
        budget = conv.n_ctx - conv.reserve()
        users = [i for i, m in enumerate(conv.history) if m["role"] == "user"]
        expected = users[-1]
        for i in reversed(users[:-1]):
            if len(conv._tokenize(conv._render(conv.context_messages(i)))) > budget:
                break
            expected = i
        conv.history.pop()

        renders: list[int] = []
        real_render = conv._render

        def counting_render(msgs):
            renders.append(len(msgs))
            assert len(renders) <= 20, "fitting renders once per dropped turn"
            return real_render(msgs)

        conv._render = counting_render  # type: ignore[method-assign]
        conv.ask("And now?", lambda _t: None)
        assert conv.start == expected and conv.totals.dropped_turns == expected > 1900
        assert len(renders) <= 2 + 11  # first and last candidate, then bisection of ~1000 starts
        assert notes == [notes[0]] and f"dropped the {expected} oldest messages" in notes[0]
        renders.clear()
        conv.ask("Again?", lambda _t: None)  # the next turn starts where the last one fitted
        assert conv.start >= expected and len(renders) <= 2 + 11
    finally:
        conv.close()


def _device_node(tmp_path):
    """A character device to save onto: a copy of /dev/full in tmp as root (so a regression cannot
    replace the real one), /dev/full itself otherwise (a user cannot replace /dev entries anyway)."""
    if os.geteuid() != 0:
        return Path("/dev/full")
    node = tmp_path / "full"
    try:
        os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(1, 7))
    except OSError:
        pytest.skip("cannot make a device node here")
    return node


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
def test_save_and_load_take_only_regular_files(smollm2_path, tmp_path):
    conv = _conv(smollm2_path, max_tokens=4)
    try:
        conv.ask("Hello!", lambda _t: None)
        fifo, real, link = tmp_path / "fifo", tmp_path / "real.json", tmp_path / "link.json"
        os.mkfifo(fifo)
        real.write_text("keep me")
        link.symlink_to(real)
        device = _device_node(tmp_path)
        for target, kind in ((fifo, "a FIFO"), (link, "a symbolic link"), (device, "a device"), (tmp_path, "a directory")):
            before = os.lstat(target)
            with pytest.raises(UsageError) as info:
                conv.save(target)
            assert str(info.value) == f"cannot save to {target}: it is {kind}; chat files are regular files"
            after = os.lstat(target)
            assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)
        assert real.read_text() == "keep me" and not list(tmp_path.glob(".*.tmp*"))

        for target, kind in ((fifo, "a FIFO"), (Path("/dev/null"), "a device"), (tmp_path, "a directory")):
            result: list[BaseException] = []
            reader = threading.Thread(target=lambda t=target: result.append(_raised(conv.load, t)), daemon=True)
            reader.start()
            reader.join(60)  # only a guard against hanging the suite: the refusal comes without waiting
            if reader.is_alive():
                with open(fifo, "wb"):  # let the blocked open return
                    pass
                pytest.fail(f"/load {target} blocked")
            assert isinstance(result[0], UsageError)
            assert str(result[0]) == f"cannot read {target}: it is {kind}; chat files are regular files"
        assert len(conv.history) == 2  # nothing was loaded

        # A link to a regular file is read through; the file it names is what /save writes.
        conv.save(real)
        assert conv.load(link) == 2
    finally:
        conv.close()


def _raised(fn, *args) -> BaseException | None:
    try:
        fn(*args)
    except BaseException as exc:  # handed to the test thread
        return exc
    return None


@pytest.mark.slow
def test_switch_model_keeps_the_conversation_and_refuses_a_model_without_template(smollm2_path, gemma_path):
    from localinfer.generate import loading
    from localinfer.store import resolve_model

    conv = _conv(smollm2_path, max_tokens=8)
    try:
        conv.ask("Hi", lambda _t: None)
        gemma = loading.load(resolve_model(str(gemma_path)), LoadOptions(n_ctx=512, n_threads=1))
        try:
            assert gemma.template is None
            with pytest.raises(UsageError, match="run --raw"):
                Conversation(gemma)
            with pytest.raises(UsageError, match="no chat template"):
                conv.switch_model(gemma)
        finally:
            gemma.close()
        assert conv.n_ctx == 1024
        other = loading.load(resolve_model(str(smollm2_path)), LoadOptions(n_ctx=512, n_threads=1))
        conv.switch_model(other, load_s=0.25)
        assert conv.n_ctx == 512 and len(conv.history) == 2
        r = conv.ask("Again", lambda _t: None)
        assert r.stats.cached_tokens == 0 and r.load_s == 0.25 and len(conv.history) == 4
    finally:
        conv.close()


@pytest.mark.slow
def test_ctrl_c_during_decoding_keeps_the_kv_cache(smollm2_path):
    """A real SIGINT from another thread mostly lands while llama_decode runs, so Python raises right
    after it returns, before the engine records the token: the engine must drop just that tail."""
    import os
    import signal
    import threading

    armed = threading.Event()

    def on_sigint(signum, frame):
        if armed.is_set():
            armed.clear()
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    conv = _conv(smollm2_path, sampling=SamplingOptions(seed=5), max_tokens=None)
    try:
        timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))

        def write(text: str) -> None:
            if not armed.is_set() and not timer.is_alive() and not timer.finished.is_set():
                armed.set()
                timer.start()

        r = conv.ask("Write a very long story about a dragon and a knight.", write)
        armed.clear()
        timer.cancel()
        assert r.finish_reason == "interrupted" and r.text
        assert r.stats.context_used == len(conv.model.cached_tokens) > r.stats.prompt_tokens
        conv.set("max_tokens", "4")
        r2 = conv.ask("Stop.", lambda _t: None)
        assert r2.stats.cached_tokens >= r.stats.context_used - 1
    finally:
        signal.signal(signal.SIGINT, previous)
        conv.close()


@pytest.mark.slow
def test_a_model_without_template_chats_with_the_registry_chat_format(gemma_path):
    """models.toml's chat_format stands in for a missing GGUF template (gemma's own turn format)."""
    from dataclasses import replace

    from localinfer.generate import loading
    from localinfer.store import resolve_model

    resolved = replace(resolve_model(str(gemma_path)), chat_format="gemma")
    loaded = loading.load(resolved, LoadOptions(n_ctx=512, n_threads=1))
    conv = Conversation(loaded, system="Answer in French.", settings=ChatSettings(sampling=GREEDY, max_tokens=6))
    try:
        assert loaded.template is not None and loaded.template.source == "registry:gemma"
        r1 = conv.ask("Hello", lambda _t: None)
        assert r1.stats.completion_tokens >= 1 and r1.stats.prompt_tokens > 3
        seen = "".join(conv.model.token_text(t) for t in conv.model.cached_tokens)
        # gemma's format has no system turn: the system text leads the first user turn (as Gemma's own template)
        assert "<start_of_turn>user\nAnswer in French.\n\nHello<end_of_turn>" in seen
        r2 = conv.ask("Again", lambda _t: None)
        assert r2.stats.cached_tokens > r1.stats.prompt_tokens - 1
    finally:
        conv.close()
