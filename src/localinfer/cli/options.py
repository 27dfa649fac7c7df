"""Option types shared by the commands (Annotated aliases, as huggingface_hub's CLI does), and the
option groups (common, load, sampling, cost, server, format...) that a command takes as one plain value
for the core (how a group is attached: cli/groups.py)."""

import enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional, TypeAlias

import typer

from localinfer.request import rules
from localinfer.cli.groups import OptionGroup, grouped  # noqa: F401 - what commands decorate with
from localinfer.cli.draft_options import DRAFT, Draft  # noqa: F401 - the draft group, its own module
from localinfer.request import defaults as DEFAULTS  # sampling defaults, read in signatures
from localinfer.errors import UsageError

if TYPE_CHECKING:
    from localinfer.engine.types import LoadOptions
    from localinfer.request.sampling import SamplingOptions
    from localinfer.remote.connection import Endpoint
    from localinfer.request.structured import Format
    from localinfer.resident.place import KeepAlive
    from localinfer.usage.cost import Pricing

_SAMPLING = "Sampling"
_CONTEXT = "Model and context"
_COST = "Cost"

def complete_model(incomplete: str) -> list[str]:
    """Shell completion for -m: registry names and installed models (paths the shell completes)."""
    try:
        from localinfer.store.manage import available_models

        names = sorted({a["name"] for a in available_models()})
    except Exception:  # completion must never print an error into the user's shell
        return []
    return [n for n in names if n.startswith(incomplete)]


ModelOpt = Annotated[
    Optional[str],
    typer.Option("--model", "-m", help="Registry name (see `localinfer list --available`) or path to a .gguf file.", rich_help_panel=_CONTEXT, autocompletion=complete_model),
]
SystemOpt = Annotated[Optional[str], typer.Option("--system", "-s", help="System prompt.")]
TemperatureOpt = Annotated[float, typer.Option("--temperature", "--temp", **rules.option("temperature", typer.BadParameter), help="0 = greedy (deterministic).", rich_help_panel=_SAMPLING)]
TopPOpt = Annotated[float, typer.Option("--top-p", **rules.option("top_p", typer.BadParameter), rich_help_panel=_SAMPLING)]
TopKOpt = Annotated[int, typer.Option("--top-k", **rules.option("top_k", typer.BadParameter), help="0 = disabled.", rich_help_panel=_SAMPLING)]
MinPOpt = Annotated[float, typer.Option("--min-p", **rules.option("min_p", typer.BadParameter), rich_help_panel=_SAMPLING)]
RepeatPenaltyOpt = Annotated[float, typer.Option("--repeat-penalty", **rules.option("repeat_penalty", typer.BadParameter), help="1.0 = disabled.", rich_help_panel=_SAMPLING)]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", **rules.option("seed", typer.BadParameter), help="Same seed, same text. Default: random.", rich_help_panel=_SAMPLING)]
MaxTokensOpt = Annotated[Optional[int], typer.Option("--max-tokens", "-n", **rules.option("max_tokens", typer.BadParameter), help="Stop after this many tokens. Default: until the model stops or the context is full; 256 in plain completion (--raw).", rich_help_panel=_SAMPLING)]
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
        help="Offload to ggml-rpc-servers on other machines (unauthenticated: trusted networks only; see docs/hardware.md).",
        rich_help_panel=_CONTEXT,
    ),
]
ForceOpt = Annotated[bool, typer.Option("--force", help="Load even when the memory estimate says it will not fit, or with a --ctx-size beyond the context the model was trained on (answers degrade there).", rich_help_panel=_CONTEXT)]
NoLogOpt = Annotated[bool, typer.Option("--no-log", help="Do not record this request in the usage history (also LOCALINFER_NO_LOG=1).")]
OfflineOpt = Annotated[bool, typer.Option("--offline", help="Never download; also HF_HUB_OFFLINE=1.", rich_help_panel=_CONTEXT)]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Show llama.cpp's log and a full stats table.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No stats line, no warnings; only the answer.")]

