"""The memory estimator and the pre-flight, from GGUF headers alone (no model is loaded here).

The check against llama.cpp's own reported buffer sizes is in test_estimate_models.py.
"""

from __future__ import annotations

import re

import pytest

from localinfer.engine.types import LoadOptions
from localinfer.errors import ResourceError, UsageError
from localinfer.system.estimate import (
    GPU_LAYERS_AUTO,
    ModelShape,
    ShapeError,
    estimate,
    fit_gpu_layers,
    parse_buffer_report,
)
from localinfer.gguf import read_gguf
from localinfer.system.hardware import MemoryBudget
from localinfer.system.preflight import largest_ctx, plan_load, ram_margin

MB = 1000**2
GB = 1000**3
BIG = MemoryBudget(ram_available=64 * GB, ram_total=64 * GB)


@pytest.fixture(scope="module")
def smol(smollm2_path):
    return read_gguf(smollm2_path)


@pytest.fixture(scope="module")
def gemma(gemma_path):
    return read_gguf(gemma_path)


def test_shape_of_smollm2(smol):
    s = ModelShape.from_gguf(smol)
    assert (s.arch, s.n_layer, s.n_embd, s.n_head, s.n_vocab, s.n_ctx_train) == ("llama", 30, 576, 9, 49152, 8192)
    assert s.n_head_kv == (3,) * 30 and s.head_dim_k == s.head_dim_v == 64
    assert s.n_swa == 0 and not any(s.swa_layers)
    assert s.weight_bytes == sum(t.n_bytes for t in smol.tensors)
    assert s.output_tied and s.n_offloadable == 31


def test_shape_of_gemma3_knows_its_sliding_window_layers(gemma):
    s = ModelShape.from_gguf(gemma)
    assert (s.arch, s.n_layer, s.n_swa, s.head_dim_k, s.n_vocab) == ("gemma3", 18, 512, 256, 262144)
    # gemma3: every 6th layer attends globally, the other five use the window
    assert [i for i, swa in enumerate(s.swa_layers) if not swa] == [5, 11, 17]


def test_kv_cache_is_the_textbook_formula(smol):
    s = ModelShape.from_gguf(smol)
    e = estimate(s, n_ctx=4096)
    assert e.kv == 2 * 4096 * 30 * 3 * 64 * 2  # K and V, cells, layers, kv heads, head dim, f16 bytes
    q8 = estimate(s, n_ctx=4096, cache_type_k="q8_0", cache_type_v="q8_0")
    assert q8.kv == e.kv * 34 // 64  # q8_0: 34 bytes per 32 values
    q4 = estimate(s, n_ctx=4096, cache_type_k="q4_0", cache_type_v="q4_0")
    assert q4.kv == e.kv * 18 // 64


def test_context_is_padded_like_llama_cpp(smol):
    s = ModelShape.from_gguf(smol)
    assert estimate(s, n_ctx=1000).n_ctx == 1024
    assert estimate(s, n_ctx=100).n_ctx == 256
    assert estimate(s, n_ctx=4000, n_seq_max=3, n_batch=2048).n_ctx == 3 * 1536  # 1333 per sequence -> 1536


def test_sliding_window_layers_take_the_window_unless_swa_full(gemma):
    s = ModelShape.from_gguf(gemma)
    full = estimate(s, n_ctx=8192, swa_full=True)
    small = estimate(s, n_ctx=8192, swa_full=False)
    per_cell_layer = 2 * 1 * 256 * 2  # K+V, one kv head of 256, f16
    assert full.kv == 18 * 8192 * per_cell_layer
    # window 512 + ubatch 512 = 1024 cells for the 15 SWA layers; the 3 global layers keep 8192
    assert small.kv == (3 * 8192 + 15 * 1024) * per_cell_layer
    assert estimate(s, n_ctx=8192, n_batch=64, swa_full=False).kv == (3 * 8192 + 15 * 768) * per_cell_layer


def test_compute_buffer_follows_ubatch_and_flash_attention(smol):
    s = ModelShape.from_gguf(smol)
    base = estimate(s, n_ctx=4096)
    assert estimate(s, n_ctx=4096, n_batch=64).compute < base.compute / 6  # the logits of 64 tokens, not 512
    # without flash attention the KQ matrix grows with the context
    assert estimate(s, n_ctx=32768, flash_attn="off").compute > 5 * estimate(s, n_ctx=32768, flash_attn="on").compute


