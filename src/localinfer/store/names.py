"""What a user may type as a model, parsed and validated before any I/O touches the store or the network.

Kinds of spec:

* ``name``      a registry name or a ``--name`` alias: ``smollm2:135m`` (see :func:`registry.validate_name`)
* ``hub_quant`` ``owner/repo`` or ``owner/repo:QUANT`` (default quant Q4_K_M), optional ``@revision``
* ``hub_file``  ``owner/repo/path/file.gguf`` or ``hf://owner/repo/path/file.gguf``, optional ``@revision``
* ``path``      a local file: starts with ``./ ../ ~ /``, or contains a separator / ends in ``.gguf`` and exists
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from localinfer.errors import ModelNotFoundError, UsageError

DEFAULT_QUANT = "Q4_K_M"
MAX_SPEC = 512
MAX_SEGMENT = 255

_REPO_PART = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$")
_QUANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Hub file names: anything printable except separators that could escape a folder or confuse a shell.
_FILE_SEGMENT = re.compile(r"^[A-Za-z0-9_.+()\[\] ,=@-]+$")
SPLIT_RE = re.compile(r"^(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
# A quantization tag inside a file name: Q4_K_M, IQ4_XS, Q8_0, Q4_0_4_4, F16, BF16...
_QUANT_IN_NAME = re.compile(
    r"(?<![A-Za-z0-9])(I?Q[0-9]+(?:_[A-Za-z0-9]+)*|BF16|FP16|FP32|F16|F32)(?![A-Za-z0-9])", re.IGNORECASE
)


@dataclass(frozen=True)
class ModelSpec:
    kind: str  # "name" | "hub_quant" | "hub_file" | "path"
    raw: str
    name: str  # the key the model is known by in the manifest
    repo: str | None = None
    quant: str | None = None
    filename: str | None = None
    revision: str | None = None
    path: Path | None = None

    @property
    def is_hub(self) -> bool:
        return self.kind in ("hub_quant", "hub_file")


def _bad(spec: str, why: str, hint: str | None = None) -> UsageError:
    return UsageError(
        f"invalid model name {spec[:80]!r}{'...' if len(spec) > 80 else ''}: {why}",
        hint=hint or "use a registry name (smollm2:135m), owner/repo[:QUANT], owner/repo/file.gguf or a path",
    )


def validate_repo_id(repo: str, spec: str | None = None) -> str:
    parts = repo.split("/")
    if len(parts) != 2 or not all(_REPO_PART.fullmatch(p) for p in parts) or ".." in repo:
        raise _bad(spec or repo, f"{repo!r} is not a Hugging Face repository id (owner/name)")
    return repo


def validate_revision(revision: str, spec: str | None = None) -> str:
    if not _REVISION.fullmatch(revision) or ".." in revision or "//" in revision or revision.endswith("/"):
        raise _bad(spec or revision, f"invalid revision {revision!r}")
    return revision


def validate_quant(quant: str, spec: str | None = None) -> str:
    if not _QUANT.fullmatch(quant) or ".." in quant:
        raise _bad(spec or quant, f"invalid quantization tag {quant!r}", hint="quant tags look like Q4_K_M, Q8_0, IQ4_XS, F16")
    return quant.upper()


def validate_hub_filename(filename: str, *, source: str = "name") -> str:
    """A file path inside a Hub repository: relative, no '..', no odd characters, ends in .gguf.

    ``source`` says where the name came from ("name" typed by the user, "hub" listed by the Hub), for the message.
    """
    reason = None
    if not filename or len(filename) > MAX_SPEC:
        reason = "empty or too long"
    elif _CONTROL.search(filename) or "\\" in filename:
        reason = "control characters or backslashes"
    elif filename.startswith("/"):
        reason = "absolute path"
    else:
        for seg in filename.split("/"):
            if seg in ("", ".", "..") or len(seg) > MAX_SEGMENT or not _FILE_SEGMENT.fullmatch(seg):
                reason = f"bad path segment {seg[:40]!r}"
                break
        else:
            if not filename.lower().endswith(".gguf"):
                reason = "not a .gguf file"
    if reason:
        if source == "hub":  # the listing is refused whole, like any other malformed value from the Hub
            from localinfer.errors import NetworkError
            from localinfer.store.untrusted import REFUSED_HINT

            raise NetworkError(
                f"the Hub listed an unsafe or unexpected file name {filename[:80]!r} ({reason})", hint=REFUSED_HINT
            )
        raise _bad(filename, f"file name {filename[:80]!r}: {reason}")
    return filename


def looks_like_path(spec: str) -> bool:
    """True when the spec must be a local file path (whether or not it exists)."""
    if spec.startswith(("./", "../", "~", "/")) or spec in (".", ".."):
        return True
    if os.sep != "/" and (os.sep in spec or spec.startswith(".\\")):
        return True
    if ("/" in spec or spec.lower().endswith(".gguf")) and Path(spec).expanduser().exists():
        return True
    return False


def _split_revision(body: str, spec: str) -> tuple[str, str | None]:
    if "@" not in body:
        return body, None
    body, revision = body.rsplit("@", 1)
    return body, validate_revision(revision, spec)


def parse_spec(spec: str) -> ModelSpec:
    """Classify and validate what the user typed. Only ``path`` specs touch the disk (an existence check)."""
    if not isinstance(spec, str) or not spec:
        raise _bad(str(spec), "empty")
    if len(spec) > MAX_SPEC:
        raise _bad(spec, f"longer than {MAX_SPEC} characters")
    if _CONTROL.search(spec):
        raise _bad(spec, "control characters")

    if spec.startswith("hf://"):
        body, revision = _split_revision(spec[len("hf://") :], spec)
        parts = body.split("/")
        if len(parts) == 2:
            return _hub_quant(spec, body, revision)
        if len(parts) < 3:
            raise _bad(spec, "hf:// needs owner/repo/file.gguf")
        return _hub_file(spec, "/".join(parts[:2]), "/".join(parts[2:]), revision)

    if looks_like_path(spec):
        path = Path(spec).expanduser()
        return ModelSpec(kind="path", raw=spec, name=spec, path=path)

    if "/" in spec:
        body, revision = _split_revision(spec, spec)
        parts = body.split("/")
        if len(parts) == 2 and parts[1].lower().endswith(".gguf") and ":" not in parts[1]:
            # "dir/file.gguf" that does not exist: a missing local file, not a repository.
            raise ModelNotFoundError(f"no such file: {spec}", hint="check the path; Hub files are owner/repo/file.gguf")
        if len(parts) == 2:
            return _hub_quant(spec, body, revision)
        return _hub_file(spec, "/".join(parts[:2]), "/".join(parts[2:]), revision)

    from localinfer.store.registry import validate_name

    if spec.lower().endswith(".gguf"):
        raise ModelNotFoundError(f"no such file: {spec}", hint="check the path, or give a registry name")
    name = spec.lower()  # registry names are lowercase: `Smollm2:135M` can only mean one
    validate_name(name)
    return ModelSpec(kind="name", raw=name, name=name)


def _hub_quant(spec: str, body: str, revision: str | None) -> ModelSpec:
    repo, _, quant = body.partition(":")
    validate_repo_id(repo, spec)
    if ":" in body and not quant:
        raise _bad(spec, "empty quantization tag after ':'")
    quant = validate_quant(quant, spec) if quant else DEFAULT_QUANT
    name = f"{repo}:{quant}" + (f"@{revision}" if revision else "")
    return ModelSpec(kind="hub_quant", raw=spec, name=name, repo=repo, quant=quant, revision=revision)


def _hub_file(spec: str, repo: str, filename: str, revision: str | None) -> ModelSpec:
    validate_repo_id(repo, spec)
    validate_hub_filename(filename)
    name = f"{repo}/{filename}" + (f"@{revision}" if revision else "")
    return ModelSpec(kind="hub_file", raw=spec, name=name, repo=repo, filename=filename, revision=revision)


def quant_of(filename: str) -> str | None:
    """The quantization tag a GGUF file name carries (last one wins), upper-cased; None when there is none."""
    base = filename.rsplit("/", 1)[-1]
    m = SPLIT_RE.match(base)
    stem = m.group("prefix") if m else re.sub(r"\.gguf$", "", base, flags=re.IGNORECASE)
    found = _QUANT_IN_NAME.findall(stem)
    return found[-1].upper() if found else None


def split_info(filename: str) -> tuple[str, int, int] | None:
    """(prefix, index, count) for ``name-00001-of-00003.gguf``; None for a single file."""
    base = filename.rsplit("/", 1)[-1]
    m = SPLIT_RE.match(base)
    if not m:
        return None
    directory = filename[: len(filename) - len(base)]
    return directory + m.group("prefix"), int(m.group("index")), int(m.group("count"))


def split_names(filename: str) -> list[str]:
    """All shard names of the split model whose first (or any) shard is ``filename``; [filename] if not split."""
    info = split_info(filename)
    if info is None:
        return [filename]
    prefix, _index, count = info
    if count < 1 or count > 999:
        raise _bad(filename, f"implausible split count {count}")
    return [f"{prefix}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def alias_name(name: str) -> str:
    """A ``--name`` the user wants to give a model: same shape as registry names."""
    from localinfer.store.registry import validate_name

    return validate_name(name)
