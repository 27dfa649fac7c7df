"""localinfer: local, on-device LLM inference from the command line and from Python.

    import localinfer
    model = localinfer.load("smollm2:135m")
    for chunk in model.stream("Why is the sky blue?", max_tokens=64, temperature=0):
        print(chunk.text, end="")

The API (``localinfer.api``) is imported on first use, so ``import localinfer`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from localinfer.api import Answer, Chunk, Model, Response, load
    from localinfer.engine.types import LoadOptions
    from localinfer.request.sampling import SamplingOptions
    from localinfer.errors import LocalInferError

_LAZY = {
    "load": "localinfer.api", "Model": "localinfer.api", "Chunk": "localinfer.api",
    "Response": "localinfer.api", "Answer": "localinfer.api",
    "LoadOptions": "localinfer.engine.types", "SamplingOptions": "localinfer.engine.types",
    "LocalInferError": "localinfer.errors",
}  # fmt: skip
__all__ = [
    "Answer", "Chunk", "LoadOptions", "LocalInferError", "Model", "Response", "SamplingOptions", "__version__", "load",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'localinfer' has no attribute {name!r}")
