"""A second copy of the model, repacked for AMX, that only decodes.

On CPUs with AMX the engine loads weights unrepacked (``backend.cpu_repack_enabled``): llama.cpp's
AMX kernels crash on any matmul with more than one row, so a prompt cannot be evaluated on weights
repacked for AMX. A single-token decode takes AMX's VNNI path instead, which works and is about
twice as fast (``benchmarks/amx_twin.py``). So ``Model`` evaluates prompts as usual and, for
answers long enough to repay the load, copies the sequence's KV cache into a context of this copy
(``llama_state_seq_get_data``/``set_data``, a few ms) and decodes there; the next prompt copies the
cache back first. An answer that stays shallow (``shallow``) keeps the main context's flash
attention there, with a BF16 V cache (``decode_settings``); a deeper one decodes without flash
attention (faster for one token at a time, the more so the deeper the cache), and one that goes
deep on the way drops it when its context grows. The cache's V half is converted between the
layouts and types on the way (``engine.kvstate``).

The copy loads on a thread at low priority (nice 19: it takes only a core nobody else wants), as early
as what it is for is known: in ``run``, beside the load ahead (``engine.llama.preload_model``) while
Python starts up, which leaves a core idle for most of half a second; in ``chat``, as soon as the
model is loaded, while the user types; otherwise when the first such answer starts.

It keeps out of the prompt's evaluation. Its context is created once it is given the main context's
settings (``start_context``): at once in an interactive ``chat``, otherwise once the first long
answer's first token is out (the creation, meeting SmolLM2's prompt, took it from 30 to 90-105 ms).
Its thread keeps OpenMP to one thread (``backend.openmp_one_thread``; prefill 50 -> 30 ms). An
answer whose first token comes before the copy is ready waits for it. The first token always comes
from the prompt's evaluation and every later one from this copy: the same seed gives the same text
(AMX rounds differently from the unrepacked path, so it is not the text without it).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from localinfer.engine.backend import (
    GGML_BF16,
    GGML_F16,
    GGML_FLOAT_BYTES,
    cpu_has_amx,
    cpu_has_avx512_bf16,
    join_past_interrupts,
    llama_cpp,
    log_muted,
    openmp_one_thread,
    supports_gpu_offload,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    from localinfer.hardware import MemoryBudget

MIN_TOKENS = 32  # an answer capped below this decodes where its prompt was evaluated: the load would not pay
# Room the twin's context is first made with beyond the cache, for an answer with no (or a larger)
# cap: it is made again twice as large when the answer fills it. Its KV cache's size is most of the
# wait for it, and without flash attention its decode slows with that size too (a 4096-cell
# context: -10% against a 256-cell one at depth 48).
ROOM = 512


# Without flash attention the twin reads all the cells of its context's smallest size (256) at every
# token; with it, only those in use, and its V cache can be BF16 (decode_settings): an answer that
# stays shallow decodes faster with the main context's flash attention, one that goes deep slower.
# tg128 from depth d, BF16 V with flash attention against F16 without (benchmarks/twin_v_cache.py,
# two runs): +21 to +26% at d0, +13 to +20% at d48, +7% at d150-d200, +6% at d350, -3 to -6% at d450,
# -7% at d600. They cross at a mean depth (d + 64) of 400 to 480 cells: the lower one is kept.
SHALLOW_MEAN_DEPTH = 400
# With an F16 V cache (no AVX512-BF16, or a V type of the user's): `run --raw -n 128` on a 4-token
# prompt 111.8 -> 118.9 tok/s with flash attention, a 48-token chat prompt 112.7 -> 107.0; they
# cross near a mean depth of 86 (llama-bench: flash attention +3% at d6, -2 to -7% at d48).
SHALLOW_MEAN_DEPTH_F16 = 86


def shallow(depth: int, reach: int, bf16_v: bool = True) -> bool:
    """Whether an answer decoded from ``depth`` cells to at most ``reach`` stays shallow enough, on
    average, to decode faster with flash attention; ``bf16_v``: with a BF16 V cache there
    (``decode_settings``), else F16's crossover."""
    return (depth + reach) / 2 < (SHALLOW_MEAN_DEPTH if bf16_v else SHALLOW_MEAN_DEPTH_F16)


