"""llama.cpp's model and context parameters, from our LoadOptions."""

from __future__ import annotations

from typing import Any

from localinfer.engine.backend import cpu_repack_enabled, default_threads, llama_cpp, load_mode
from localinfer.engine.types import LoadOptions

_GGML_BF16 = 30  # enum ggml_type: llama-cpp-python names no BF16
_CACHE_TYPES = {
    "f32": llama_cpp.GGML_TYPE_F32,
    "f16": llama_cpp.GGML_TYPE_F16,
    "bf16": _GGML_BF16,
    "q8_0": llama_cpp.GGML_TYPE_Q8_0,
    "q4_0": llama_cpp.GGML_TYPE_Q4_0,
    "q4_1": llama_cpp.GGML_TYPE_Q4_1,
    "q5_0": llama_cpp.GGML_TYPE_Q5_0,
    "q5_1": llama_cpp.GGML_TYPE_Q5_1,
}
_FLASH_ATTN = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


def model_params(options: LoadOptions) -> Any:
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = options.n_gpu_layers if options.n_gpu_layers >= 0 else 2**31 - 1
    mparams.load_mode = load_mode(options.use_mmap, options.use_mlock)
    mparams.use_extra_bufts = cpu_repack_enabled(options.cpu_repack)
    return mparams


def context_params(options: LoadOptions, n_ctx: int) -> Any:
    threads = options.n_threads or default_threads()
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = min(options.n_batch, n_ctx) if options.n_seq_max == 1 else options.n_batch
    cparams.n_ubatch = min(options.n_ubatch, cparams.n_batch)
    cparams.n_seq_max = options.n_seq_max
    cparams.n_threads = threads
    cparams.n_threads_batch = options.n_threads_batch or threads
    cparams.flash_attn_type = _FLASH_ATTN[options.flash_attn]
    cparams.type_k = _CACHE_TYPES[options.cache_type_k]
    cparams.type_v = _CACHE_TYPES[options.cache_type_v]
    cparams.no_perf = True
    return cparams
