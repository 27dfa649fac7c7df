"""The estimator against what llama.cpp itself reports for the real models, and the llama.cpp options
users expect (--cache-type-k/v, --no-mmap, --mlock, --batch-size, --flash-attn) visibly taking effect."""

from __future__ import annotations

import re
import sys

import pytest

from localinfer.engine.model import LlamaModel
from localinfer.engine.types import LoadOptions
from localinfer.system.estimate import BufferReport, ModelShape, estimate, parse_buffer_report
from localinfer.gguf import read_gguf

pytestmark = pytest.mark.slow

# (n_ctx, cache type for K and V, flash attention, batch size)
CONFIGS = [
    (512, "f16", "auto", 2048),
    (2048, "q8_0", "auto", 2048),
    (8192, "f16", "off", 2048),
    (1000, "q4_0", "on", 256),
]


def _load(path, **kw) -> tuple[BufferReport, LlamaModel]:
    model = LlamaModel(path, LoadOptions(n_threads=2, **kw))
    return parse_buffer_report(model.memory_log), model


@pytest.fixture(scope="module")
def reports(smollm2_path, gemma_path):
    """llama.cpp's reported buffers for each model and configuration (each loaded once)."""
    out = {}
    for key, path in (("smollm2", smollm2_path), ("gemma", gemma_path)):
        for n_ctx, ct, fa, nb in CONFIGS:
            report, model = _load(path, n_ctx=n_ctx, cache_type_k=ct, cache_type_v=ct, flash_attn=fa, n_batch=nb)
            out[(key, n_ctx, ct, fa, nb)] = (report, model.n_ctx)
            model.close()
    return out


def _within(estimated: int, reported: int, tolerance: float = 0.10) -> bool:
    return abs(estimated - reported) <= tolerance * reported


@pytest.mark.parametrize("key", ["smollm2", "gemma"])
@pytest.mark.parametrize("n_ctx, ct, fa, nb", CONFIGS)
def test_estimate_is_within_ten_percent_of_llama_cpp(reports, smollm2_path, gemma_path, key, n_ctx, ct, fa, nb):
    report, real_n_ctx = reports[(key, n_ctx, ct, fa, nb)]
    shape = ModelShape.from_gguf(read_gguf(smollm2_path if key == "smollm2" else gemma_path))
    e = estimate(shape, n_ctx=n_ctx, cache_type_k=ct, cache_type_v=ct, flash_attn=fa, n_batch=nb)
    assert e.n_ctx == real_n_ctx  # the same padding
    got = {k: report.total(k) for k in ("model", "KV", "compute")}
    assert all(got.values()), report  # llama.cpp reported every kind of buffer
    assert _within(e.weights, got["model"]), (e.weights, got)
    assert _within(e.kv, got["KV"]), (e.kv, got)
    assert _within(e.compute, got["compute"]), (e.compute, got)
    assert _within(e.total, report.total()), (e.total, report.total())


def test_quantized_kv_cache_halves_the_kv_buffer(reports, smollm2_path):
    f16, _ = _load(smollm2_path, n_ctx=2048, flash_attn="on")
    q8, _ = reports[("smollm2", 2048, "q8_0", "auto", 2048)]
    ratio = q8.total("KV") / f16.total("KV")
    assert 0.5 <= ratio <= 0.56, ratio  # q8_0 stores 32 values in 34 bytes, f16 in 64


def test_no_mmap_reads_the_weights_into_memory(smollm2_path):
    mapped, m1 = _load(smollm2_path, n_ctx=256)
    m1.close()
    read, m2 = _load(smollm2_path, n_ctx=256, use_mmap=False)
    m2.close()
    assert "CPU_Mapped" in mapped.model_devices
    assert "CPU_Mapped" not in read.model_devices and "CPU" in read.model_devices
    assert read.total("model") == mapped.total("model")


def test_batch_size_bounds_the_compute_buffer(smollm2_path):
    big, m1 = _load(smollm2_path, n_ctx=1024, n_batch=2048)
    m1.close()
    small, m2 = _load(smollm2_path, n_ctx=1024, n_batch=64)
    m2.close()
    # the compute buffer holds one ubatch's logits: 512 tokens vs 64
    assert small.total("compute") * 6 < big.total("compute")


def test_flash_attention_off_grows_the_compute_buffer_with_context(smollm2_path):
    on, m1 = _load(smollm2_path, n_ctx=16384, flash_attn="on")
    m1.close()
    off, m2 = _load(smollm2_path, n_ctx=16384, flash_attn="off")
    m2.close()
    assert off.total("compute") > 2 * on.total("compute")  # the f32 KQ matrix of 16384 x 512 x 9 heads


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_mlock_locks_the_weights(smollm2_path):
    def locked() -> int:
        return int(re.search(r"VmLck:\s+(\d+)", open("/proc/self/status").read()).group(1)) * 1024

    before = locked()
    from localinfer.engine import backend as engine

    log = engine.ensure_backend(False)
    start = log.seq
    model = LlamaModel(smollm2_path, LoadOptions(n_ctx=256, use_mlock=True))
    try:
        warned = any("mlock" in text for _, text in log.since(start))
        # either the pages are locked, or llama.cpp said why it could not (RLIMIT_MEMLOCK)
        assert locked() - before >= 90 * 2**20 or warned
    finally:
        model.close()


def test_the_engine_names_an_option_llama_cpp_refuses(smollm2_path):
    from localinfer.errors import UsageError

    # the pre-flight catches this first; the engine's own diagnosis is the backstop for direct users
    with pytest.raises(UsageError, match="quantized V cache requires flash_attn"):
        LlamaModel(smollm2_path, LoadOptions(n_ctx=256, cache_type_v="q8_0", flash_attn="off"))


@pytest.mark.parametrize("key", ["smollm2", "gemma"])
def test_estimate_of_a_context_for_four_sequences(smollm2_path, gemma_path, key):
    # serve -np 4: a KV stream per sequence, each padded on its own
    path = smollm2_path if key == "smollm2" else gemma_path
    report, model = _load(path, n_ctx=4 * 1000, n_seq_max=4)
    real_n_ctx, n_ctx_seq = model.n_ctx, model.n_ctx_seq
    model.close()
    e = estimate(ModelShape.from_gguf(read_gguf(path)), n_ctx=4 * 1000, n_seq_max=4)
    assert e.n_ctx == real_n_ctx and n_ctx_seq == real_n_ctx // 4
    assert _within(e.kv, report.total("KV")), (e.kv, report.total("KV"))
    assert _within(e.compute, report.total("compute")), (e.compute, report.total("compute"))
    assert _within(e.total, report.total()), (e.total, report.total())
