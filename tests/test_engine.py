"""The engine on the real SmolLM2 model: tokens, KV-cache reuse, exact counts, the template sandbox."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest
from conftest import needs_amx_twin, run_python

from localinfer.engine.types import GenerationStats, LoadOptions, SamplingOptions

pytestmark = pytest.mark.slow

GREEDY = SamplingOptions(temperature=0.0)


@pytest.fixture(scope="module")
def model(smollm2_path):
    from localinfer.engine.llama import Model

    m = Model(smollm2_path, LoadOptions(n_ctx=1024, n_threads=2))
    yield m
    m.close()


def run(model, prompt, sampling=GREEDY, **kw):
    stats = GenerationStats()
    text = "".join(step.text for step in model.generate(prompt, sampling, stats, **kw))
    return text, stats


def test_model_facts(model):
    assert model.n_ctx == 1024 and model.n_ctx_train == 8192
    assert model.n_layer == 30 and model.n_vocab == 49152
    assert "<|im_start|>" in model.chat_template
    assert model.load_s > 0


def test_tokenize_roundtrip(model):
    toks = model.tokenize("Hello, world! Ünïcödé ✓", add_special=False)
    assert model.detokenize(toks) == "Hello, world! Ünïcödé ✓"


def test_kv_cache_reuse_evaluates_only_new_tokens_and_changes_nothing(model):
    model.reset()
    base = model.tokenize(
        "<|im_start|>user\nTell me about cats.<|im_end|>\n<|im_start|>assistant\n", parse_special=True
    )
    first, s1 = run(model, base, max_tokens=12)
    assert s1.cached_tokens == 0 and s1.evaluated_tokens == len(base)
    again, s2 = run(model, base, max_tokens=12)
    assert again == first  # greedy: reusing the cache gives the same answer
    assert s2.cached_tokens == len(base) - 1 and s2.evaluated_tokens == 1
    longer = base + model.tokenize(" More", add_special=False)
    _, s3 = run(model, longer, max_tokens=4)
    assert s3.cached_tokens == len(base)
    model.reset()
    _, s4 = run(model, base, max_tokens=4)
    assert s4.cached_tokens == 0


def test_ignore_eos_generates_exactly_n_tokens_and_stats_add_up(model):
    model.reset()
    prompt = model.tokenize("Once upon a time")
    _, stats = run(model, prompt, SamplingOptions(seed=1), max_tokens=32, ignore_eos=True)
    assert stats.completion_tokens == 32 and stats.finish_reason == "length"
    assert stats.decode_tps and stats.decode_tps > 1 and stats.prefill_tps and stats.prefill_tps > 1
    assert stats.first_token_s and stats.first_token_s >= stats.prefill_s
    assert stats.context_used == len(prompt) + 31  # the last sampled token is never evaluated


def test_characters_split_across_tokens_stream_as_the_whole_answer_decodes(model):
    # Byte-level BPE spells most CJK characters and emoji as 2-4 byte tokens: the stream must hold
    # their first bytes back and still give exactly the text the whole token list decodes to.
    prompt = model.tokenize(
        "<|im_start|>user\nSay hello in Chinese.<|im_end|>\n<|im_start|>assistant\n", parse_special=True
    )
    model.reset()
    streamed, _ = run(model, prompt, max_tokens=40, ignore_eos=True)
    model.reset()
    run(model, prompt, max_tokens=41, ignore_eos=True)  # greedy: the same 40 tokens, all now in the cache
    tokens = model.cached_tokens[len(prompt) : len(prompt) + 40]
    pieces = [model.piece(t) for t in tokens]
    split = [p for p in pieces if not _whole_utf8(p)]
    assert len(split) >= 4 and any(_whole_utf8(p) and p for p in pieces)
    assert streamed == b"".join(pieces).decode("utf-8", errors="replace")
    assert "你好" in streamed


def test_a_broken_character_then_whole_text_streams_as_decoding_with_replacement(model, monkeypatch):
    # The sampler is scripted: the first half of an emoji, a whole word, then a whole emoji.
    from localinfer.engine import llama as engine

    star = model.tokenize("🌟", add_special=False)
    word = model.tokenize(" world", add_special=False)
    assert len(star) >= 2 and len(word) == 1
    script = [star[0], *word, *star]
    feed = iter(script)
    monkeypatch.setattr(engine.llama_cpp, "llama_sampler_sample", lambda *_: next(feed))
    model.reset()
    text, stats = run(model, model.tokenize("Hi"), max_tokens=len(script))
    assert stats.completion_tokens == len(script)
    assert text == b"".join(model.piece(t) for t in script).decode("utf-8", errors="replace")
    assert text == "\ufffd world🌟"


def _whole_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_sandboxed_template_refuses_to_escape(tmp_path):
    from localinfer.engine.templates import ChatTemplate, TemplateRefusedError

    marker = tmp_path / "pwned"
    evil = "{{ cycler.__init__.__globals__.os.popen('touch " + str(marker) + "').read() }}"
    with pytest.raises(TemplateRefusedError, match="refused by the sandbox"):
        ChatTemplate(source="gguf", template=evil).render([{"role": "user", "content": "hi"}])
    assert not marker.exists()
    evil2 = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(TemplateRefusedError):
        ChatTemplate(source="gguf", template=evil2).render([{"role": "user", "content": "hi"}])


def test_registry_chat_format_renders_without_a_gguf_template():
    from localinfer.engine.templates import ChatTemplate

    prompt = ChatTemplate(source="registry:chatml", format_name="chatml").render(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    )
    assert "<|im_start|>user\nU<|im_end|>" in prompt.text and prompt.text.rstrip().endswith(
        "<|im_start|>assistant"
    )
    assert "<|im_end|>" in prompt.stop


def test_a_template_that_rejects_the_messages_is_a_usage_error():
    from localinfer.engine.templates import ChatTemplate
    from localinfer.errors import UsageError

    strict = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}ok"
    with pytest.raises(UsageError, match="first message must be from the user"):
        ChatTemplate(source="gguf", template=strict).render([{"role": "system", "content": "S"}])


def test_a_template_is_compiled_once_for_every_turn(monkeypatch):
    # Compiling a template takes ~2-3 ms: chat renders the conversation at every turn.
    from localinfer.engine import templates
    from localinfer.engine.bindings import chat_format

    made = []
    real = chat_format().Jinja2ChatFormatter

    class Counting(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            made.append(kwargs["template"])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(chat_format(), "Jinja2ChatFormatter", Counting)
    templates._jinja_formatter.cache_clear()
    chat = templates.ChatTemplate(source="gguf", template="{% for m in messages %}<{{ m['content'] }}>{% endfor %}")
    first = chat.render([{"role": "user", "content": "a"}])
    second = chat.render([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
    assert (first.text, second.text) == ("<a>", "<a><b>") and len(made) == 1
    templates.ChatTemplate(source="gguf", template="{{ messages | length }}").render([{"role": "user", "content": "a"}])
    assert len(made) == 2
    templates._jinja_formatter.cache_clear()


@needs_amx_twin
def test_amx_twin_decodes_long_answers_the_same_way_every_time(model):
    # engine.twin: the prompt is evaluated on the main context, the answer decoded on a copy of the
    # model repacked for AMX, the KV cache copied across both ways.
    prompt = model.tokenize(
        "<|im_start|>user\nTell me about cats.<|im_end|>\n<|im_start|>assistant\n", parse_special=True
    )
    model.reset()
    first, s1 = run(model, prompt, max_tokens=40, ignore_eos=True)
    assert model.decodes_on_twin and s1.completion_tokens == 40
    again, s2 = run(model, prompt, max_tokens=40, ignore_eos=True)
    assert again == first  # the prompt's cache came back from the twin intact
    assert s2.cached_tokens == len(prompt) - 1
    answer = model.cached_tokens[len(prompt) :]
    assert len(answer) == 39  # decoded on the twin, now in the cache
    follow = model.cached_tokens + model.tokenize("<|im_end|>\n<|im_start|>user\nAnd dogs?<|im_end|>\n", parse_special=True)
    text, s3 = run(model, follow, max_tokens=40)
    assert s3.cached_tokens == len(prompt) + 39 and text.strip()
    sampled = SamplingOptions(seed=5)
    model.reset()
    a, _ = run(model, prompt, sampled, max_tokens=48)
    model.reset()
    b, _ = run(model, prompt, sampled, max_tokens=48)
    assert a == b  # same seed, same text: the first token from the prompt side, the rest from the twin
    model.reset()
    run(model, prompt, max_tokens=12)
    assert not model.decodes_on_twin  # a short answer is not worth waiting for the twin


@needs_amx_twin
def test_the_twin_context_has_room_for_the_answer_and_grows_for_a_longer_one(smollm2_path, monkeypatch):
    # The twin's context is made after the first token, and the answer waits for it: it is made as
    # large as the answer can reach (its KV cache is most of the wait; without flash attention the
    # decode slows with it too), at most twin.ROOM beyond the cache; made again, at least twice as
    # large, for a later answer that needs more; and grown the same way mid-answer when an answer
    # fills it. A twin made full size from the start decodes the same text.
    from localinfer.engine import twin as twin_mod
    from localinfer.engine.llama import Model

    opts = LoadOptions(n_ctx=1024, n_threads=2)
    with Model(smollm2_path, opts) as sized, Model(smollm2_path, opts) as full:
        prompt = sized.tokenize("Once upon a time")
        short, _ = run(sized, prompt, max_tokens=40, ignore_eos=True)
        assert sized.decodes_on_twin and sized._twin.n_ctx == 256  # 5 + 40 tokens, in steps of 256
        sized.reset()
        long, stats = run(sized, prompt, max_tokens=300, ignore_eos=True)
        assert sized.decodes_on_twin and sized._twin.n_ctx == 512 and stats.completion_tokens == 300
        full.prepare_decode_twin()
        assert full._twin.ready()
        # with the flash attention the first, shallow answer kept on `sized`'s twin (twin.shallow)
        assert not sized._twin.v_transposed
        assert full._twin.remake(twin_mod.decode_settings(full._params[1], 1024, True)) and full._twin.n_ctx == 1024
        assert run(full, prompt, max_tokens=300, ignore_eos=True)[0] == long and long.startswith(short)
        monkeypatch.setattr(twin_mod, "ROOM", 64)
        sized.close()
    grew = []
    original = Model._grow_twin
    monkeypatch.setattr(Model, "_grow_twin", lambda self: grew.append(self._twin.n_ctx) or original(self))
    with Model(smollm2_path, opts) as growing:  # 5 + 64 tokens: 256 cells, grown to 512 mid-answer
        grown, stats = run(growing, prompt, max_tokens=300, ignore_eos=True)
        assert growing.decodes_on_twin and growing._twin.n_ctx == 512 and stats.completion_tokens == 300
        assert grew == [256]
        assert grown == long


def test_an_answer_is_shallow_when_its_mean_depth_stays_under_the_crossover():
    from localinfer.engine import twin

    assert twin.shallow(5, 5 + 127 + 1)  # `run --raw -n 128` on a 4-token prompt: mean depth 69
    assert twin.shallow(48, 48 + 127 + 1)  # the chat template's 48-token prompt: 112
    assert twin.shallow(5, 5 + twin.ROOM + 1)  # an answer with no cap, in its first context
    assert not twin.shallow(420, 420 + 63 + 1)  # a 420-token prompt: 452
    assert not twin.shallow(512, 1024)  # that answer's context, full, made twice as large
    # with an F16 V cache (no AVX512-BF16), flash attention pays off only nearer the start
    assert twin.shallow(5, 5 + 127 + 1, bf16_v=False) and not twin.shallow(48, 48 + 127 + 1, bf16_v=False)


@needs_amx_twin
def test_a_shallow_answer_keeps_flash_attention_on_the_twin_and_a_deep_one_decodes_without(smollm2_path):
    # Without flash attention the twin reads all 256 cells of its smallest context at every token;
    # with it, only those in use, and its V cache is BF16 (twin.decode_settings): faster while the
    # cache stays shallow (twin.shallow).
    from localinfer.engine.backend import cpu_has_avx512_bf16
    from localinfer.engine.llama import Model

    bf16, f16 = 30, 1
    opts = LoadOptions(n_ctx=1024, n_threads=2)
    with Model(smollm2_path, opts) as m:
        prompt = m.tokenize("Once upon a time")
        first, _ = run(m, prompt, max_tokens=64, ignore_eos=True)
        assert m.decodes_on_twin and not m._twin.v_transposed  # 5 -> 69 cells
        assert m._twin.v_type == (bf16 if cpu_has_avx512_bf16() else f16)
        m.reset()
        assert run(m, prompt, max_tokens=64, ignore_eos=True)[0] == first  # the cache's layout round-trips
        follow = m.cached_tokens + m.tokenize(" The end.", add_special=False)
        text, stats = run(m, follow, max_tokens=40)  # the cache came back in this context's type
        assert stats.cached_tokens == len(prompt) + 63 and text
        deep = m.tokenize("The history of computing is a story of abstraction. " * 42)
        assert len(deep) >= 420
        m.reset()
        run(m, deep, max_tokens=64, ignore_eos=True)  # a later answer that goes deep drops it
        assert m.decodes_on_twin and m._twin.v_transposed and m._twin.v_type == f16
    with Model(smollm2_path, opts) as m:
        run(m, deep, max_tokens=64, ignore_eos=True)
        assert m.decodes_on_twin and m._twin.v_transposed and m._twin.v_type == f16  # deep on average


@needs_amx_twin
def test_an_answer_that_goes_deep_drops_flash_attention_when_its_twin_grows(smollm2_path, monkeypatch):
    # The first context is sized for twin.ROOM tokens: an answer that fills it twice has gone deep,
    # and carries on without flash attention in the larger one (its cache converted on the way).
    from localinfer.engine import twin as twin_mod
    from localinfer.engine.llama import Model

    monkeypatch.setattr(twin_mod, "ROOM", 64)
    layouts = []
    original = Model._grow_twin
    monkeypatch.setattr(Model, "_grow_twin", lambda self: layouts.append((self._twin.n_ctx, self._twin.v_transposed)) or original(self))
    with Model(smollm2_path, LoadOptions(n_ctx=1024, n_threads=2)) as m:
        prompt = m.tokenize("Once upon a time")
        text, stats = run(m, prompt, max_tokens=600, ignore_eos=True)
        # 256 cells -> 512 (mean depth 384: still shallow) -> 1024 (768: deep)
        assert layouts == [(256, False), (512, False)] and m._twin.n_ctx == 1024 and m._twin.v_transposed
        assert stats.completion_tokens == 600 and len(m.cached_tokens) == len(prompt) + 599 and text
        follow = m.cached_tokens + m.tokenize(" The end.", add_special=False)
        again, s2 = run(m, follow, max_tokens=40)  # back here in this context's layout and type
        assert s2.cached_tokens == len(prompt) + 599 and again


@needs_amx_twin
def test_an_answer_whose_twin_cannot_grow_carries_on_here_with_its_cache(smollm2_path, monkeypatch):
    from localinfer.engine import twin as twin_mod
    from localinfer.engine.backend import llama_cpp
    from localinfer.engine.llama import Model

    def no_memory(self, cparams):  # noqa: ANN001, ANN202 - as a failed llama_init_from_model leaves it
        llama_cpp.llama_free(self.ctx)
        self.ctx = self.mem = None
        self.failed = True
        return False

    monkeypatch.setattr(twin_mod, "ROOM", 64)
    with Model(smollm2_path, LoadOptions(n_ctx=1024, n_threads=2)) as m:
        prompt = m.tokenize("Once upon a time")
        run(m, prompt, max_tokens=40, ignore_eos=True)
        assert m.decodes_on_twin and m._twin.n_ctx == 256
        monkeypatch.setattr(twin_mod.DecodeTwin, "remake", no_memory)
        text, stats = run(m, m.cached_tokens + m.tokenize(" Then", add_special=False), max_tokens=300, ignore_eos=True)
        assert stats.completion_tokens == 300 and text and m._twin is None and not m.decodes_on_twin
        n = len(m.cached_tokens)
        assert n == int(llama_cpp.llama_memory_seq_pos_max(m._mem, 0)) + 1 == stats.context_used
        again, s2 = run(m, m.cached_tokens + m.tokenize(" The end.", add_special=False), max_tokens=4)
        assert s2.cached_tokens == n and again


@needs_amx_twin
def test_an_answer_cut_short_on_the_twin_leaves_a_consistent_cache(model):
    prompt = model.tokenize("Once upon a time")
    model.reset()
    stats = GenerationStats()
    steps = model.generate(prompt, GREEDY, stats, max_tokens=60, ignore_eos=True)
    for i, _ in enumerate(steps):
        if i == 20:
            break
    steps.close()  # as when the reader goes away or Ctrl-C lands
    assert model.decodes_on_twin
    n = len(model.cached_tokens)
    assert n == len(prompt) + stats.completion_tokens - 1 == stats.context_used
    text, s2 = run(model, model.cached_tokens + model.tokenize(" The end.", add_special=False), max_tokens=8)
    assert s2.cached_tokens == n and text


def test_amx_decoding_twin_can_be_turned_off(smollm2_path, monkeypatch):
    from localinfer.engine.llama import Model

    monkeypatch.setenv("LOCALINFER_AMX_DECODE", "0")
    with Model(smollm2_path, LoadOptions(n_ctx=512, n_threads=2)) as m:
        run(m, m.tokenize("Once upon a time"), max_tokens=40, ignore_eos=True)
        assert not m.decodes_on_twin and m._twin is None


@needs_amx_twin
@pytest.mark.parametrize("interactive", [True, False])
def test_chat_starts_loading_the_twin_before_the_first_message(smollm2_path, interactive):
    from localinfer.cli.chat import ChatSession

    session = ChatSession(
        load_opts=LoadOptions(n_ctx=512, n_threads=2), offline=True, force=False, quiet=True,
        verbose=False, no_log=True, interactive=interactive,
    )
    loaded, _ = session._load(str(smollm2_path))
    try:
        twin = loaded.model._twin
        assert twin is not None and twin.weights_loaded.wait(60)  # loading since the model was
        if interactive:  # the user is typing: its context is made at once
            assert twin.ready()
        else:  # messages piped in come at once: the context waits for the first token (engine.twin)
            time.sleep(0.2)
            assert twin.ctx is None and not twin.failed
        run(loaded.model, loaded.model.tokenize("Once upon a time"), max_tokens=40, ignore_eos=True)
        assert loaded.model.decodes_on_twin and loaded.model._twin is twin  # the same copy, loaded once
    finally:
        loaded.close()


@needs_amx_twin
def test_a_twin_still_loading_is_stopped_when_another_model_loads_or_its_model_closes(smollm2_path):
    from localinfer.engine import twin as twin_mod
    from localinfer.engine.llama import Model

    first = Model(smollm2_path, LoadOptions(n_ctx=512, n_threads=2))
    first.prepare_decode_twin()
    loading = first._twin
    assert loading is not None and loading in twin_mod._loading
    second = Model(smollm2_path, LoadOptions(n_ctx=512, n_threads=2))  # settles: stops the first's load
    try:
        assert not twin_mod._loading and not loading.ready()
        assert not any("AMX" in line for line in second.memory_log)  # the twin logged nothing into this load
        text, _ = run(first, first.tokenize("Once upon a time"), max_tokens=40, ignore_eos=True)
        assert text and not first.decodes_on_twin and first._twin is None  # it decodes where it is
        second.prepare_decode_twin()
    finally:
        second.close()  # while its twin may still be loading
        first.close()
    assert second._twin is None and not twin_mod._loading


def test_the_chat_formatter_renders_as_the_whole_package_does_without_importing_numpy_or_llama(smollm2_path):
    # bindings.chat_format() imports llama-cpp-python's llama_chat_format without the package's
    # __init__ and with stand-ins for numpy and the high-level Llama module (~40 ms of CPU, not ~130).
    code = (
        "import json, sys\n"
        "if sys.argv[2] == 'whole':\n"
        "    import llama_cpp\n"
        "from localinfer.engine import bindings\n"
        "from localinfer.engine.llama import Model\n"
        "from localinfer.engine.types import LoadOptions\n"
        "m = Model(sys.argv[1], LoadOptions(n_ctx=256, n_threads=2))\n"
        "fmt = bindings.chat_format()\n"
        "msgs = [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Hi {{ there }}'},\n"
        "        {'role': 'assistant', 'content': 'Hello.'}, {'role': 'user', 'content': 'Again'}]\n"
        "jinja = fmt.Jinja2ChatFormatter(template=m.chat_template, eos_token=m.eos_text, bos_token=m.bos_text)\n"
        "heavy = [n for n in ('numpy', 'multiprocessing', 'diskcache', 'llama_cpp.llama') if n in sys.modules]\n"
        "print(json.dumps([jinja(messages=msgs).prompt, fmt.format_chatml(messages=msgs).prompt,\n"
        "                  fmt.format_gemma(messages=msgs).prompt, heavy]))\n"
    )
    light = json.loads(run_python(code, str(smollm2_path), "light").stdout)
    whole = json.loads(run_python(code, str(smollm2_path), "whole").stdout)
    assert light[:3] == whole[:3] and "<|im_start|>user\nHi {{ there }}<|im_end|>" in light[0]
    assert light[3] == [] and "numpy" in whole[3]


def test_the_whole_package_imported_after_the_formatter_has_all_its_modules():
    # The formatter's modules (and the bindings) were loaded without the package's __init__; a later
    # `import llama_cpp` must still find them as its attributes, and the high-level Llama class.
    code = (
        "from localinfer.engine import bindings\n"
        "fmt = bindings.chat_format()\n"
        "import llama_cpp\n"
        "assert llama_cpp.llama_chat_format is fmt and llama_cpp.llama_cpp is bindings.bindings()\n"
        "assert llama_cpp.llama_types.ChatCompletionRequestMessage and llama_cpp.llama_grammar.LlamaGrammar\n"
        "assert fmt.llama.Llama is llama_cpp.Llama and fmt.np.zeros(2).shape == (2,)\n"
        "print('ok')\n"
    )
    assert run_python(code).stdout == "ok\n"


def test_another_thread_importing_the_package_meanwhile_gets_the_real_one():
    # While the formatter imports, the unexecuted package object is in sys.modules: another thread
    # that imports llama_cpp then waits for the import to end and gets the real package.
    code = (
        "import sys, threading, time\n"
        "from localinfer.engine import bindings\n"
        "bindings.bindings()\n"
        "seen = []\n"
        "def other():\n"
        "    while 'llama_cpp' not in sys.modules:\n"
        "        time.sleep(0)\n"
        "    import llama_cpp\n"
        "    seen.append(hasattr(llama_cpp, '__version__'))  # False: the unexecuted one\n"
        "    seen.append(llama_cpp.Llama.__name__)\n"
        "    import numpy\n"
        "    seen.append(numpy.zeros(2).shape)\n"
        "thread = threading.Thread(target=other)\n"
        "thread.start()\n"
        "time.sleep(0.01)\n"
        "bindings.chat_format()\n"
        "thread.join()\n"
        "print(seen)\n"
    )
    assert run_python(code).stdout == "[False, 'Llama', (2,)]\n"


def test_llama_cpp_pythons_own_log_callback_prints_nothing_while_the_formatter_is_imported():
    # Importing the chat formatter runs llama-cpp-python's __init__, whose own log callback gets
    # llama.cpp's log where the engine installed none (chat_format() keeps ours otherwise). Whatever
    # a load on another thread logs through it must not reach the user's terminal.
    code = (
        "from localinfer.engine import bindings\n"
        "bindings.chat_format()\n"
        "import llama_cpp._logger as theirs\n"
        "theirs.llama_log_callback(4, b'a debug line from another thread\\n', None)\n"
        "theirs.llama_log_callback(2, b'a warning\\n', None)\n"
    )
    proc = run_python(code)
    assert proc.stdout == "" and proc.stderr == ""


# A subprocess's prelude: every callback handed to llama.cpp's llama_log_set lands in `installed`.
_LOG_SET_SPY = (
    "import sys, time\n"
    "from localinfer.engine import backend, bindings\n"
    "c_api = bindings.bindings()\n"
    "real, installed = c_api.llama_log_set, []\n"
    "def spy(callback, user_data):\n"
    "    installed.append(callback)\n"
    "    return real(callback, user_data)\n"
    "c_api.llama_log_set = spy\n"
)


def test_our_log_callback_stays_in_place_while_the_formatter_is_imported():
    # The package's _logger calls llama_log_set with its own callback as it is imported; chat_format()
    # hands it a stub meanwhile, so lines a load on another thread logs then still reach ours.
    code = _LOG_SET_SPY + (
        "log = backend.ensure_backend(False)\n"
        "bindings.chat_format()\n"
        "import llama_cpp\n"
        "assert installed and all(cb is log._callback for cb in installed), installed\n"
        "assert c_api.llama_log_set is spy and llama_cpp.llama_log_set is spy\n"
        "print('ok')\n"
    )
    assert run_python(code).stdout == "ok\n"


def test_our_log_callback_installed_while_the_formatter_imports_is_the_one_kept():
    # chat_format_ahead starts before the engine installs its callback (a chat, which loads nothing
    # ahead): the package's _logger must not replace ours once it is in, and a process without ours
    # (a library use) gets the package's own.
    code = _LOG_SET_SPY + (
        "bindings.chat_format_ahead()\n"
        "while 'llama_cpp' not in sys.modules:  # the formatter is importing; its _logger comes later\n"
        "    time.sleep(0.0005)\n"
        "log = backend.ensure_backend(False)  # as Model() does meanwhile\n"
        "bindings.settle()\n"
        "assert installed and all(cb is log._callback for cb in installed), installed\n"
        "print('ok')\n"
    )
    assert run_python(code).stdout == "ok\n"
    library = _LOG_SET_SPY + (
        "bindings.chat_format()\n"
        "import llama_cpp._logger as theirs\n"
        "assert installed == [theirs.llama_log_callback], installed\n"
        "print('ok')\n"
    )
    assert run_python(library).stdout == "ok\n"


def test_a_model_alive_as_the_process_ends_is_left_to_the_os(smollm2_path):
    # Freeing llama.cpp's buffers, vocabulary and mappings one by one costs ~25 ms at the end of a run:
    # a model still referenced when the interpreter finalizes is not closed; one dropped before is.
    code = (
        "import os, sys\n"
        "from localinfer.engine.backend import llama_cpp\n"
        "from localinfer.engine.llama import Model\n"
        "from localinfer.engine.types import LoadOptions\n"
        "real = llama_cpp.llama_model_free\n"
        "def spy(model):\n"
        "    os.write(1, b'freed\\n')\n"
        "    return real(model)\n"
        "llama_cpp.llama_model_free = spy\n"
        "dropped = Model(sys.argv[1], LoadOptions(n_ctx=256, n_threads=2))\n"
        "del dropped\n"
        "os.write(1, b'dropped\\n')\n"
        "kept = Model(sys.argv[1], LoadOptions(n_ctx=256, n_threads=2))\n"
    )
    assert run_python(code, str(smollm2_path)).stdout == "freed\ndropped\n"


def test_a_module_still_being_imported_does_not_count_as_imported(tmp_path, monkeypatch):
    # A module another thread is importing (the chat formatter's numpy, bindings.chat_format_ahead)
    # is in sys.modules from the start: engine.kvstate must not take it for numpy ready to use.
    from localinfer.engine.bindings import imported

    (tmp_path / "halfmade.py").write_text(
        "from localinfer.engine.bindings import imported\nWHILE_IMPORTING = imported(__name__)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "halfmade", raising=False)
    import halfmade

    assert halfmade.WHILE_IMPORTING is None and sys.modules["halfmade"] is halfmade
    assert imported("halfmade") is halfmade and imported("no_such_module_here") is None


def test_a_load_for_chat_imports_the_formatter_once_the_weights_loaded_ahead_are_in(smollm2_path):
    # inference.load(chat=True) imports the chat formatter on a thread (jinja2 and the module: ~40 ms) while
    # the context is created, after the weights loading ahead: beside that load it would slow it.
    # The load's own log lines (its memory figures) are all captured; nothing reaches stderr.
    code = (
        "import sys, threading\n"
        "from localinfer import inference\n"
        "from localinfer.engine import backend, bindings\n"
        "from localinfer.engine import llama as engine\n"
        "from localinfer.engine.types import LoadOptions\n"
        "from localinfer.store import resolve_model\n"
        "resolved = resolve_model(sys.argv[1])\n"
        "options = LoadOptions(n_ctx=512, n_threads=2)\n"
        "assert engine.preload_model(resolved.path, options)\n"
        "ahead = engine.weights_loading()\n"
        "started = []\n"
        "def spy(real=bindings.chat_format):\n"
        "    started.append((threading.current_thread().name, ahead.is_alive()))\n"
        "    return real()\n"
        "bindings.chat_format = spy\n"
        "assert 'llama_cpp.llama_chat_format' not in sys.modules\n"
        "loaded = inference.load(resolved, options, chat=True)\n"
        "assert engine.weights_loading() is None\n"
        "for t in threading.enumerate():\n"
        "    if t.name == 'localinfer-chat-format':\n"
        "        t.join()\n"
        "assert started == [('localinfer-chat-format', False)], started\n"
        "assert 'llama_cpp.llama_chat_format' in sys.modules\n"
        "assert any('KV buffer size' in line for line in loaded.model.memory_log), loaded.model.memory_log\n"
        "seq = backend._log.seq\n"
        "again = inference.load(resolved, options)\n"
        "assert backend._log.seq > seq  # our callback still has llama.cpp's log\n"
        "print(loaded.template.render([{'role': 'user', 'content': 'Hi'}]).text.count('Hi'))\n"
    )
    proc = run_python(code, str(smollm2_path))
    assert proc.stdout == "1\n" and proc.stderr == ""


@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_the_twin_loaded_without_the_tokenizer_computes_the_same_logits(which, smollm2_path, gemma_path):
    # engine.twin loads its copy with the tokenizer replaced by placeholder tokens (much faster): it
    # never tokenizes, and its logits must be those of the copy loaded whole, to the bit.
    import ctypes

    from localinfer.engine import twin as twin_mod
    from localinfer.engine.backend import llama_cpp
    from localinfer.engine.llama import Model

    path = smollm2_path if which == "smollm2" else gemma_path
    with Model(path, LoadOptions(n_ctx=256, n_threads=2)) as m:
        arch, n_vocab = m.vocab_shape
        assert arch == ("llama" if which == "smollm2" else "gemma3") and n_vocab == m.n_vocab
        logits = []
        for vocab in (None, m.vocab_shape):
            twin = twin_mod.DecodeTwin(m.path, *m._params, vocab=vocab)
            try:
                assert twin.ready() and (twin._overrides is not None) == (vocab is not None)
                vocab_of = llama_cpp.llama_model_get_vocab(twin.model)
                assert llama_cpp.llama_vocab_n_tokens(vocab_of) == n_vocab
                one = (llama_cpp.llama_token * 1)()
                for token in m.tokenize("The capital of France is"):  # one at a time: a decode, as the twin does
                    one[0] = token
                    assert llama_cpp.llama_decode(twin.ctx, llama_cpp.llama_batch_get_one(one, 1)) == 0
                row = llama_cpp.llama_get_logits_ith(twin.ctx, -1)
                logits.append(bytes(ctypes.cast(row, ctypes.POINTER(ctypes.c_char * (4 * n_vocab))).contents))
            finally:
                twin.close()
        assert logits[0] == logits[1]


@needs_amx_twin
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")
def test_the_twin_loads_with_no_openmp_team_of_its_own(smollm2_path):
    # The twin's weight conversion for AMX runs an OpenMP team. Its worker would live as long as the
    # twin's thread, which waits through the prompt's evaluation for the context's settings; with
    # more threads than CPUs, libgomp makes the main team's barriers sleep (prefill 30 -> 50 ms).
    # So while the twin waits, the process has exactly one more thread: the twin's own.
    code = (
        "import os, sys, time\n"
        "from localinfer.engine import twin as twin_mod\n"
        "from localinfer.engine.llama import Model\n"
        "from localinfer.engine.types import LoadOptions\n"
        "m = Model(sys.argv[1], LoadOptions(n_ctx=256, n_threads=2))\n"
        "before = len(os.listdir('/proc/self/task'))\n"
        "t = twin_mod.DecodeTwin(m.path, m._params[0], vocab=m.vocab_shape)\n"
        "assert t.weights_loaded.wait(60) and not t.failed\n"
        "time.sleep(0.1)\n"
        "during = len(os.listdir('/proc/self/task'))\n"
        "assert t.ctx is None  # no settings given: it waits for them\n"
        "t.start_context(m._params[1])\n"
        "assert t.ready() and t.ctx is not None\n"
        "t.close()\n"
        "print(before, during)\n"
    )
    before, during = map(int, run_python(code, str(smollm2_path)).stdout.split())
    assert during == before + 1


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")
def test_the_cli_starts_no_blas_threads_when_the_formatter_imports_numpy():
    # numpy (imported for a large KV cache's conversion, engine.kvstate, or by llama-cpp-python's
    # __init__) has an OpenBLAS that starts a thread per core that spins for work it will never get
    # (we multiply no matrices with numpy), on the core the prompt's evaluation and the AMX twin's
    # load need. The CLI's entry point keeps it to one thread, before any thread of
    # its own runs; a user's own OPENBLAS_NUM_THREADS is left alone.
    code = (
        "import os, sys, time\n"
        "from localinfer.cli.main import main\n"
        "sys.argv = ['localinfer', '--version']\n"
        "main()\n"
        "from localinfer.engine import bindings\n"
        "bindings.chat_format()\n"
        "import numpy\n"
        "time.sleep(0.05)\n"
        "print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    proc = run_python(code, env=env)
    assert proc.stdout.splitlines()[-1].split() == ["1", "1"]  # no thread but the main one
    proc = run_python(code, env={**env, "OPENBLAS_NUM_THREADS": "2"})
    assert proc.stdout.splitlines()[-1].split()[1] == "2"
