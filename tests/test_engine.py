"""The engine on the real SmolLM2 model: tokens, KV-cache reuse, exact counts, the template sandbox."""

from __future__ import annotations


import pytest
from conftest import run_python

from localinfer.engine.types import GenerationStats, LoadOptions
from localinfer.request.sampling import SamplingOptions

pytestmark = pytest.mark.slow

GREEDY = SamplingOptions(temperature=0.0)


@pytest.fixture(scope="module")
def model(smollm2_path):
    from localinfer.engine.model import LlamaModel

    m = LlamaModel(smollm2_path, LoadOptions(n_ctx=1024, n_threads=2))
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
    # The rates are what the counts over the measured times say (no floor: a busy machine is slow).
    assert stats.prefill_s > 0 and stats.prefill_tps == pytest.approx(len(prompt) / stats.prefill_s)
    assert stats.decode_s > 0 and stats.decode_tps == pytest.approx(31 / stats.decode_s)
    assert 0 < stats.decode_calls_s <= stats.decode_s
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
    from localinfer.engine import model as engine

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


def test_compiled_template_is_kept_and_a_damaged_copy_is_compiled_again(isolated_home, monkeypatch):
    import jinja2

    from localinfer.engine import templates

    tpl = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"
    msgs = [{"role": "user", "content": "hi"}]
    templates._compile.cache_clear()
    first = templates.ChatTemplate(source="gguf", template=tpl).render(msgs).text
    kept = list((isolated_home / "cache" / "templates").iterdir())
    assert first == "<user>hi<a>" and len(kept) == 1
    # A new process (the per-process cache cleared) takes the kept code: jinja2 compiles nothing.
    templates._compile.cache_clear()
    with monkeypatch.context() as m:
        m.setattr(jinja2.Environment, "compile", lambda *a, **k: pytest.fail("compiled again"))
        assert templates.ChatTemplate(source="gguf", template=tpl).render(msgs).text == first
    # A damaged copy is compiled again (and replaced), never an error; the sandbox still holds.
    kept[0].write_bytes(b"j2 not a cache file")
    templates._compile.cache_clear()
    assert templates.ChatTemplate(source="gguf", template=tpl).render(msgs).text == first
    assert kept[0].read_bytes().startswith(jinja2.bccache.bc_magic)
    evil = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    for _ in range(2):  # compiled, then from the kept code
        templates._compile.cache_clear()
        with pytest.raises(templates.TemplateRefusedError, match="refused by the sandbox"):
            templates.ChatTemplate(source="gguf", template=evil).render(msgs)


def test_registry_chat_format_renders_without_a_gguf_template():
    from localinfer.engine.templates import ChatTemplate

    prompt = ChatTemplate(source="registry:chatml", format_name="chatml").render(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    )
    assert "<|im_start|>user\nU<|im_end|>" in prompt.text and prompt.text.rstrip().endswith(
        "<|im_start|>assistant"
    )
    assert "<|im_end|>" in prompt.stop


def test_registry_chat_format_loses_no_turn():
    # llama-cpp-python's formats read string contents of three roles and at most the first system
    # turn (gemma's none): a named format still gets every text, in the order it was sent
    from localinfer.engine.templates import ChatTemplate

    msgs = [{"role": "system", "content": "Be brief."}, {"role": "developer", "content": "Use tools."},
            {"role": "user", "content": [{"type": "text", "text": "Read "}, {"type": "text", "text": "a.py"}]},
            {"role": "assistant", "content": "Done."}, {"role": "tool", "content": "print(1)"},
            {"role": "system", "content": "Skills: none."}, {"role": "user", "content": "Next?"}]  # fmt: skip
    gemma = ChatTemplate(source="registry:gemma", format_name="gemma").render(msgs).text
    assert gemma.startswith("<start_of_turn>user\nBe brief.\n\nUse tools.\n\nRead a.py<end_of_turn>\n"), gemma
    assert gemma.index("Done.") < gemma.index("print(1)") < gemma.index("Skills: none.") < gemma.index("Next?")
    chatml = ChatTemplate(source="registry:chatml", format_name="chatml").render(msgs).text
    assert chatml.startswith("<|im_start|>system\nBe brief.\n\nUse tools.<|im_end|>\n<|im_start|>user\nRead a.py<|im_end|>")
    assert chatml.count("<|im_start|>system") == 1 and chatml.index("print(1)") < chatml.index("Skills: none.")
    # what was sent before the later system turn renders as it did without it (a cached prefix)
    before = ChatTemplate(source="registry:chatml", format_name="chatml").render(msgs[:5]).text
    assert chatml.startswith(before[: before.index("print(1)") + len("print(1)")])
    for name in ("llama-2", "llama-3", "vicuna", "baichuan-2"):  # registered under names unlike their functions
        assert "Read a.py" in ChatTemplate(source=f"registry:{name}", format_name=name).render(msgs).text


def test_a_chat_format_that_drops_a_turn_is_refused():
    from localinfer.engine.templates import ChatTemplate
    from localinfer.errors import UsageError

    with pytest.raises(UsageError, match="'open-orca' leaves a turn out") as err:
        ChatTemplate(source="registry:open-orca", format_name="open-orca").render([{"role": "user", "content": "Name a colour."}])
    assert "chat_format" in err.value.hint


def test_a_template_that_rejects_the_messages_is_a_usage_error():
    from localinfer.engine.templates import ChatTemplate
    from localinfer.errors import UsageError

    strict = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}ok"
    with pytest.raises(UsageError, match="first message must be from the user"):
        ChatTemplate(source="gguf", template=strict).render([{"role": "system", "content": "S"}])


