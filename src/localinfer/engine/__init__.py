"""llama.cpp, and the only package that imports `llama_cpp`: loading a model (`model.py`), sampling,
chat templates, continuous batching (`batch.py`), embeddings, constrained decoding, speculative
drafting, RPC devices; the plain values it takes and gives are in `types.py`."""
