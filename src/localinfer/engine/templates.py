"""Turning messages into a prompt: the GGUF's own chat template, rendered only in a sandbox.

Templates are rendered in jinja2's ``ImmutableSandboxedEnvironment`` (as llama.cpp's and
llama-cpp-python's are, with the same globals): a template that reaches for Python internals
(``cycler.__init__.__globals__``...) raises a SecurityError, which we turn into a clear refusal.
A template is also bounded: in the loops it can run, the strings it can build and write, and the
time it can take. A model without a template uses the registry's ``chat_format`` (one of
llama-cpp-python's named formats) or, failing that, plain completion.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from localinfer.errors import InvalidModelError, LocalInferError, UsageError
from localinfer.request.rules import TEMPLATE_OWN

# Bounds on one render, far above what any real template needs for a long conversation.
MAX_RANGE_ITEMS = 1_000_000  # range() items over a whole render (a loop over messages needs none)
MAX_OUTPUT_CHARS = 64 * 1024 * 1024  # what it may write, and the longest string it may build
MAX_RENDER_S = 5.0


class TemplateRefusedError(InvalidModelError):
    """The model's chat template tried something the sandbox forbids, exceeded its bounds, or is broken."""


class _Budget:
    """What one render has left; the sandbox's hooks spend it."""

    def __init__(self, input_chars: int) -> None:
        self.range_items = MAX_RANGE_ITEMS
        self.chars = MAX_OUTPUT_CHARS + 2 * input_chars  # room for the conversation itself
        self.deadline = time.monotonic() + MAX_RENDER_S

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise _Exceeded(f"rendering took over {MAX_RENDER_S:g} s")


class _Exceeded(Exception):
    pass


_BUDGET = "_localinfer_budget"  # the render's _Budget, passed in its context (renders may run on several threads)
# What a render sets itself; a template variable (chat_template_kwargs) cannot replace these
RESERVED = frozenset({*TEMPLATE_OWN, _BUDGET})


@functools.lru_cache(maxsize=1)
def _environment_class() -> type:
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class IgnoreGenerationTags(jinja2.ext.Extension):
        """Hugging Face's ``{% generation %}`` tag passes its body through (as transformers does)."""

        tags = {"generation"}

        def parse(self, parser):
            parser.stream.skip(1)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+"})
        extension_classes = (IgnoreGenerationTags, jinja2.ext.loopcontrols)

        def call_binop(self, context, operator, left, right):
            budget = context.get(_BUDGET)
            if isinstance(budget, _Budget):
                budget.check_time()
                if operator == "**" and isinstance(right, int) and abs(right) > 1024:
                    raise _Exceeded("an exponent over 1024")
                seqs = (str, list, tuple)
                if operator == "*" and isinstance(left, seqs) != isinstance(right, seqs):
                    seq, times = (left, right) if isinstance(left, seqs) else (right, left)
                    if isinstance(times, int) and len(seq) * times > budget.chars:
                        raise _Exceeded("a string or list longer than the render's limit")
            return super().call_binop(context, operator, left, right)

    return BoundedSandbox


def _bounded_range(context: Any, *args: int) -> range:
    """range(), counted against the render's budget: nested loops cannot run without end."""
    r = range(*args)
    budget = context.get(_BUDGET)
    if isinstance(budget, _Budget):
        budget.range_items -= len(r)
        budget.check_time()
        if budget.range_items < 0:
            raise _Exceeded(f"loops over more than {MAX_RANGE_ITEMS:,} range() items")
    return r


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise ValueError(message)


# Bumped when the sandbox (its class, hooks or extensions) changes what a template compiles to.
_SANDBOX_VERSION = "1"


@functools.lru_cache(maxsize=8)
def _compile(template: str) -> Any:
    """The template compiled once per process, not at every chat turn; its code is kept in the data
    folder (jinja2's bytecode cache), so a later process skips the compile (~4-6 ms of each start)."""
    import hashlib

    import jinja2

    cls = _environment_class()
    # The name keys the cached code: the template's text, this sandbox, jinja2's version.
    name = hashlib.sha256(f"{_SANDBOX_VERSION}\0{jinja2.__version__}\0{template}".encode()).hexdigest()
    env = cls(loader=jinja2.DictLoader({name: template}), bytecode_cache=_bytecode_cache(), trim_blocks=True,
              lstrip_blocks=True, extensions=cls.extension_classes)  # fmt: skip
    env.filters["tojson"] = _tojson
    env.globals["range"] = jinja2.pass_context(_bounded_range)
    return env.get_template(name)


def _bytecode_cache() -> Any:
    """A bytecode cache in ``<data>/cache/templates``, or None where that folder cannot be made: a
    cache that cannot be read or written is a compile, never an error."""
    from localinfer import paths

    try:
        folder = paths.data_dir() / "cache" / "templates"
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except (OSError, LocalInferError):
        return None
    return _lenient_cache_class()(str(folder))


