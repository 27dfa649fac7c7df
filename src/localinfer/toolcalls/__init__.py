"""Tool calls, as OpenAI and llama-server define them: the tools a request offers and the choice it
makes (``spec``), how each model family writes a call and how the prompt offers the tools
(``families``), and the parser that turns the model's text into calls, streamed or whole (``parser``).

Plain Python, no llama_cpp: the guarantees (``required``, a named function) are a ``Format`` the
sampler chain enforces (``localinfer.structured``).
"""

from localinfer.toolcalls.spec import Tool, ToolCall, ToolChoice

__all__ = ["Tool", "ToolCall", "ToolChoice"]