# --endpoint: the same command against an OpenAI-compatible server (localinfer.backends.remote)
_SERVER = "Server (--endpoint)"
_OUTPUT = "Structured output"
JsonSchemaOpt = Annotated[Optional[str], typer.Option("--json-schema", metavar="SCHEMA", help="The answer is JSON valid against this JSON Schema (inline JSON).", rich_help_panel=_OUTPUT)]
JsonSchemaFileOpt = Annotated[Optional[Path], typer.Option("--json-schema-file", metavar="FILE", help="As --json-schema, the schema read from FILE.", rich_help_panel=_OUTPUT)]
GrammarOpt = Annotated[Optional[str], typer.Option("--grammar", metavar="GBNF", help="The answer follows this GBNF grammar (llama.cpp's syntax).", rich_help_panel=_OUTPUT)]
GrammarFileOpt = Annotated[Optional[Path], typer.Option("--grammar-file", metavar="FILE", help="As --grammar, the grammar read from FILE.", rich_help_panel=_OUTPUT)]
FormatOpt = Annotated[Optional[str], typer.Option("--format", metavar="json", help="json: the answer is one JSON object (any shape).", rich_help_panel=_OUTPUT)]
EndpointOpt = Annotated[
    Optional[str],
    typer.Option("--endpoint", envvar="LOCALINFER_ENDPOINT", metavar="URL", help="Ask this OpenAI-compatible server instead of a local model: its base URL, e.g. http://127.0.0.1:8080/v1.", rich_help_panel=_SERVER),
]
ApiKeyOpt = Annotated[Optional[str], typer.Option("--api-key", envvar="LOCALINFER_API_KEY", help="Bearer key for --endpoint (else OPENAI_API_KEY).", rich_help_panel=_SERVER)]
TimeoutOpt = Annotated[Optional[float], typer.Option("--timeout", min=0.001, help="Seconds to wait for the server's next bytes before failing. [default: 600]", rich_help_panel=_SERVER, show_default=False)]


def choices(name: str, *values: str) -> Any:
    """A flag's fixed set of values, as the str Enum Typer shows and checks (``Choice.x.value``)."""
    return enum.Enum(name, [(v, v) for v in values], type=str, module=__name__)


Overflow = choices("Overflow", "error", "truncate")  # --on-overflow: a prompt that does not fit the context


def parse_gpu_layers(value: str, *, probe: bool = True) -> int:
    """auto | all | N -> LoadOptions.n_gpu_layers (-1 = all; auto = GPU_LAYERS_AUTO, which the
    pre-flight in generate.loading.load() turns into the layers that fit in free VRAM, 0 on a CPU-only build;
    the engine alone reads any negative value as all). ``probe=False``: auto stays GPU_LAYERS_AUTO
    without asking llama.cpp (a resident server's pre-flight resolves it; the client imports no llama_cpp)."""
    v = value.strip().lower()
    if v == "all":
        return -1
    if v == "auto" and not probe:
        from localinfer.engine.types import GPU_LAYERS_AUTO  # not system.estimate: heavy for a client

        return GPU_LAYERS_AUTO
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


class Flags:
    """What the common group gives a command: its --force, --offline, --no-log, --quiet, --verbose
    (False for a flag the command does not take)."""

    __slots__ = ("force", "offline", "no_log", "quiet", "verbose")

    def __init__(self, force: bool, offline: bool, no_log: bool, quiet: bool, verbose: bool) -> None:
        self.force, self.offline, self.no_log, self.quiet, self.verbose = force, offline, no_log, quiet, verbose


def _common(force: ForceOpt = False, offline: OfflineOpt = False, no_log: NoLogOpt = False, quiet: QuietOpt = False,
            verbose: VerboseOpt = False) -> Flags:  # fmt: skip
    return Flags(force, offline, no_log, quiet, verbose)


def _load(
    ctx_size: CtxSizeOpt = None,
    threads: ThreadsOpt = None,
    gpu_layers: GpuLayersOpt = "auto",
    flash_attn: FlashAttnOpt = "auto",
    cache_type_k: CacheTypeKOpt = "f16",
    cache_type_v: CacheTypeVOpt = "f16",
    no_mmap: NoMmapOpt = False,
    mlock: MlockOpt = False,
    batch_size: BatchSizeOpt = 2048,
    cpu_repack: CpuRepackOpt = None,
    rpc: RpcOpt = None,
    *,
    verbose: bool = False,
    keep_alive: Any = None,
) -> "LoadOptions":
    from localinfer.engine.types import LoadOptions

    if rpc:  # engine.rpc imports socket: not on the way of a run without --rpc
        from localinfer.engine.rpc import parse_endpoints

    return LoadOptions(
        n_ctx=ctx_size,
        n_threads=threads,
        n_gpu_layers=parse_gpu_layers(gpu_layers, probe=not _resident(keep_alive)),
        verbose=verbose,
        flash_attn=_choice("--flash-attn", flash_attn, ("auto", "on", "off")),
        cache_type_k=_choice("--cache-type-k", cache_type_k, _CACHE_TYPES),
        cache_type_v=_choice("--cache-type-v", cache_type_v, _CACHE_TYPES),
        use_mmap=not no_mmap,
        use_mlock=mlock,
        n_batch=batch_size,
        cpu_repack=cpu_repack,
        rpc_servers=parse_endpoints(rpc) if rpc else (),
    )