def bf16_v_applies(cparams) -> bool:  # noqa: ANN001 - a ctypes struct
    """Whether ``decode_settings(..., bf16_v=True)`` would give a context with these settings a BF16
    V cache where it keeps flash attention."""
    return (
        cparams.type_v == GGML_F16
        and cparams.flash_attn_type != llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        and cpu_has_avx512_bf16()
    )


def allowed_by_env() -> bool:
    """Neither ``LOCALINFER_AMX_DECODE=0`` nor an explicit ``LOCALINFER_CPU_REPACK`` (keep to it)."""
    if os.environ.get("LOCALINFER_AMX_DECODE", "").strip().lower() in ("0", "false", "no", "off"):
        return False
    return not os.environ.get("LOCALINFER_CPU_REPACK", "").strip()


def possible(n_gpu_layers: int, cpu_repack: bool | None, n_seq_max: int) -> bool:
    """The cheap half of ``wanted``: the environment, the CPU and the settings allow a twin."""
    if not allowed_by_env() or cpu_repack is not None:
        return False
    if not cpu_has_amx() or n_seq_max != 1:  # with repacking left to its default: off exactly on AMX
        return False
    return n_gpu_layers == 0 or not supports_gpu_offload()


def wanted(
    n_gpu_layers: int,
    cpu_repack: bool | None,
    n_seq_max: int,
    extra_bytes: Callable[[], int],
    budget: MemoryBudget | None = None,
) -> bool:
    """Whether a model loaded with these settings gets a twin (before any answer asks for it).
    ``extra_bytes()``: what the twin adds: its weights, KV cache and compute buffer, and the buffer a
    copy of the cache goes through (asked last: only on AMX CPUs). ``budget``: the memory measured
    before loading began, when a twin may be loading already (its memory would count against it)."""
    if not possible(n_gpu_layers, cpu_repack, n_seq_max):
        return False
    if budget is None:
        from localinfer.hardware import memory_budget

        budget = memory_budget()  # RAM available, under a container's limit, LOCALINFER_FAKE_RAM honoured
    return fits(extra_bytes(), budget)


def fits(extra_bytes: int, budget: MemoryBudget) -> bool:
    """A twin may take a quarter of the RAM available (swap does not count)."""
    return extra_bytes <= 0.25 * (budget.ram_available - budget.swap_free)


_loading: list[DecodeTwin] = []  # twins whose load has not finished


def settle(keep: DecodeTwin | None = None) -> None:
    """Stop the twins still loading (but ``keep``) and wait for them: before another model loads, to
    free their memory, and before the interpreter exits (llama.cpp must not be mid-load then)."""
    stopping = [twin for twin in _loading if twin is not keep]
    for twin in stopping:
        twin.cancel()
    for twin in stopping:
        twin.wait()


def _no_vocabulary(vocab: tuple[str, int]):  # noqa: ANN202 - a ctypes array
    """llama.cpp metadata overrides that load a model without its tokenizer: ``vocab`` is the
    architecture and the vocabulary's size. llama.cpp then makes that many placeholder tokens (the
    embedding and output tensors keep their shapes) instead of building the vocabulary's tables,
    most of a small model's load: 145-200 -> 80 ms for SmolLM2's 49,152 tokens, 650-730 -> 220 ms
    for Gemma 3's 262,144. The twin never tokenizes or detokenizes (the main model does); its
    logits are the same to the bit (tests/test_engine.py)."""
    arch, n_vocab = vocab
    overrides = (llama_cpp.llama_model_kv_override * 3)()  # the last, keyless, ends the list
    overrides[0].key = b"tokenizer.ggml.model"
    overrides[0].tag = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR
    overrides[0].value.val_str = b"none"
    overrides[1].key = f"{arch}.vocab_size".encode()
    overrides[1].tag = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT
    overrides[1].value.val_i64 = n_vocab
    return overrides


