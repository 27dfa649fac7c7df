"""The fixed limits the GGUF parser (``parser.py``) holds every file to: real files sit far below
each of them; they exist so that a hostile file stays cheap to refuse (work and memory bounded)."""

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 1 << 20  # 1 MiB
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_TENSOR_NAME_BYTES = 63  # GGML_MAX_NAME is 64 including the terminating NUL
MAX_TENSOR_COUNT = 1 << 20  # the biggest real models have a few thousand
MAX_KV_COUNT = 1 << 16  # real files have tens to a few hundred
MAX_KEY_BYTES = 65535  # the spec's limit (2^16 - 1)
MAX_STRING_BYTES = 16 << 20  # one string value (chat templates are tens of KiB)
MAX_ARRAY_LENGTH = 1 << 26  # one array (the largest vocabularies are ~10^6 entries)
MAX_ARRAY_DEPTH = 2  # an array may hold arrays, which may not hold arrays
MAX_WALKED_ITEMS = 1 << 24  # strings/arrays stepped over in big arrays, whole file
MAX_NESTED_ARRAYS = 1 << 20  # arrays inside arrays, whole file (each costs a Python call)
MAX_DECODED_STRING_BYTES = 64 << 20  # strings decoded into Python str, whole file
MAX_KEPT_ITEMS = 1 << 20  # array items materialised as Python objects, whole file
SMALL_ARRAY = 64  # arrays up to this many items are kept as lists
MAX_KEPT_NUMERIC_ARRAY = 4096  # non-tokenizer numeric arrays (per-layer hyperparameters) up to this

# Smallest possible encodings, for "count x minimum size <= bytes left" checks.
MIN_KV_BYTES = 8 + 1 + 4 + 1  # key length, 1-byte key, value type, 1-byte value
MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8  # name length, 1-byte name, n_dims, ne0, type, offset
MIN_STRING_BYTES = 8
MIN_ARRAY_BYTES = 4 + 8
