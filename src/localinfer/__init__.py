"""localinfer: local, on-device LLM inference from the command line."""

__version__ = "0.1.0"
