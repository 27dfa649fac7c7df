"""Friendly model names -> sources, from models.toml (packaged) layered with the user's own file.

The registry only knows *where* a model comes from; fetching, verifying and locating bytes on disk is
the store's job.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from localinfer.errors import ModelNotFoundError, UsageError

_MAX_NAME = 200
# name:tag, lowercase letters, digits, dot, dash, underscore; no path separators, no "..".
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*(:[a-z0-9][a-z0-9._-]*)?$")


@dataclass(frozen=True)
class RegistryEntry:
    """One named model and where its bytes come from."""

    name: str
    repo: str | None = None
    file: str | None = None
    revision: str | None = None
    sha256: str | None = None
    package: str | None = None
    package_file: str | None = None
    package_assemble: bool = False
    chat_format: str | None = None
    description: str = ""
    size: int | None = None  # the download's bytes, for `list --available`
    mmproj: str | None = None  # the projector (images in): a file in ``repo``, or "auto"


def _load_toml(path: Path) -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10
        import tomli as tomllib
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}", hint="fix or remove that file") from None


def _packaged_registry_path() -> Path:
    return Path(__file__).parent.parent / "models.toml"  # the package's own: src/localinfer/models.toml


def validate_name(name: str) -> str:
    """Check a registry name's shape before it is used anywhere (no separators, no '..')."""
    if not name or len(name) > _MAX_NAME or ".." in name or not _NAME_RE.match(name):
        raise UsageError(
            f"invalid model name {name!r}",
            hint="names look like 'family:size' (lowercase letters, digits, '.', '-', '_')",
        )
    return name


@dataclass(frozen=True)
class Registry:
    """The merged registry: packaged models.toml, then the user's file on top."""

    entries: dict[str, RegistryEntry]
    default: str

    def get(self, name: str) -> RegistryEntry:
        try:
            return self.entries[name]
        except KeyError:
            from localinfer.fuzzy import did_you_mean, rank

            family = rank(name, sorted(n for n in self.entries if n.split(":")[0] == name.split(":")[0]))
            hint = (f"did you mean {', '.join(family)}?" if family else did_you_mean(name, self.entries)) or (
                "run 'localinfer list --available' to see known names, or give a path to a .gguf file"
            )
            raise ModelNotFoundError(f"unknown model {name!r}", hint=hint) from None

    def __contains__(self, name: str) -> bool:
        return name in self.entries


_FIELDS = {f for f in RegistryEntry.__dataclass_fields__ if f != "name"}
_SOURCE = {"repo", "file", "package", "package_file"}  # a table naming one of these brings its own source


def _entries_from(data: dict, origin: Path, under: dict[str, RegistryEntry] | None = None) -> dict[str, RegistryEntry]:
    """The tables of ``data``; a table for a name in ``under`` that names no source refines that
    entry (a ``chat_format`` or ``description`` for a packaged model), one that does replaces it (its
    digest, package and size belong to the old source)."""
    out: dict[str, RegistryEntry] = {}
    for name, table in (data.get("models") or {}).items():
        validate_name(name)
        if not isinstance(table, dict):
            raise UsageError(f"{origin}: models.{name!r} must be a table")
        unknown = set(table) - _FIELDS
        if unknown:
            raise UsageError(f"{origin}: models.{name!r} has unknown keys: {', '.join(sorted(unknown))}")
        base = (under or {}).get(name)
        if base is not None and not _SOURCE & set(table):
            table = {**{f: getattr(base, f) for f in _FIELDS}, **table}
        if not ((table.get("repo") and table.get("file")) or (table.get("package") and table.get("package_file"))):
            raise UsageError(f"{origin}: models.{name!r} names no source",
                             hint="give repo and file (a Hugging Face GGUF), or package and package_file")  # fmt: skip
        out[name] = RegistryEntry(name=name, **table)
    return out


def load_registry(user_file: Path | None = None) -> Registry:
    """Read the packaged registry and layer the user's models.toml (if any) on top."""
    base = _load_toml(_packaged_registry_path())
    entries = _entries_from(base, _packaged_registry_path())
    default = base.get("default", "smollm2:135m")
    if user_file is None:
        from localinfer.paths import config_dir

        user_file = config_dir() / "models.toml"
    if user_file.is_file():
        user = _load_toml(user_file)
        entries.update(_entries_from(user, user_file, under=entries))
        default = user.get("default", default)
    return Registry(entries=entries, default=default)