def _sampling(
    temperature: TemperatureOpt = DEFAULTS.temperature,
    top_p: TopPOpt = DEFAULTS.top_p,
    top_k: TopKOpt = DEFAULTS.top_k,
    min_p: MinPOpt = DEFAULTS.min_p,
    repeat_penalty: RepeatPenaltyOpt = DEFAULTS.repeat_penalty,
    seed: SeedOpt = None,
) -> "SamplingOptions":
    from localinfer.request.sampling import SamplingOptions

    return SamplingOptions(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, repeat_penalty=repeat_penalty, seed=seed)


def _cost(
    price_per_hour: Annotated[Optional[float], typer.Option("--price-per-hour", min=0.0, help="What the machine costs per hour (rented).", rich_help_panel=_COST)] = None,
    watts: Annotated[Optional[float], typer.Option("--watts", min=0.0, help="Power draw of your hardware while it works (with --kwh-price).", rich_help_panel=_COST)] = None,
    kwh_price: Annotated[Optional[float], typer.Option("--kwh-price", min=0.0, help="Electricity price per kWh (with --watts).", rich_help_panel=_COST)] = None,
    compare_api_price: Annotated[Optional[str], typer.Option("--compare-api-price", metavar="IN[,OUT]", help="An API's price per million tokens (input, output) to compare with.", rich_help_panel=_COST)] = None,
) -> "Pricing":
    from localinfer.usage import cost

    return cost.pricing(price_per_hour=price_per_hour, watts=watts, kwh_price=kwh_price, compare_api_price=compare_api_price)


def _logprobs(
    logprobs: Annotated[Optional[int], typer.Option("--logprobs", **rules.option("top_logprobs", typer.BadParameter), help="Each answer token's log probability and the N likeliest alternatives, in the JSON output (0 = the token's alone).", rich_help_panel=_SAMPLING)] = None,
) -> "int | None":
    return logprobs


def _server(endpoint: EndpointOpt = None, api_key: ApiKeyOpt = None, timeout: TimeoutOpt = None) -> "Endpoint | None":
    if not endpoint:
        return None
    from localinfer.remote.connection import endpoint as checked

    return checked(endpoint, api_key, timeout)


def _response_format(
    json_schema: JsonSchemaOpt = None,
    json_schema_file: JsonSchemaFileOpt = None,
    grammar: GrammarOpt = None,
    grammar_file: GrammarFileOpt = None,
    response_format: FormatOpt = None,
) -> "Format | None":
    """One of the five, checked now (a bad schema is exit 2 before anything loads); a schema or
    grammar we cannot enforce is named by its option, as Typer names a bad value."""
    given = [f for f, v in (("--json-schema", json_schema), ("--json-schema-file", json_schema_file),
                            ("--grammar", grammar), ("--grammar-file", grammar_file),
                            ("--format", response_format)) if v is not None]  # fmt: skip
    if len(given) > 1:
        raise UsageError(f"give one of {', '.join(given)}, not several")
    if not given:  # free text: the schema checks (request.structured) are not imported
        return None
    from localinfer.request.structured import FormatError

    try:
        return _format_of(json_schema, json_schema_file, grammar, grammar_file, response_format)
    except FormatError as exc:
        raise FormatError(f"Invalid value for '{given[0]}': {exc}") from None


def _format_of(json_schema: str | None, json_schema_file: Path | None, grammar: str | None, grammar_file: Path | None,
               response_format: str | None) -> "Format | None":  # fmt: skip
    from localinfer.request.structured import from_grammar, from_schema, pick

    if json_schema_file is not None:
        return from_schema(_read_text(json_schema_file, "--json-schema-file"))
    if grammar_file is not None:
        return from_grammar(_read_text(grammar_file, "--grammar-file"))
    if response_format is not None and response_format != "json":
        batch_input = response_format in ("auto", "jsonl", "text")  # batch's input format was --format once
        raise UsageError(f"--format takes json, not {response_format!r}",
                         hint="batch's input format is --input-format" if batch_input else "use --json-schema for a schema")
    return pick(response_format, json_schema, grammar)


def _read_text(path: Path, flag: str) -> str:
    from localinfer.request.structured import MAX_SCHEMA_BYTES

    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SCHEMA_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"{flag}: cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_SCHEMA_BYTES:
        raise UsageError(f"{flag}: {path} is larger than {MAX_SCHEMA_BYTES // 1024} KiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{flag}: {path} is not UTF-8 (byte {exc.start})") from None


