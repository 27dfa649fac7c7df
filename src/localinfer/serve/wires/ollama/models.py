"""The models Ollama's API describes (``/api/tags``, ``/api/show``, ``/api/ps``): the installed
models from the store's manifest, and the one this server has loaded, as one list of ``ListedModel``.

A model's facts come from the manifest (its cached header summary: listing reads no model file) or
from the loaded model's GGUF header; ``served`` marks the models a request may name and be answered
by. Today that is the one model ``serve`` loaded; a server that loads installed models on demand
marks them all served (``catalog``'s ``on_demand``) and nothing else here changes.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localinfer.generate.loading import LoadedModel
    from localinfer.gguf import GGUFInfo

FOREVER = "2318-01-01T00:00:00Z"  # /api/ps: a loaded model stays until the server stops (Ollama's keep_alive: -1)


@dataclass(frozen=True)
class ListedModel:
    """One model as Ollama's listings show it (None: not known)."""

    name: str
    size: int
    digest: str  # the model file's sha256 (hex), or "" when never hashed (a local file served as given)
    modified_at: str  # ISO 8601
    family: str | None = None  # general.architecture
    parameter_count: int | None = None
    quantization: str | None = None
    context_length: int | None = None
    path: Path | None = None
    served: bool = False  # a request naming it is answered by this server
    aliases: tuple[str, ...] = field(default=(), compare=False)  # other names that reach it
    vision: bool = False  # installed with a projector: takes images

    def details(self) -> dict[str, Any]:
        return {
            "parent_model": "",
            "format": "gguf",
            "family": self.family or "",
            "families": [self.family] if self.family else None,
            "parameter_size": parameter_size(self.parameter_count),
            "quantization_level": self.quantization or "",
        }

    def tag(self) -> dict[str, Any]:
        """An entry of ``/api/tags``; ``localinfer.served``: whether this server answers it now."""
        return {"name": self.name, "model": self.name, "modified_at": self.modified_at, "size": self.size,
                "digest": self.digest, "details": self.details(), "localinfer": {"served": self.served}}  # fmt: skip


