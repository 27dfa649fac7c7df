"""Option types shared by run, chat, bench and batch (Annotated aliases, as huggingface_hub's CLI does),
and their translation into the engine's plain option values."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from localinfer.engine import defaults as DEFAULTS  # noqa: N812 - sampling defaults, read in signatures
from localinfer.errors import UsageError

if TYPE_CHECKING:
    from localinfer.engine.types import LoadOptions, SamplingOptions

_SAMPLING = "Sampling"
_CONTEXT = "Model and context"

def complete_model(incomplete: str) -> list[str]:
    """Shell completion for -m: registry names and installed models (paths the shell completes)."""
    try:
        from localinfer.store.manage import available_models

        names = sorted({a["name"] for a in available_models()})
    except Exception:  # noqa: BLE001 - completion must never print an error into the user's shell
        return []
    return [n for n in names if n.startswith(incomplete)]


ModelOpt = Annotated[
    Optional[str],
    typer.Option("--model", "-m", help="Registry name (see `localinfer list --available`) or path to a .gguf file.", rich_help_panel=_CONTEXT, autocompletion=complete_model),
]
SystemOpt = Annotated[Optional[str], typer.Option("--system", "-s", help="System prompt.")]
TemperatureOpt = Annotated[float, typer.Option("--temperature", "--temp", min=0.0, help="0 = greedy (deterministic).", rich_help_panel=_SAMPLING)]
TopPOpt = Annotated[float, typer.Option("--top-p", min=0.0, max=1.0, rich_help_panel=_SAMPLING)]
TopKOpt = Annotated[int, typer.Option("--top-k", min=0, help="0 = disabled.", rich_help_panel=_SAMPLING)]
MinPOpt = Annotated[float, typer.Option("--min-p", min=0.0, max=1.0, rich_help_panel=_SAMPLING)]
RepeatPenaltyOpt = Annotated[float, typer.Option("--repeat-penalty", min=0.0, help="1.0 = disabled.", rich_help_panel=_SAMPLING)]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", min=0, max=2**32 - 2, help="Same seed, same text. Default: random.", rich_help_panel=_SAMPLING)]
MaxTokensOpt = Annotated[Optional[int], typer.Option("--max-tokens", "-n", min=1, help="Stop after this many tokens. Default: until the model stops or the context is full; 256 in plain completion (--raw).", rich_help_panel=_SAMPLING)]
IgnoreEosOpt = Annotated[bool, typer.Option("--ignore-eos", help="Keep generating past the model's end-of-text token (for benchmarks and tests).", rich_help_panel=_SAMPLING)]
StopOpt = Annotated[Optional[list[str]], typer.Option("--stop", help="Stop when this text appears (repeatable); it is not printed.", rich_help_panel=_SAMPLING)]
CtxSizeOpt = Annotated[Optional[int], typer.Option("--ctx-size", "-c", min=16, help="Context window in tokens. Default: the model's trained context, at most 4096.", rich_help_panel=_CONTEXT)]
ThreadsOpt = Annotated[Optional[int], typer.Option("--threads", "-t", min=1, help="CPU threads for prefill and decode. Default: physical cores.", rich_help_panel=_CONTEXT)]
GpuLayersOpt = Annotated[str, typer.Option("--gpu-layers", "-ngl", help="Layers to offload: auto, all or a number. auto = 0 on a CPU-only build.", rich_help_panel=_CONTEXT)]
FlashAttnOpt = Annotated[str, typer.Option("--flash-attn", "-fa", help="Flash attention: auto, on or off.", rich_help_panel=_CONTEXT)]
CacheTypeKOpt = Annotated[str, typer.Option("--cache-type-k", "-ctk", help="KV cache type for K: f16 (default), bf16, f32, q8_0, q4_0, q4_1, q5_0, q5_1.", rich_help_panel=_CONTEXT)]
CacheTypeVOpt = Annotated[str, typer.Option("--cache-type-v", "-ctv", help="KV cache type for V: f16 (default), bf16, f32, q8_0, q4_0, q4_1, q5_0, q5_1.", rich_help_panel=_CONTEXT)]
NoMmapOpt = Annotated[bool, typer.Option("--no-mmap", help="Read the model into memory instead of mapping it.", rich_help_panel=_CONTEXT)]
MlockOpt = Annotated[bool, typer.Option("--mlock", help="Lock the model in RAM (no swapping).", rich_help_panel=_CONTEXT)]
BatchSizeOpt = Annotated[int, typer.Option("--batch-size", "-b", min=1, help="Prompt tokens evaluated per llama_decode call.", rich_help_panel=_CONTEXT)]
CpuRepackOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--cpu-repack/--no-cpu-repack",
        help="Repack weights for the CPU's fastest kernels. Default: on, except on AMX CPUs (also LOCALINFER_CPU_REPACK).",
        rich_help_panel=_CONTEXT,
    ),
]
RpcOpt = Annotated[
    Optional[str],
    typer.Option(
        "--rpc",
        metavar="HOST:PORT[,...]",
        envvar="LOCALINFER_RPC",
        help="Offload to ggml-rpc-servers on other machines (unauthenticated: trusted networks only; see README).",
        rich_help_panel=_CONTEXT,
    ),
]
ForceOpt = Annotated[bool, typer.Option("--force", help="Load even when the memory estimate says it will not fit.", rich_help_panel=_CONTEXT)]
NoLogOpt = Annotated[bool, typer.Option("--no-log", help="Do not record this request in the usage history (also LOCALINFER_NO_LOG=1).")]
OfflineOpt = Annotated[bool, typer.Option("--offline", help="Never download; also HF_HUB_OFFLINE=1.", rich_help_panel=_CONTEXT)]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Show llama.cpp's log and a full stats table.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No stats line, no warnings; only the answer.")]

# --endpoint: the same command against an OpenAI-compatible server (localinfer.backends.remote)
_SERVER = "Server (--endpoint)"
EndpointOpt = Annotated[
    Optional[str],
    typer.Option("--endpoint", envvar="LOCALINFER_ENDPOINT", metavar="URL", help="Ask this OpenAI-compatible server instead of a local model: its base URL, e.g. http://127.0.0.1:8080/v1.", rich_help_panel=_SERVER),
]
ApiKeyOpt = Annotated[Optional[str], typer.Option("--api-key", envvar="LOCALINFER_API_KEY", help="Bearer key for --endpoint (else OPENAI_API_KEY).", rich_help_panel=_SERVER)]
TimeoutOpt = Annotated[Optional[float], typer.Option("--timeout", min=0.001, help="Seconds to wait for the server's next bytes before failing. [default: 600]", rich_help_panel=_SERVER, show_default=False)]


class Overflow(str, enum.Enum):
    """--on-overflow: what to do with a prompt that does not fit the context."""

    error = "error"
    truncate = "truncate"


def parse_gpu_layers(value: str) -> int:
    """auto | all | N -> LoadOptions.n_gpu_layers (-1 = all; auto = GPU_LAYERS_AUTO, which the
    pre-flight in generate.load() turns into the layers that fit in free VRAM, 0 on a CPU-only build;
    the engine alone reads any negative value as all)."""
    v = value.strip().lower()
    if v == "all":
        return -1
    if v == "auto":
        from localinfer.engine.backend import supports_gpu_offload
        from localinfer.system.estimate import GPU_LAYERS_AUTO

        return GPU_LAYERS_AUTO if supports_gpu_offload() else 0
    try:
        n = int(v)
    except ValueError:
        raise UsageError(f"--gpu-layers must be auto, all or a number, not {value!r}") from None
    if n < 0:
        raise UsageError("--gpu-layers must not be negative (use 'all')")
    return n


_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1")


def _choice(flag: str, value: str, allowed: tuple[str, ...]) -> str:
    v = value.strip().lower()
    if v not in allowed:
        raise UsageError(f"{flag} must be one of {', '.join(allowed)}, not {value!r}")
    return v


def load_options(
    *,
    ctx_size: int | None,
    threads: int | None,
    gpu_layers: str,
    verbose: bool,
    flash_attn: str = "auto",
    cache_type_k: str = "f16",
    cache_type_v: str = "f16",
    no_mmap: bool = False,
    mlock: bool = False,
    batch_size: int = 2048,
    cpu_repack: bool | None = None,
    rpc: str | None = None,
) -> LoadOptions:
    from localinfer.engine.rpc import parse_endpoints
    from localinfer.engine.types import LoadOptions

    return LoadOptions(
        n_ctx=ctx_size,
        n_threads=threads,
        n_gpu_layers=parse_gpu_layers(gpu_layers),
        verbose=verbose,
        flash_attn=_choice("--flash-attn", flash_attn, ("auto", "on", "off")),
        cache_type_k=_choice("--cache-type-k", cache_type_k, _CACHE_TYPES),
        cache_type_v=_choice("--cache-type-v", cache_type_v, _CACHE_TYPES),
        use_mmap=not no_mmap,
        use_mlock=mlock,
        n_batch=batch_size,
        cpu_repack=cpu_repack,
        rpc_servers=parse_endpoints(rpc),
    )


def sampling_options(
    *, temperature: float, top_p: float, top_k: int, min_p: float, repeat_penalty: float, seed: int | None
) -> SamplingOptions:
    from localinfer.engine.types import SamplingOptions

    return SamplingOptions(
        temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, repeat_penalty=repeat_penalty, seed=seed
    )

