"""Sampling defaults (llama.cpp's), as plain values: `--help` shows them without building the
engine's option types (``sampling.SamplingOptions`` takes its defaults from here)."""

temperature = 0.8
top_k = 40
top_p = 0.95
min_p = 0.05
repeat_penalty = 1.0
repeat_last_n = 64