def test_a_template_is_compiled_once_for_every_turn(monkeypatch):
    # Compiling a template takes ~2-3 ms: chat renders the conversation at every turn.
    from localinfer.engine import templates

    templates._compile.cache_clear()
    chat = templates.ChatTemplate(source="gguf", template="{% for m in messages %}<{{ m['content'] }}>{% endfor %}")
    first = chat.render([{"role": "user", "content": "a"}])
    second = chat.render([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
    assert (first.text, second.text) == ("<a>", "<a><b>")
    assert templates._compile.cache_info().misses == 1


def test_the_gguf_template_renders_as_llama_cpp_pythons_formatter_does(smollm2_path):
    # Our sandbox must give the exact prompt llama-cpp-python's Jinja2ChatFormatter gives (the
    # same environment settings, globals and filters), on the real model's template.
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    from localinfer.engine.model import LlamaModel
    from localinfer.engine.templates import ChatTemplate

    with LlamaModel(smollm2_path, LoadOptions(n_ctx=256, n_threads=2)) as m:
        template, bos, eos = m.chat_template, m.bos_text, m.eos_text
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi \u00e9 {{ not a template }}"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Again"},
    ]
    ours = ChatTemplate(source="gguf", template=template, bos_text=bos, eos_text=eos).render(messages)
    theirs = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos)(messages=messages)
    assert ours.text == theirs.prompt and ours.text.endswith("<|im_start|>assistant\n")
    assert list(ours.stop) == theirs.stop and ours.add_special == (not theirs.added_special)


@pytest.mark.parametrize(
    "template, why",
    [
        ("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}", "range"),
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "range"),
        ("{{ 'x' * 2000000000 }}", "longer than"),
        ("{{ ['x'] * 2000000000 }}", "longer than"),
        ("{{ 10 ** 100000000 }}", "exponent"),
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recurses"),
        ("{% set s = 'x' * 1000000 %}{% for i in range(1000) %}{{ s }}{% endfor %}", "output"),
    ],
)
def test_a_template_without_bounds_is_stopped_quickly_with_one_line(template, why):
    from localinfer.engine.templates import ChatTemplate, TemplateRefusedError
    from localinfer.errors import ExitCode, exit_code_for

    # The message names the bound that stopped it: without that bound the render would run for hours.
    with pytest.raises(TemplateRefusedError, match=why) as caught:
        ChatTemplate(source="gguf", template=template).render([{"role": "user", "content": "hi"}])
    assert exit_code_for(caught.value) == ExitCode.BAD_MODEL and "\n" not in str(caught.value)


def test_a_template_that_runs_too_long_is_stopped(monkeypatch):
    from localinfer.engine import templates

    monkeypatch.setattr(templates, "MAX_RENDER_S", 0.05)
    slow = "{% for m in messages %}{% for i in range(1000) %}{{ i }}{% endfor %}{% endfor %}"
    with pytest.raises(templates.TemplateRefusedError, match="took over"):
        templates.ChatTemplate(source="gguf", template=slow).render([{"role": "user", "content": "x"}] * 100000)


@pytest.mark.llama
def test_the_engine_imports_only_the_bindings_not_numpy():
    # The engine needs llama.cpp's C API only: the package's __init__ (numpy, the Llama class) would
    # cost most of the import on the way to the first token.
    code = (
        "import sys\n"
        "from localinfer.engine.model import LlamaModel\n"
        "print('numpy' in sys.modules, 'llama_cpp.llama' in sys.modules)\n"
        "import llama_cpp\n"
        "print(llama_cpp.Llama is not None, llama_cpp.llama_cpp.llama_backend_init is not None)\n"
    )
    assert run_python(code).stdout.split() == ["False", "False", "True", "True"]


def test_a_model_alive_as_the_process_ends_is_left_to_the_os(smollm2_path):
    # Freeing llama.cpp's buffers, vocabulary and mappings one by one costs ~25 ms at the end of a run:
    # a model still referenced when the interpreter finalizes is not closed; one dropped before is.
    code = (
        "import os, sys\n"
        "from localinfer.engine.backend import llama_cpp\n"
        "from localinfer.engine.model import LlamaModel\n"
        "from localinfer.engine.types import LoadOptions\n"
        "real = llama_cpp.llama_model_free\n"
        "def spy(model):\n"
        "    os.write(1, b'freed\\n')\n"
        "    return real(model)\n"
        "llama_cpp.llama_model_free = spy\n"
        "dropped = LlamaModel(sys.argv[1], LoadOptions(n_ctx=256, n_threads=2))\n"
        "del dropped\n"
        "os.write(1, b'dropped\\n')\n"
        "kept = LlamaModel(sys.argv[1], LoadOptions(n_ctx=256, n_threads=2))\n"
    )
    assert run_python(code, str(smollm2_path)).stdout == "freed\ndropped\n"


def test_our_log_callback_is_taken_back_after_the_whole_package_is_imported(smollm2_path):
    # Importing llama-cpp-python whole (its named chat formats do) installs its own log callback,
    # which prints every line to stderr; the next load must still report its buffers to us.
    code = (
        "import sys\n"
        "from localinfer.engine.model import LlamaModel\n"
        "from localinfer.engine.types import LoadOptions\n"
        "LlamaModel(sys.argv[1], LoadOptions(n_ctx=256, n_threads=1)).close()\n"
        "import llama_cpp.llama_chat_format\n"
        "m = LlamaModel(sys.argv[1], LoadOptions(n_ctx=256, n_threads=1))\n"
        "print(any('KV buffer size' in line for line in m.memory_log))\n"
    )
    proc = run_python(code, str(smollm2_path))
    assert proc.stdout.strip() == "True" and "buffer size" not in proc.stderr
