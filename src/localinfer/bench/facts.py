"""What a bench result says about the model and the build (llama-bench's model, size, params,
backend and build columns), and how the bench loads a model: as every command does."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localinfer.engine.model import LlamaModel
    from localinfer.engine.types import LoadOptions
    from localinfer.store import ResolvedModel

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ModelFacts:
    """What the results table says about a model (llama-bench's model/size/params/backend columns)."""

    name: str
    path: str
    sha256: str | None
    description: str  # llama.cpp's: "llama 135M Q4_1"
    quant: str | None
    size_bytes: int
    n_params: int
    backend: str

    @classmethod
    def of(cls, resolved: ResolvedModel, model: LlamaModel, n_gpu_layers: int) -> ModelFacts:
        return cls(
            name=resolved.name, path=str(resolved.path), sha256=resolved.sha256, description=model.description,
            quant=resolved.info.quantization, size_bytes=model.size_bytes, n_params=model.n_params,
            backend=backend_name(n_gpu_layers),
        )


@dataclass(frozen=True)
class Setup:
    """What every result says of the load it was measured under (llama-bench's model and params
    columns): the fields BenchResult and ParallelResult begin with."""

    model: ModelFacts
    options: LoadOptions
    n_threads: int
    n_ctx: int
    n_batch: int


def build_version() -> str:
    """llama-cpp-python's version: which llama.cpp the figures come from."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama_cpp_python")
    except PackageNotFoundError:  # pragma: no cover - installed some other way
        return "unknown"


def backend_name(n_gpu_layers: int) -> str:
    """llama-bench's backend column: the backends of the devices the layers can go to (RPC last, as
    llama-bench lists it); "CPU" with -ngl 0, on a CPU-only build, or on an offload-capable build that
    sees no device (an RPC build without servers: everything ran on the CPU)."""
    from localinfer.engine.backend import devices, supports_gpu_offload

    if n_gpu_layers == 0 or not supports_gpu_offload():
        return "CPU"
    names = dict.fromkeys(d["backend"] for d in devices() if d["type"] in ("gpu", "igpu") and d["backend"])
    return ",".join(sorted(names, key=lambda name: name == "RPC")) or "CPU"


@contextlib.contextmanager
def loaded_model(
    resolved: ResolvedModel, options: LoadOptions, progress: Progress | None, *, force: bool = False
) -> Iterator[LlamaModel]:
    """The model loaded by the one loader (``backends.load``: pre-flight, RPC servers, "last used"),
    as every command loads it; bench then drives its engine token by token, as llama-bench does."""
    from localinfer import backends

    # the bench registered every configuration's RPC servers once, before its first load (llama.cpp
    # picks its devices then): the loader is not asked to register them again
    with backends.load(resolved, replace(options, rpc_servers=()), force=force, on_note=progress) as backend:
        if progress:
            progress(f"loaded {resolved.name} in {backend.load_s:.2f} s")
        yield backend.loaded.model
