"""Benchmarks of a model: llama-bench's method, and several sequences in parallel."""