@functools.lru_cache(maxsize=1)
def _lenient_cache_class() -> type:
    from jinja2.bccache import FileSystemBytecodeCache

    class LenientCache(FileSystemBytecodeCache):
        def load_bytecode(self, bucket: Any) -> None:
            try:
                super().load_bytecode(bucket)
            except Exception:  # a damaged or foreign file (pickle, marshal errors): compile again
                bucket.reset()

        def dump_bytecode(self, bucket: Any) -> None:
            try:
                super().dump_bytecode(bucket)
            except OSError:
                pass

    return LenientCache


_BROKEN_HINT = "the file is broken: get it from another source, or convert it again with current llama.cpp tools"


def compile_template(template: str) -> Any:
    """``template`` compiled in the sandbox; TemplateRefusedError (exit 4: the file is broken) when
    it does not compile. Checked when a model is installed or first used, not at its first chat."""
    import jinja2

    try:
        return _compile(template)
    except jinja2.exceptions.TemplateSyntaxError as exc:  # TemplateAssertionError too: an unknown filter
        where = f" (line {exc.lineno})" if exc.lineno else ""
        raise TemplateRefusedError(
            f"the model's chat template does not compile: {exc.message or type(exc).__name__}{where}",
            hint=_BROKEN_HINT,
        ) from None
    except (jinja2.exceptions.TemplateError, RecursionError, MemoryError) as exc:
        raise TemplateRefusedError(
            f"the model's chat template does not compile: {type(exc).__name__}: {exc}",
            hint=_BROKEN_HINT,
        ) from None


def render_template(template: str, messages: list[dict[str, Any]], **variables: Any) -> str:
    """``template`` rendered with ``messages`` and ``variables``, within the bounds above."""
    import jinja2

    clash = sorted(RESERVED & set(variables) - {"add_generation_prompt"})
    if clash:
        raise UsageError(f"the template variable {clash[0]!r} is set by the render itself")
    compiled = compile_template(template)
    budget = _Budget(sum(len(str(m.get("content") or "")) for m in messages))
    out: list[str] = []
    try:
        for piece in compiled.generate(
            messages=messages, raise_exception=_raise_exception,
            strftime_now=lambda f: datetime.now().strftime(f), **{_BUDGET: budget}, **variables,
        ):  # fmt: skip
            budget.chars -= len(piece)
            if budget.chars < 0:
                raise _Exceeded("its output is longer than the render's limit")
            budget.check_time()
            out.append(piece)
    except jinja2.exceptions.SecurityError as exc:
        raise TemplateRefusedError(
            f"the model's chat template was refused by the sandbox: {exc}",
            hint="this GGUF's template tries to reach Python internals; do not trust this file",
        ) from None
    except (_Exceeded, RecursionError, MemoryError, OverflowError) as exc:
        why = "it recurses without end" if isinstance(exc, RecursionError) else str(exc) or type(exc).__name__
        raise TemplateRefusedError(
            f"the model's chat template was stopped: {why}",
            hint="this GGUF's template does not end in reasonable time or size; use --raw, or another file",
        ) from None
    except jinja2.exceptions.TemplateError as exc:
        raise TemplateRefusedError(f"the model's chat template failed: {exc}", hint="use --raw for plain completion") from None
    except ValueError as exc:  # the template's own raise_exception(): it rejects these messages
        raise UsageError(
            f"the model's chat template rejected the conversation: {exc}",
            hint="check the roles (system/user/assistant alternate), or use --raw",
        ) from None
    return "".join(out)


@dataclass(frozen=True)
class ChatPrompt:
    text: str
    stop: tuple[str, ...]
    add_special: bool  # whether tokenization should add BOS (False when the template already did)


@dataclass(frozen=True)
class ChatTemplate:
    """How one model formats a conversation: a Jinja template or a named llama-cpp-python format."""

    source: str  # "gguf" | "registry:<format>"
    template: str | None = None
    format_name: str | None = None
    bos_text: str = ""
    eos_text: str = ""

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True, **variables: Any) -> ChatPrompt:
        """``variables``: the template's own (``chat_template_kwargs``: ``enable_thinking``,
        ``reasoning_effort``; ``tools``), as transformers' ``apply_chat_template`` passes them; they
        may not replace the names the render sets (RESERVED). A named format ignores them.

        A system message after the first other turn is rendered where it was sent when the template
        takes it there; one that refuses it ("system message must be first") or leaves its text out
        gets it as a user turn's text, joined to the user turns beside it (``later_systems_as_user``):
        what was sent before it renders as it did, so the prompt of a session's next turn still
        starts with the last one's (a cached prefix)."""
        later = _later_systems(messages)
        try:
            prompt = self._render(messages, add_generation_prompt, variables)
        except UsageError:
            if not later:
                raise
            return self._render(later_systems_as_user(messages), add_generation_prompt, variables)
        if later and not all(text in prompt.text for text in later):
            return self._render(later_systems_as_user(messages), add_generation_prompt, variables)
        return prompt

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool, variables: dict[str, Any]) -> ChatPrompt:
        if self.template is not None:
            text = render_template(
                self.template, messages, **{"eos_token": self.eos_text, "bos_token": self.bos_text, **variables},
                add_generation_prompt=add_generation_prompt,
            )  # fmt: skip
            # The template writes BOS itself where it wants one (llama-cpp-python: added_special).
            return ChatPrompt(text, (self.eos_text,) if self.eos_text else (), add_special=False)
        fn = getattr(_named_formats(), _FORMAT_FUNCS.get(self.format_name or "", f"format_{_format_key(self.format_name)}"), None)
        if fn is None:
            raise UsageError(f"unknown chat format {self.format_name!r}")
        # A named format reads only string contents of three roles (it drops the rest), takes the first
        # system turn alone at the top, or none (gemma's): parts become their texts, a later system turn
        # is user text where it was sent, the leading ones one system turn, or the first user turn's start
        messages = [_named_turn(m) for m in messages]
        messages = _leading_system_as_one(later_systems_as_user(messages))
        result = fn(messages=messages)
        if messages and messages[0].get("role") == "system" and (messages[0].get("content") or "").strip() not in result.prompt:
            messages = _systems_into_first_user(messages)
            result = fn(messages=messages)
        if any(m.get("content") and m["content"].strip() not in result.prompt for m in messages):
            raise UsageError(f"the chat format {self.format_name!r} leaves a turn out of the prompt",
                             hint="name another chat_format for this model in models.toml")  # fmt: skip
        stops = tuple(s for s in ([result.stop] if isinstance(result.stop, str) else (result.stop or [])) if s)
        return ChatPrompt(result.prompt, stops, add_special=not result.added_special)


