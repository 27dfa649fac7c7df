"""Ollama's API: its routes, its chat/generate wire, and the models it describes."""
