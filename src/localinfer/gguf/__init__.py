"""GGUF model files, read without llama.cpp: the header parser (:mod:`.parser`: is this a
well-formed GGUF?) and the file opening around it (:mod:`.reader`), the hyperparameter checks
(:mod:`.checks`: would llama.cpp abort on it?), and the ggml type table and result types
(:mod:`.types`). Stdlib only; importing it does no work.

:func:`read_gguf` (alias :func:`validate_gguf`) runs both before a file is installed or loaded.
"""

from localinfer.gguf.checks import check_hyperparameters, read_gguf, validate_gguf
from localinfer.gguf.reader import parse_gguf
from localinfer.gguf.types import (
    GGML_TYPES,
    LLAMA_FTYPE_NAMES,
    ArraySummary,
    GGUFInfo,
    TensorInfo,
    ggml_type_name,
    ggml_type_size,
)

__all__ = [
    "GGML_TYPES",
    "LLAMA_FTYPE_NAMES",
    "ArraySummary",
    "GGUFInfo",
    "TensorInfo",
    "check_hyperparameters",
    "ggml_type_name",
    "ggml_type_size",
    "parse_gguf",
    "read_gguf",
    "validate_gguf",
]