def _first_other(messages: list[dict[str, Any]]) -> int:
    """The index of the first message that is not a system one (``len`` when there is none)."""
    return next((i for i, m in enumerate(messages) if m.get("role") != "system"), len(messages))


def _later_systems(messages: list[dict[str, Any]]) -> list[str]:
    """The texts of the system messages after the first message of another role."""
    first = _first_other(messages)
    return [m["content"].strip() for m in messages[first:] if m.get("role") == "system" and isinstance(m.get("content"), str)]


def later_systems_as_user(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with each system message after the first other turn made a user turn's text,
    joined with a user turn just before or after it (roles still alternate, as templates check)."""
    first = _first_other(messages)
    out: list[dict[str, Any]] = list(messages[:first])
    joinable = False  # the last turn of ``out`` holds a moved system text: the next user turn joins it
    for m in messages[first:]:
        moved = m.get("role") == "system"
        if moved:
            m = {**m, "role": "user"}
        if out and (moved or joinable) and m.get("role") == "user" and out[-1].get("role") == "user":
            out[-1] = {**out[-1], "content": _joined(out[-1].get("content"), m.get("content"))}
        else:
            out.append(m)
        joinable = moved
    return out


def _joined(a: Any, b: Any) -> Any:
    """Two turns' contents as one: strings joined by a blank line, else lists of parts one after the other."""
    if isinstance(a, str) and isinstance(b, str):
        return f"{a}\n\n{b}" if a and b else a or b
    parts = [p for c in (a, b) for p in ([{"type": "text", "text": c}] if isinstance(c, str) else c or [])]
    return parts


def _named_turn(m: dict[str, Any]) -> dict[str, Any]:
    """A turn as named formats take it: a string content; a developer turn is a system one, a tool
    result (sent without tools to describe) a user one."""
    role = m.get("role")
    if role not in ("system", "user", "assistant"):
        m = {**m, "role": "system" if role == "developer" else "user"}
    return m if isinstance(m.get("content"), str | None) else {**m, "content": _parts_text(m["content"])}


def _parts_text(content: Any) -> str:
    """A list of content parts as one string: its texts one after the other, as templates write them."""
    return "".join(p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type") == "text")


def _leading_system_as_one(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    first = _first_other(messages)
    if first < 2:
        return messages
    return [{"role": "system", "content": "\n\n".join(m["content"] for m in messages[:first] if m.get("content"))}, *messages[first:]]


def _systems_into_first_user(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The leading system turn's text (``_leading_system_as_one``'s one) put before the first user
    turn's (Gemma's own template does so)."""
    text, rest = messages[0].get("content") or "", messages[1:]
    if rest and rest[0].get("role") == "user":
        return [{**rest[0], "content": _joined(text, rest[0].get("content"))}, *rest[1:]]
    return [{"role": "user", "content": text}, *rest]


# llama-cpp-python's registered names whose formatter is not format_<name> (``register_chat_format``)
_FORMAT_FUNCS = {"llama-2": "format_llama2", "llama-3": "format_llama3", "baichuan-2": "format_baichuan2", "vicuna": "format"}


def _format_key(name: str | None) -> str:
    return (name or "").replace("-", "_").replace(".", "_")


def _named_formats() -> Any:
    """llama-cpp-python's named chat formats (a registry entry's ``chat_format``, for a GGUF without
    a template): the whole package is imported only here."""
    from llama_cpp import llama_chat_format

    from localinfer.engine.backend import reclaim_log

    reclaim_log()  # the package's import took llama.cpp's log over
    return llama_chat_format