def test_gpu_layers_move_weights_and_cache_to_the_gpu(smol):
    s = ModelShape.from_gguf(smol)
    cpu = estimate(s, n_ctx=4096, n_gpu_layers=0)
    half = estimate(s, n_ctx=4096, n_gpu_layers=15)
    full = estimate(s, n_ctx=4096, n_gpu_layers=-1)
    assert cpu.gpu_bytes == 0 and half.n_gpu_layers == 15 and full.n_gpu_layers == 31
    assert half.weights_gpu == sum(s.layer_bytes[15:]) and half.kv_gpu == cpu.kv // 2
    # tied embeddings: offloading the output layer puts a copy of token_embd on the GPU
    assert full.weights_gpu == sum(s.layer_bytes) + s.output_bytes + s.input_bytes
    assert full.kv_cpu == 0 and full.compute_gpu > full.compute_cpu
    assert estimate(s, n_ctx=4096, n_gpu_layers=99).n_gpu_layers == 31


def test_auto_gpu_layers_fit_the_simulated_vram(smol):
    s = ModelShape.from_gguf(smol)
    kw = {"n_ctx": 4096}
    assert fit_gpu_layers(s, 0, **kw) == 0
    assert fit_gpu_layers(s, 512 * MB, **kw) == 0  # less than the headroom
    assert fit_gpu_layers(s, 80 * GB, **kw) == 31
    previous = 0
    for vram_mb in range(1100, 1400, 10):
        k = fit_gpu_layers(s, vram_mb * MB, headroom=1024 * MB, **kw)
        budget = vram_mb * MB - 1024 * MB
        assert estimate(s, n_gpu_layers=k, **kw).gpu_bytes <= budget
        if k < 31:
            assert estimate(s, n_gpu_layers=k + 1, **kw).gpu_bytes > budget
        assert k >= previous  # more VRAM never means fewer layers
        previous = k
    assert 0 < fit_gpu_layers(s, 1200 * MB, headroom=1024 * MB, **kw) < 31  # a partial offload happens


def test_plan_auto_layers_on_a_gpu_build_use_free_vram(smol):
    opts = LoadOptions(n_gpu_layers=GPU_LAYERS_AUTO)
    gpu = MemoryBudget(ram_available=64 * GB, ram_total=64 * GB, gpu_offload=True, vram_free=24 * GB)
    plan = plan_load(smol, opts, budget=gpu)
    assert plan.n_gpu_layers == 31 and plan.n_ctx == 4096 and plan.estimate.gpu_bytes > 0
    small = MemoryBudget(ram_available=64 * GB, ram_total=64 * GB, gpu_offload=True, vram_free=1200 * MB)
    part = plan_load(smol, opts, budget=small, headroom=1024 * MB)
    assert 0 < part.n_gpu_layers < 31 and part.estimate.gpu_bytes <= 176 * MB
    assert plan_load(smol, opts, budget=MemoryBudget(64 * GB, 64 * GB, gpu_offload=True, vram_free=None)).n_gpu_layers == 0


def test_plan_on_a_cpu_only_build_offloads_nothing(smol):
    auto = plan_load(smol, LoadOptions(n_gpu_layers=0), budget=BIG)
    assert auto.n_gpu_layers == 0 and auto.notes == ()  # silently
    explicit = plan_load(smol, LoadOptions(n_gpu_layers=-1), budget=BIG)
    assert explicit.n_gpu_layers == 0 and "cannot offload" in explicit.notes[0]


def test_plan_default_context_is_trained_capped_then_fitted(smol, gemma):
    assert plan_load(smol, LoadOptions(), budget=BIG).n_ctx == 4096  # trained 8192, ceiling 4096
    assert plan_load(smol, LoadOptions(), budget=BIG, ceiling=100_000).n_ctx == 8192
    assert plan_load(gemma, LoadOptions(), budget=BIG).ctx_source == "default"
    tight = MemoryBudget(ram_available=250 * MB, ram_total=250 * MB)
    plan = plan_load(smol, LoadOptions(), budget=tight)
    assert plan.ctx_source == "default, reduced to fit memory" and 512 <= plan.n_ctx < 4096
    usable = 250 * MB - ram_margin(tight)  # the pre-flight keeps a tenth free (at most 1 GiB)
    assert ram_margin(tight) == 25 * MB and plan.estimate.cpu_bytes <= usable
    assert estimate(ModelShape.from_gguf(smol), n_ctx=plan.n_ctx + 256).cpu_bytes > usable


