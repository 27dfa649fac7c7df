"""One request through the engine: load a model, build the prompt, keep the context
window, stream (`run.py`), and finish the raw text once into an answer (`generate/finish.py`)."""
