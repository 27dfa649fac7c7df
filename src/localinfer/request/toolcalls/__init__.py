"""Tool calls, as OpenAI and llama-server define them: the tools a request offers and the choice it
makes (``spec``), how each model family writes a call and how the prompt offers the tools
(``families``), and the parser that turns the model's text into calls, streamed or whole (``parser``).

Plain Python, no llama_cpp: the guarantees (``required``, a named function) are a ``Format`` the
sampler chain enforces (``localinfer.request.structured``).
"""

from typing import Any

__all__ = ["Tool", "ToolCall", "ToolChoice"]


def __getattr__(name: str) -> Any:
    """``Tool``, ``ToolCall``, ``ToolChoice`` from ``spec``, imported when asked for: a request without
    tools imports ``toolcalls.events`` alone (the answer's ``Text`` steps)."""
    if name in __all__:
        from localinfer.request.toolcalls import spec

        return getattr(spec, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