class DecodeTwin:
    """The repacked copy and its context, loading on a thread until ``ready()``.

    Without ``cparams`` the thread loads the weights (``weights_loaded`` is set then) and waits for
    ``start_context`` (its context's settings) or ``cancel``. ``vocab`` (architecture, vocabulary
    size): load without the tokenizer (``_no_vocabulary``); None: with it.
    """

    def __init__(self, path: Path, mparams, cparams=None, vocab: tuple[str, int] | None = None) -> None:  # noqa: ANN001
        self.model = None
        self.ctx = None
        self.mem = None
        self.n_ctx = 0  # its context's size, once it has one
        self.failed = False
        self._cancelled = False
        # Its context's settings (decode_settings: the main context's n_ubatch is kept, since a
        # sliding-window cache is sized from it and a smaller one could not take the main context's
        # cells); the model's, with repacking on.
        self._cparams = cparams
        self._go = threading.Event()  # set once the context can be created, or the load is cancelled
        self.weights_loaded = threading.Event()  # set when the weights' load has ended, loaded or not
        if cparams is not None:
            self._go.set()
        mparams = type(mparams).from_buffer_copy(mparams)
        mparams.use_extra_bufts = True
        self._overrides = None  # kept alive for the load
        if vocab is not None and vocab[0] and vocab[1] > 0 and not mparams.kv_overrides:
            self._overrides = _no_vocabulary(vocab)
            mparams.kv_overrides = ctypes.cast(self._overrides, ctypes.POINTER(llama_cpp.llama_model_kv_override))
        self._progress = llama_cpp.llama_progress_callback(lambda _p, _u: not self._cancelled)
        mparams.progress_callback = self._progress
        self._thread = threading.Thread(target=self._load, args=(path, mparams), name="localinfer-amx-twin")
        _loading.append(self)
        self._thread.start()  # not a daemon: the interpreter waits for it rather than exit mid-load

    def _load(self, path: Path, mparams) -> None:  # noqa: ANN001
        model = ctx = None
        try:
            try:  # Linux: this thread only; whatever else runs meanwhile keeps the cores
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
            except (AttributeError, OSError):
                pass
            # The weights' conversion for AMX runs an OpenMP team: its worker would live as long as
            # this thread, waiting through the prompt's evaluation, and make its barriers sleep.
            openmp_one_thread()
            # Its log lines stay out of the captured log: another load may be running (the main one,
            # ahead) and its report is parsed. No fd redirection (the answer may be streaming to stdout).
            with log_muted():
                model = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), mparams)
                self.weights_loaded.set()
                if model and self._await_context():
                    ctx = llama_cpp.llama_init_from_model(model, self._cparams)
        finally:
            self.weights_loaded.set()
            if ctx:
                self.model = model
                self._adopt(ctx)
            else:
                if model:
                    llama_cpp.llama_model_free(model)
                self.failed = True
            if self in _loading:
                _loading.remove(self)

    def _await_context(self) -> bool:
        """Wait for the context's settings; False when cancelled. The interpreter ending without
        anyone settling this twin (a script that only preloaded) cancels it: it waits for this thread."""
        while not self._go.wait(0.05):
            if not threading.main_thread().is_alive():
                return False
        return not self._cancelled

    def start_context(self, cparams) -> None:  # noqa: ANN001 - a ctypes struct
        """Create the context, with the main context's settings, as soon as the weights are loaded
        (once: later calls change nothing)."""
        if self._cparams is None:
            self._cparams = cparams
        self._go.set()

    def ready(self) -> bool:
        """Wait for the load; whether the copy can decode. Only once it has the context's settings
        (``cparams``, ``start_context``) or is cancelled: until then its thread waits for them."""
        if not self._go.is_set():
            raise RuntimeError("DecodeTwin.ready() before start_context(): it would wait forever")
        self._thread.join()
        return not self.failed  # set whenever the load did not end with a context

    @property
    def v_type(self) -> int | None:
        """Its context's V cache type (a ggml type), once it has its settings."""
        return None if self._cparams is None else int(self._cparams.type_v)

    @property
    def v_transposed(self) -> bool:
        """Whether its context keeps the V cache transposed (flash attention off): known once it
        has its settings."""
        return self._cparams is not None and transposes(self._cparams)

    def remake(self, cparams) -> bool:  # noqa: ANN001 - a ctypes struct
        """Replace the (ready) context with one made with ``cparams`` (larger, or another flash
        attention); whether that worked. Its cache is lost (save it first): the old context is freed
        before the new one is made, so that both never take memory at once. If that fails, the twin
        has no context left and must be closed."""
        llama_cpp.llama_free(self.ctx)
        self.ctx = self.mem = None
        self.n_ctx = 0
        self._cparams = cparams
        ctx = llama_cpp.llama_init_from_model(self.model, cparams)
        if not ctx:
            self.failed = True
            return False
        self._adopt(ctx)
        return True

    def _adopt(self, ctx) -> None:  # noqa: ANN001 - a llama_context pointer
        self.ctx, self.mem, self.n_ctx = ctx, llama_cpp.llama_get_memory(ctx), int(llama_cpp.llama_n_ctx(ctx))

    def cancel(self) -> None:
        """Stop a load still running (llama.cpp asks between tensors); ``ready()`` then says False."""
        self._cancelled = True
        self._go.set()

    def wait(self) -> None:
        join_past_interrupts(self._thread)

    def close(self) -> None:
        self.cancel()
        self.wait()  # llama.cpp must not be mid-load when its model is freed
        if self.ctx:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            llama_cpp.llama_model_free(self.model)
            self.model = None
        self.failed = True


