"""The protocols serve speaks, each its parser and its writer side by side: OpenAI, Responses, Anthropic, Ollama, llama-server."""