# --keep-alive: the model stays loaded in this user's resident server (localinfer.resident)
_RESIDENT = "Keep the model loaded (resident server)"
KeepAliveOpt = Annotated[
    Optional[str],
    typer.Option("--keep-alive", envvar="LOCALINFER_KEEP_ALIVE", metavar="DURATION", help="Keep the model loaded after the command, in this user's resident server, for this long idle (5m, 30s, 1h; 0: off, the default; -1: forever). See `localinfer ps`.", rich_help_panel=_RESIDENT),
]
MaxModelsOpt = Annotated[Optional[int], typer.Option("--max-models", envvar="LOCALINFER_MAX_MODELS", min=1, help="Models the resident server keeps loaded at once (the least recently used is unloaded). Default: what fits in memory.", rich_help_panel=_RESIDENT)]


def _keep_alive(keep_alive: KeepAliveOpt = None, max_models: MaxModelsOpt = None, *, endpoint: Any = None) -> "KeepAlive | None":
    if keep_alive is None:  # off (the usual run): nothing of the resident server's is imported
        return None
    from localinfer.resident.place import KeepAlive
    from localinfer.units import parse_keep_alive

    seconds = parse_keep_alive(keep_alive)
    if seconds is None or endpoint:  # a server of one's own choosing answers; nothing stays loaded here
        return None
    return KeepAlive(seconds, max_models)


def _resident(keep_alive: Any) -> bool:
    """Whether --keep-alive is on: read by the load group as the flag's text (or a group's value,
    from a caller that passes one)."""
    if keep_alive is None or not isinstance(keep_alive, str):
        return keep_alive is not None
    from localinfer.units import parse_keep_alive

    try:
        return parse_keep_alive(keep_alive) is not None
    except UsageError:
        return False  # reported by the keep-alive group


def _template_kwargs(text: Any) -> Any:
    """--chat-template-kwargs: a JSON object (bad JSON, or not an object: exit 2 naming it)."""
    if not isinstance(text, str):
        return text
    try:
        return rules.chat_template_kwargs_text("--chat-template-kwargs", text)
    except rules.RuleError as exc:
        raise typer.BadParameter(exc.problem) from None


_TEMPLATE = "Chat template"


def _template(
    chat_template_kwargs: Annotated[Optional[dict], typer.Option("--chat-template-kwargs", metavar="JSON", parser=_template_kwargs, help='Variables for the chat template, as a JSON object: \'{"enable_thinking": false}\', \'{"reasoning_effort": "high"}\'.', rich_help_panel=_TEMPLATE)] = None,
    think: Annotated[Optional[bool], typer.Option("--think/--no-think", help="Ask a reasoning model to think first, or not (enable_thinking, where its template reads it).", rich_help_panel=_TEMPLATE)] = None,
) -> "dict[str, Any] | None":
    out = dict(chat_template_kwargs or {})
    if think is not None:
        out["enable_thinking"] = think
    return out or None


COMMON = OptionGroup(_common)  # -> Flags (the load group reads --verbose too)
LOAD = OptionGroup(_load, local_only=True)  # -> LoadOptions (None with --endpoint)
SAMPLING = OptionGroup(_sampling)  # -> SamplingOptions
COST = OptionGroup(_cost, local_only=True)  # -> usage.cost.Pricing (bench, stats)
SERVER = OptionGroup(_server)  # -> remote.connection.Endpoint, checked (None without --endpoint)
FORMAT = OptionGroup(_response_format)  # -> structured.Format (None: free text)
KEEP_ALIVE = OptionGroup(_keep_alive)  # -> resident.place.KeepAlive (None: off, or with --endpoint)
TEMPLATE = OptionGroup(_template)  # -> the chat template's variables (None: none given)
LOGPROBS = OptionGroup(_logprobs)  # -> the top N of Request.logprobs (None: off); run --json and batch

# What a command body receives for each group, to annotate it with (strings: nothing is imported
# until a group's value is built).
Common: TypeAlias = Flags
Load: TypeAlias = "LoadOptions | None"  # None with --endpoint
Sampling: TypeAlias = "SamplingOptions"
Cost: TypeAlias = "Pricing | None"  # None with --endpoint
Server: TypeAlias = "Endpoint | None"  # None without --endpoint
ResponseFormat: TypeAlias = "Format | None"  # None: free text
Keep: TypeAlias = "KeepAlive | None"  # None: off (the default), or with --endpoint
TemplateVars: TypeAlias = "dict[str, Any] | None"  # --chat-template-kwargs, --think/--no-think
Logprobs: TypeAlias = "int | None"  # None: no log probabilities
Drafting: TypeAlias = "Draft | None"  # None with --endpoint