_TRANSPOSABLE_V = tuple(GGML_FLOAT_BYTES)  # ggml F32, F16, BF16: a V cache kept without flash attention


def decode_settings(cparams, n_ctx: int, flash_attn: bool, bf16_v: bool = False):  # noqa: ANN001, ANN201 - ctypes structs
    """The twin's context settings: the main context's, ``n_ctx`` cells, and flash attention off
    unless ``flash_attn`` (or a V cache type that needs it): it decodes faster without
    (``engine.kvstate``), and the cache is converted on its way across.

    ``bf16_v``: where flash attention stays on, an F16 V cache becomes BF16 on a CPU with
    AVX512-BF16 (its cache converted on the way too). ggml's flash attention on the CPU accumulates
    an F16 V cache's weighted sum in F16 and converts every value twice, a BF16 one in F32 through
    native instructions: tg128 +9% at depth 0, +17% at 48, +53% at 200 against F16 with flash
    attention (``benchmarks/twin_v_cache.py``), with next-token distributions as close to an F32
    cache's as F16's are (the same script)."""
    settings = type(cparams).from_buffer_copy(cparams)
    settings.n_ctx = n_ctx
    if not flash_attn and settings.type_v in _TRANSPOSABLE_V:
        settings.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    elif bf16_v and bf16_v_applies(settings):
        settings.type_v = GGML_BF16
    return settings


def transposes(cparams) -> bool:  # noqa: ANN001 - a ctypes struct
    """Whether a context made with these settings keeps its V cache transposed (flash attention off)."""
    return cparams.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED


def sequence_state(ctx) -> bytearray | None:  # noqa: ANN001
    """Sequence 0 of ``ctx``'s KV cache, saved (``llama_state_seq_get_data``) straight into the
    buffer returned: a state is tens of MB once the cache is deep, and every copy of it faults in
    fresh pages (1,500 tokens of SmolLM2: 34 MB, ~17 ms a copy here)."""
    size = llama_cpp.llama_state_seq_get_size(ctx, 0)
    out = bytearray(size)
    view = (ctypes.c_uint8 * size).from_buffer(out)
    got = llama_cpp.llama_state_seq_get_data(ctx, view, size, 0)
    del view  # its export would keep ``out`` from shrinking
    if got <= 0:
        return None
    del out[got:]
    return out


def restore_sequence(ctx, state: bytes | bytearray | None) -> bool:  # noqa: ANN001
    """Replace sequence 0 of ``ctx``'s KV cache with a saved one (read in place where it is a
    bytearray, as ``sequence_state`` and ``engine.kvstate`` make them); whether that worked."""
    if not state:
        return False
    array = ctypes.c_uint8 * len(state)
    buf = array.from_buffer(state) if isinstance(state, bytearray) else array.from_buffer_copy(state)
    return llama_cpp.llama_state_seq_set_data(ctx, buf, len(state), 0) == len(state)