def test_plan_refuses_what_does_not_fit_with_figures_and_advice(smol):
    with pytest.raises(UsageError, match="beyond the 8192 tokens smollm2:135m was trained on"):
        plan_load(smol, LoadOptions(n_ctx=10_000_000), budget=BIG, name="smollm2:135m")
    small = MemoryBudget(ram_available=300 * MB, ram_total=300 * MB)
    with pytest.raises(ResourceError) as err:
        plan_load(smol, LoadOptions(n_ctx=8192), budget=small, name="smollm2:135m")
    msg, hint = str(err.value), err.value.hint
    assert "smollm2:135m" in msg and "8192-token context" in msg and "KV cache 188.7 MB" in msg
    assert "300.0 MB is available" in msg
    assert "--ctx-size" in hint and "--cache-type-k q8_0" in hint and "--force" in hint
    fit = int(hint.split("about ")[1].split(" tokens")[0])
    assert largest_ctx(ModelShape.from_gguf(smol), small, upper=8192, n_gpu_layers=0) == fit
    forced = plan_load(smol, LoadOptions(n_ctx=10_000_000), budget=BIG, force=True)
    assert forced.forced and forced.n_ctx == 10_000_000 and "--force" in forced.notes[-1]
    assert "beyond the 8192 tokens" in forced.notes[0]


def test_plan_refuses_weights_bigger_than_ram_with_quantization_advice(smol):
    with pytest.raises(ResourceError) as err:
        plan_load(smol, LoadOptions(n_ctx=512), budget=MemoryBudget(ram_available=50 * MB, ram_total=50 * MB))
    assert "smaller quantization" in err.value.hint


def test_plan_refuses_more_gpu_layers_than_vram_holds(smol):
    budget = MemoryBudget(ram_available=64 * GB, ram_total=64 * GB, gpu_offload=True, vram_free=150 * MB)
    with pytest.raises(ResourceError) as err:
        plan_load(smol, LoadOptions(n_ctx=4096, n_gpu_layers=-1), budget=budget)
    assert "GPU" in str(err.value) and "150.0 MB is free" in str(err.value)
    assert "fewer --gpu-layers" in err.value.hint


def test_unified_memory_counts_gpu_buffers_against_ram(smol):
    mac = MemoryBudget(ram_available=250 * MB, ram_total=8 * GB, gpu_offload=True, vram_free=5 * GB, unified=True)
    with pytest.raises(ResourceError):
        plan_load(smol, LoadOptions(n_ctx=4096, n_gpu_layers=-1), budget=mac)


def test_a_load_plan_asks_the_estimate_one_question(smol, monkeypatch):
    """Fitting the layers, shrinking the context and the refusal's advice are all answered by one
    size_load; the pre-flight calls nothing else of the estimate's."""
    from localinfer.system import estimate as est

    asked: list[int] = []
    outside: list[str] = []
    inside = [False]

    def counted(name, fn):
        def call(*args, **kw):
            if not inside[0]:
                outside.append(name)
            return fn(*args, **kw)

        return call

    def size_load(*args, **kw):
        asked.append(kw["n_ctx"])
        inside[0] = True
        try:
            return real(*args, **kw)
        finally:
            inside[0] = False

    real = est.size_load
    for name in ("estimate", "fit_gpu_layers", "largest_ctx"):
        monkeypatch.setattr(est, name, counted(name, getattr(est, name)))
    monkeypatch.setattr(est, "size_load", size_load)

    gpu = MemoryBudget(ram_available=64 * GB, ram_total=64 * GB, gpu_offload=True, vram_free=1200 * MB)
    tight = MemoryBudget(ram_available=250 * MB, ram_total=250 * MB)
    assert plan_load(smol, LoadOptions(n_gpu_layers=GPU_LAYERS_AUTO), budget=gpu, headroom=1024 * MB).n_gpu_layers > 0
    assert plan_load(smol, LoadOptions(), budget=tight).ctx_source == "default, reduced to fit memory"
    with pytest.raises(ResourceError) as ram:
        plan_load(smol, LoadOptions(n_ctx=8192), budget=MemoryBudget(ram_available=300 * MB, ram_total=300 * MB))
    vram = MemoryBudget(ram_available=64 * GB, ram_total=64 * GB, gpu_offload=True, vram_free=150 * MB)
    with pytest.raises(ResourceError) as gpu_short:
        plan_load(smol, LoadOptions(n_ctx=4096, n_gpu_layers=-1), budget=vram)
    assert re.search(r"about \d+ tokens fit", ram.value.hint) and re.search(r"about \d+ fit", gpu_short.value.hint)
    assert plan_load(smol, LoadOptions(n_ctx=8192), budget=tight, force=True).forced
    assert asked == [4096, 4096, 8192, 4096, 8192] and outside == []