def parameter_size(n: int | None) -> str:
    """Ollama's way of writing a parameter count: ``135M``, ``7.6B``."""
    if not n:
        return ""
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _iso(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _installed(entry: dict[str, Any], path: Path) -> ListedModel:
    header = entry.get("header") or {}
    files = entry.get("files") or []
    return ListedModel(
        name=entry["name"], size=int(entry.get("size") or 0), digest=files[0]["sha256"] if files else "",
        modified_at=entry.get("added_at") or "", family=header.get("architecture"),
        parameter_count=header.get("parameter_count"), quantization=entry.get("quant") or header.get("quantization"),
        context_length=header.get("context_length"), path=path, vision=bool(entry.get("mmproj")),
    )  # fmt: skip


def _of_loaded(loaded: LoadedModel, names: tuple[str, ...]) -> ListedModel:
    resolved = loaded.resolved
    info = resolved.info if resolved is not None else None
    path = Path(resolved.path) if resolved is not None else None
    try:
        mtime = path.stat().st_mtime if path is not None else 0.0
    except OSError:
        mtime = 0.0
    return ListedModel(
        name=names[0], size=info.file_size if info else 0, digest=(resolved.sha256 or "") if resolved else "",
        modified_at=_iso(mtime), family=info.architecture if info else None,
        parameter_count=info.parameter_count if info else None, quantization=info.quantization if info else None,
        context_length=info.context_length if info else None, path=path, served=True, aliases=names[1:],
    )  # fmt: skip


def catalog(loaded: LoadedModel | None, names: tuple[str, ...], *, on_demand: bool = False) -> list[ListedModel]:
    """The installed models, and the loaded one first (as the store names it when it is installed,
    else by the server's name for it). ``on_demand``: every installed model is served. Reads the
    manifest: call it off the event loop."""
    import dataclasses

    from localinfer.errors import LocalInferError
    from localinfer.store.manifest import Store

    store = Store()
    try:
        entries = store.entries()
    except (OSError, LocalInferError):  # an unreadable manifest: the loaded model is still listed
        entries = {}
    installed = [_installed(e, store.load_path(e)) for _n, e in sorted(entries.items())]
    if on_demand:
        installed = [dataclasses.replace(m, served=True) for m in installed]
    if loaded is None:
        return installed
    ours = _of_loaded(loaded, names)
    same = next((m for m in installed if m.name in names or (ours.digest and m.digest == ours.digest)), None)
    if same is not None:  # listed once, under the store's name, reachable by the server's names too
        installed.remove(same)
        ours = dataclasses.replace(same, served=True, aliases=tuple(n for n in names if n != same.name))
    return [ours, *installed]


def find(models: list[ListedModel], name: str) -> ListedModel | None:
    """The model ``name`` names: its name or an alias, with or without Ollama's ``:latest`` tag."""
    for wanted in (name, name.removesuffix(":latest")):
        for m in models:
            if wanted == m.name or wanted in m.aliases:
                return m
    return None


# -- /api/show: the header's facts and what the model can do --------------------------------------------
def capabilities(template: str | None, info: GGUFInfo | None, vision: bool = False) -> list[str]:
    """Ollama's capabilities: completion (every model), tools (its template renders them), thinking
    (its template writes reasoning markers), embedding (the GGUF names a pooling: an embedding model),
    vision (loaded with its projector)."""
    from localinfer.request import reasoning

    caps = ["completion"]
    if template and "tools" in template:
        caps.append("tools")
    if reasoning.detect(template) is not None:
        caps.append("thinking")
    arch = info.architecture if info is not None else None
    if info is not None and arch and info.metadata.get(f"{arch}.pooling_type") is not None:
        caps.append("embedding")
    if vision:
        caps.append("vision")
    return caps


def model_info(info: GGUFInfo | None, facts: ListedModel) -> dict[str, Any]:
    """The GGUF header's scalar keys (arrays such as the vocabulary and the template left out), with
    ``general.architecture``, ``general.parameter_count`` and ``<arch>.context_length`` always there."""
    out: dict[str, Any] = {}
    if info is not None:
        out = {k: v for k, v in info.metadata.items()
               if isinstance(v, (str, int, float, bool)) and k != "tokenizer.chat_template"}  # fmt: skip
    arch = facts.family or out.get("general.architecture")
    out["general.architecture"] = arch
    out["general.parameter_count"] = facts.parameter_count
    if arch:
        out[f"{arch}.context_length"] = facts.context_length
    return out


def show(facts: ListedModel, info: GGUFInfo | None, template: str | None, vision: bool = False) -> dict[str, Any]:
    """``/api/show``'s answer. ``info``: the model's header (None when it cannot be read)."""
    # Ollama's names its blob's path; ours would tell a client the user's home and store: the blob's name
    source = f"sha256-{facts.digest}" if facts.digest else facts.name
    return {
        "modelfile": f"# served by localinfer\nFROM {source}\n",
        "parameters": "",
        "template": template or "",
        "details": facts.details(),
        "model_info": model_info(info, facts),
        "capabilities": capabilities(template, info, vision),
        "modified_at": facts.modified_at,
    }


def header(facts: ListedModel) -> GGUFInfo | None:
    """The model file's header, read again (a model not loaded here); None when it cannot be read."""
    from localinfer.errors import LocalInferError
    from localinfer.gguf import parse_gguf

    if facts.path is None:
        return None
    try:
        return parse_gguf(facts.path)
    except (OSError, LocalInferError):
        return None


def running(facts: ListedModel, loaded: LoadedModel, n_ctx_seq: int) -> dict[str, Any]:
    """An entry of ``/api/ps``: the loaded model, its bytes in memory (all of llama.cpp's buffers as it
    reported them, else the file's size), those on a GPU, and one sequence's context."""
    buffers = loaded.buffers if loaded.buffers is not None and loaded.buffers.buffers else None  # None: none reported
    size = buffers.total() if buffers is not None else facts.size
    on_gpu = buffers.total(host=False) if buffers is not None else 0
    return {"name": facts.name, "model": facts.name, "size": size, "digest": facts.digest, "details": facts.details(),
            "expires_at": FOREVER, "size_vram": on_gpu, "context_length": n_ctx_seq}  # fmt: skip
