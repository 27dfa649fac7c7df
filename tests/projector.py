"""A small CLIP projector GGUF for the vision tests, with seeded random weights (gguf-py writes it).

A LLaVA-style ``mlp`` projector: libmtmd supports it, it needs no marker tokens in the text model's
vocabulary, and its output width is ours to choose (576: SmolLM2-135M's embedding width). Images are
resized to ``image_size`` px and cut into ``patch`` px patches, so an image is
``(image_size // patch) ** 2`` tokens and encodes in milliseconds.

    write_projector(path)                 # SmolLM2's width
    write_projector(path, out_width=640)  # a projector that does not fit SmolLM2
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SMOLLM2_WIDTH = 576
IMAGE_SIZE, PATCH = 32, 8  # 16 image tokens
N_EMBD, N_HEAD, N_FF, N_LAYER = 64, 4, 128, 2


def image_tokens(image_size: int = IMAGE_SIZE, patch: int = PATCH) -> int:
    return (image_size // patch) ** 2


def write_projector(
    path: Path, *, out_width: int = SMOLLM2_WIDTH, seed: int = 41, image_size: int = IMAGE_SIZE, patch: int = PATCH,
    kind: str = "mlp",
) -> Path:
    """``kind``: "mlp" (LLaVA's), "idefics3" (SmolVLM's: its prompt needs marker tokens such as
    ``<fake_token_around_image>`` in the text model's vocabulary, which SmolLM2's lacks), or
    "qwen2vl_merger" (Qwen2-VL's: M-RoPE positions; for :func:`qwen2vl_text_model`)."""
    import gguf

    rng = np.random.default_rng(seed)

    def w(*shape: int, scale: float | None = None) -> np.ndarray:
        # numpy's (out, in) is ggml's ne = [in, out]; 1/sqrt(in) keeps activations near unit size
        s = scale if scale is not None else 1.0 / np.sqrt(shape[-1])
        return (rng.standard_normal(shape) * s).astype(np.float32)

    n_pos = (image_size // patch) ** 2
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_name("localinfer test projector")
    writer.add_string("clip.projector_type", kind)
    if kind == "idefics3":
        writer.add_uint32("clip.vision.projector.scale_factor", 2)
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.image_size", image_size)
    writer.add_uint32("clip.vision.patch_size", patch)
    writer.add_uint32("clip.vision.embedding_length", N_EMBD)
    writer.add_uint32("clip.vision.feed_forward_length", N_FF)
    writer.add_uint32("clip.vision.block_count", N_LAYER)
    writer.add_uint32("clip.vision.projection_dim", out_width)
    writer.add_uint32("clip.vision.attention.head_count", N_HEAD)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])

    tensors: dict[str, np.ndarray] = {
        "v.patch_embd.weight": w(N_EMBD, 3, patch, patch, scale=1.0 / np.sqrt(3 * patch * patch)),
        "v.position_embd.weight": w(n_pos, N_EMBD, scale=0.1),
        "v.pre_ln.weight": np.ones(N_EMBD, np.float32),
        "v.pre_ln.bias": np.zeros(N_EMBD, np.float32),
    }
    if kind == "qwen2vl_merger":  # two patch convolutions (a frame pair), M-RoPE in place of position embeddings
        tensors = {"v.patch_embd.weight": tensors["v.patch_embd.weight"],
                   "v.patch_embd.weight.1": w(N_EMBD, 3, patch, patch, scale=1.0 / np.sqrt(3 * patch * patch))}  # fmt: skip
    for il in range(N_LAYER):
        b = f"v.blk.{il}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors[f"{b}.{name}.weight"] = w(N_EMBD, N_EMBD)
            tensors[f"{b}.{name}.bias"] = np.zeros(N_EMBD, np.float32)
        for ln in ("ln1", "ln2"):
            tensors[f"{b}.{ln}.weight"] = np.ones(N_EMBD, np.float32)
            tensors[f"{b}.{ln}.bias"] = np.zeros(N_EMBD, np.float32)
        tensors[f"{b}.ffn_up.weight"] = w(N_FF, N_EMBD)
        tensors[f"{b}.ffn_up.bias"] = np.zeros(N_FF, np.float32)
        tensors[f"{b}.ffn_down.weight"] = w(N_EMBD, N_FF)
        tensors[f"{b}.ffn_down.bias"] = np.zeros(N_EMBD, np.float32)
    if kind == "idefics3":  # a 2x2 pixel shuffle, then one matrix
        tensors["mm.model.fc.weight"] = w(out_width, N_EMBD * 4)
        tensors["v.post_ln.weight"] = np.ones(N_EMBD, np.float32)
        tensors["v.post_ln.bias"] = np.zeros(N_EMBD, np.float32)
    elif kind == "qwen2vl_merger":  # 2x2 patches merged, then two matrices
        tensors["v.post_ln.weight"] = np.ones(N_EMBD, np.float32)
        tensors["v.post_ln.bias"] = np.zeros(N_EMBD, np.float32)
        tensors["mm.0.weight"] = w(N_EMBD * 4, N_EMBD * 4)
        tensors["mm.0.bias"] = np.zeros(N_EMBD * 4, np.float32)
        tensors["mm.2.weight"] = w(out_width, N_EMBD * 4)
        tensors["mm.2.bias"] = np.zeros(out_width, np.float32)
    else:
        tensors["mm.0.weight"] = w(out_width, N_EMBD)
        tensors["mm.0.bias"] = np.zeros(out_width, np.float32)
        tensors["mm.2.weight"] = w(out_width, out_width)
        tensors["mm.2.bias"] = np.zeros(out_width, np.float32)
    for name, data in tensors.items():
        writer.add_tensor(name, data)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def qwen2vl_text_model(src: Path, dst: Path, sections: tuple[int, int, int, int] = (8, 12, 12, 0)) -> Path:
    """SmolLM2's GGUF (``src``) as a ``qwen2vl`` text model: the same tensors and vocabulary, its keys
    renamed and M-RoPE sections added (summing to half its 64-wide heads). Its rotary layout is not
    the one it was trained with, so it talks nonsense - deterministic nonsense, which is what the
    tests need of a model that takes Qwen2-VL's positions."""
    import struct

    from ggufmutate import T_ARRAY, T_INT32, read_layout, write_layout

    layout = read_layout(src)
    kvs = []
    for key, vtype, raw in layout.kvs:
        if key == b"general.architecture":
            raw = struct.pack("<Q", 7) + b"qwen2vl"
        elif key.startswith(b"llama."):
            key = b"qwen2vl." + key[len(b"llama.") :]
        kvs.append((key, vtype, raw))
    kvs.append((b"qwen2vl.rope.dimension_sections", T_ARRAY, struct.pack("<IQ4i", T_INT32, 4, *sections)))
    layout.kvs = kvs
    return write_layout(layout, dst)


def png(seed: int, size: tuple[int, int] = (48, 40)) -> bytes:
    """A PNG of seeded noise (``size``: width, height)."""
    import io

    from PIL import Image

    arr = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3)).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def bomb_png(side: int = 20000) -> bytes:
    """A small PNG whose header says ``side`` x ``side`` pixels (a decompression bomb's shape)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    row = b"\x00" + b"\x00" * side  # one filter byte, then gray pixels
    body = zlib.compress(row * 64, 9)  # only the first rows: the header is what a bound must read
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", body) + chunk(b"IEND", b""))


def wide_png(width: int = 100000, height: int = 1) -> bytes:
    """A 1 x 100000 (by default) PNG: few pixels, absurd proportions."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height)).save(buf, "PNG")
    return buf.getvalue()