def test_quantized_v_cache_without_flash_attention_is_a_usage_error(smol):
    with pytest.raises(UsageError, match="flash attention"):
        plan_load(smol, LoadOptions(cache_type_v="q8_0", flash_attn="off"), budget=BIG)


def test_an_unknown_layout_skips_the_estimate(tmp_path):
    from ggufsynth import write_gguf

    info = read_gguf(write_gguf(tmp_path / "tiny.gguf"))
    with pytest.raises(ShapeError):
        ModelShape.from_gguf(info)
    plan = plan_load(info, LoadOptions(), budget=BIG)
    assert plan.estimate is None and plan.n_ctx is None  # llama.cpp decides, and says what is wrong


def test_parse_buffer_report():
    lines = [
        "load_tensors: offloaded 29/31 layers to GPU\n",
        "load_tensors:        CUDA0 model buffer size =  1200.50 MiB\n",
        "load_tensors:   CPU_Mapped model buffer size =    92.10 MiB\n",
        "llama_context:  CUDA_Host  output buffer size =     0.19 MiB\n",
        "llama_kv_cache:      CUDA0 KV buffer size =    11.25 MiB\n",
        "sched_reserve:      CUDA0 compute buffer size =    98.25 MiB\n",
        "sched_reserve:  CUDA_Host compute buffer size =     5.00 MiB\n",
        "~llama_context:        CPU compute buffer size is  98.2520 MiB, matches expectation of  98.2520 MiB\n",
    ]
    r = parse_buffer_report(lines)
    assert (r.offloaded, r.offloadable) == (29, 31)
    assert r.total("model") == round(1200.50 * 2**20) + round(92.10 * 2**20)
    assert r.total("compute", host=False) == round(98.25 * 2**20) and r.total("compute", host=True) == 5 * 2**20
    assert r.model_devices == ("CUDA0", "CPU_Mapped") and r.total("KV") == round(11.25 * 2**20)
    empty = parse_buffer_report([])
    assert empty.offloaded is None and empty.total() == 0
    # An offload-capable build with no device says "offloaded 31/31" and keeps every weight on the host.
    nowhere = parse_buffer_report(["load_tensors: offloaded 31/31 layers to GPU\n",
                                   "load_tensors:   CPU_Mapped model buffer size =    92.10 MiB\n"])  # fmt: skip
    assert (nowhere.offloaded, nowhere.offloadable) == (0, 31)


# -- serve's default context: sized for agents and the memory ---------------------------------------------
def _trained(info, n: int):
    import dataclasses

    arch = info.metadata["general.architecture"]
    return dataclasses.replace(info, metadata={**info.metadata, f"{arch}.context_length": n})


def test_serve_sizes_each_sequence_from_the_trained_context_and_the_memory(smol, gemma):
    from localinfer.system.preflight import SERVE_CTX_CEILING, serve_context

    opts = LoadOptions()
    # a 21k-token agent prompt fits by default wherever the model and the memory allow: not run's 4096
    assert serve_context(gemma, opts, 4, budget=BIG).per_seq == 32768 == gemma.context_length
    assert serve_context(smol, opts, 4, budget=BIG).per_seq == 8192
    big = serve_context(_trained(gemma, 1 << 20), opts, 4, budget=BIG)
    assert big.per_seq == SERVE_CTX_CEILING and str(SERVE_CTX_CEILING) in big.why
    assert serve_context(_trained(gemma, 2048), opts, 4, budget=BIG).per_seq == 2048  # never past the trained one

    def fits(info, per_seq: int, budget) -> bool:
        options = LoadOptions(n_ctx=per_seq * 4, n_seq_max=4)
        return plan_load(info, options, budget=budget).estimate is not None  # raises ResourceError if not

    # less memory: the largest that fits for all four sequences (the load's own pre-flight then passes)
    for ram in (1500 * MB, 3000 * MB):
        budget = MemoryBudget(ram_available=ram, ram_total=ram)
        ctx = serve_context(gemma, opts, 4, budget=budget)
        assert 4096 < ctx.per_seq < 32768 and ctx.per_seq % 256 == 0 and "fit memory" in ctx.why, (ram, ctx)
        assert fits(gemma, ctx.per_seq, budget)
        with pytest.raises(ResourceError):
            fits(gemma, ctx.per_seq + 256, budget)
    # memory for not even run's default: run's default, and the load's pre-flight says what is missing
    tight = MemoryBudget(ram_available=300 * MB, ram_total=300 * MB)
    assert serve_context(gemma, opts, 4, budget=tight).per_seq == 4096
