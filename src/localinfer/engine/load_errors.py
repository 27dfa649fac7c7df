"""Why llama.cpp refused to load a model or create a context, from its captured log: one line and
the right exception (memory: exit 6, a bad file: exit 4, else exit 1)."""

from __future__ import annotations

import re
from pathlib import Path

from localinfer.engine.backend import LOG_ERROR, LlamaLog
from localinfer.errors import InvalidModelError, ModelLoadError, ResourceError, UsageError


_MEMORY_MARKERS = (
    "insufficient memory",
    "failed to allocate",
    "out of memory",
    "unable to allocate",
    "cannot allocate",
    "cudamalloc failed",
    "erroroutofdevicememory",
)
_ARCH_MARKERS = ("unknown model architecture", "unsupported model architecture")
_BAD_FILE_MARKERS = (
    "not within the file bounds",
    "corrupted or incomplete",
    "key not found in model",
    "wrong shape",
    "wrong number of tensors",
    "missing tensor",
    "failed to read",
    "unexpectedly reached end of file",
    "gguf_init_from_file",
    "invalid magic",
    "error loading model hyperparameters",
    "error loading model vocabulary",
    "is not of the expected type",
    "has wrong type",
)
_PREFIX = re.compile(r"^(?:[~\w.]+: |error loading model: )+")


def _reason(line: str) -> str:
    """llama.cpp's log line without its ``function: `` prefixes."""
    return _PREFIX.sub("", line.strip()) or line.strip()


def diagnose_load_failure(log: LlamaLog, path: Path, what: str, since: int = 0) -> Exception:
    """One line saying why llama.cpp refused: memory (exit 6), a bad file (exit 4), or else (exit 1)."""
    errors = [text.strip() for level, text in log.since(since) if level == LOG_ERROR and text.strip()]
    if not errors:  # no error-level line: fall back on whatever was logged last
        errors = [ln.strip() for ln in list(log.lines)[-60:] if ln.strip()]
    low = [e.lower() for e in errors]

    def first(markers: tuple[str, ...]) -> str | None:
        for line, lower in zip(errors, low):
            if any(m in lower for m in markers):
                return line
        return None

    if first(_MEMORY_MARKERS):
        sizes = [int(m.group(1)) for e in errors if (m := re.search(r"buffer of size (\d+)", e))]
        amount = f" {max(sizes) / 1e9:.1f} GB" if sizes else ""
        return ResourceError(
            f"not enough memory to {what} {path.name}: llama.cpp could not allocate{amount} ({_reason(errors[-1])})",
            hint="try a smaller --ctx-size, a quantized KV cache (--cache-type-k/v q8_0), fewer --gpu-layers, "
            "or a smaller quantization",
        )
    line = first(("requires flash_attn",))
    if line:
        return UsageError(f"llama.cpp refused the options: {_reason(line)}", hint="use --flash-attn on (or auto)")
    line = first(_ARCH_MARKERS)
    if line:
        return InvalidModelError(
            f"{path.name}: this llama.cpp build does not support the model's architecture ({_reason(line)})",
            hint="upgrade llama-cpp-python, or pick another model",
        )
    line = first(_BAD_FILE_MARKERS)
    if line:
        return InvalidModelError(
            f"{path.name} is not a usable model: {_reason(line)}",
            hint="the file may be incomplete or damaged; pull it again (localinfer pull) or check its source",
        )
    detail = _reason(first(("error loading model",)) or errors[0]) if errors else "no details in llama.cpp's log"
    return ModelLoadError(
        f"llama.cpp could not {what} {path.name}: {detail}",
        hint="run with --verbose to see llama.cpp's log",
    )

