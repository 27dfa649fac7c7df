"""Turning messages into a prompt: the GGUF's own chat template, rendered only in a sandbox.

llama-cpp-python's Jinja2ChatFormatter renders in jinja2's ImmutableSandboxedEnvironment; a template
that reaches for Python internals (``cycler.__init__.__globals__``...) raises a SecurityError, which
we turn into a clear refusal. A model without a template uses the registry's ``chat_format`` (one of
llama-cpp-python's named formats) or, failing that, plain completion.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from localinfer.errors import InvalidModelError, UsageError


class TemplateRefusedError(InvalidModelError):
    """The model's chat template tried something the sandbox forbids, or is broken."""


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

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True) -> ChatPrompt:
        from localinfer.engine.bindings import chat_format

        llama_chat_format = chat_format()
        if self.template is not None:
            import jinja2

            try:
                formatter = _jinja_formatter(self.template, self.eos_text, self.bos_text, add_generation_prompt)
                result = formatter(messages=messages)
            except jinja2.exceptions.SecurityError as exc:
                raise TemplateRefusedError(
                    f"the model's chat template was refused by the sandbox: {exc}",
                    hint="this GGUF's template tries to reach Python internals; do not trust this file",
                ) from None
            except jinja2.exceptions.TemplateError as exc:
                raise TemplateRefusedError(
                    f"the model's chat template failed: {exc}",
                    hint="use --raw for plain completion",
                ) from None
            except ValueError as exc:  # the template's own raise_exception(): it rejects these messages
                raise UsageError(
                    f"the model's chat template rejected the conversation: {exc}",
                    hint="check the roles (system/user/assistant alternate), or use --raw",
                ) from None
            stops = tuple(s for s in ([result.stop] if isinstance(result.stop, str) else (result.stop or [])) if s)
            return ChatPrompt(result.prompt, stops, add_special=not result.added_special)
        name = (self.format_name or "").replace("-", "_").replace(".", "_")
        fn = getattr(llama_chat_format, f"format_{name}", None)
        if fn is None:
            raise UsageError(f"unknown chat format {self.format_name!r}")
        result = fn(messages=messages)
        stops = tuple(s for s in ([result.stop] if isinstance(result.stop, str) else (result.stop or [])) if s)
        return ChatPrompt(result.prompt, stops, add_special=not result.added_special)


@functools.lru_cache(maxsize=8)
def _jinja_formatter(template: str, eos_text: str, bos_text: str, add_generation_prompt: bool):  # noqa: ANN202
    """llama-cpp-python's formatter for a template, compiled once (~2-3 ms) rather than at every chat
    turn; it keeps no state between renders."""
    from localinfer.engine.bindings import chat_format

    return chat_format().Jinja2ChatFormatter(
        template=template, eos_token=eos_text, bos_token=bos_text, add_generation_prompt=add_generation_prompt
    )


def known_chat_formats() -> list[str]:
    from localinfer.engine.bindings import chat_format

    llama_chat_format = chat_format()
    return sorted(n[len("format_") :] for n in dir(llama_chat_format) if n.startswith("format_"))
