"""A GGUF file of the demo's own making: a model's real metadata and tensor
layout at a real quantization, written with llama.cpp's ``gguf`` package.

Its tensor data is a hole (a sparse file): the file has the size a real
Q4_K_M conversion of the model has, so the planner reads the real weights
from it, while the disk holds only its header. The stand-in engine never
reads weights, so nothing needs them.
"""

from __future__ import annotations

from pathlib import Path

ALIGNMENT = 32  # GGUF's default general.alignment


def write_model_gguf(
    path: Path,
    *,
    arch: str,
    name: str,
    layers: int,
    heads: int,
    kv_heads: int,
    hidden: int,
    ffn: int,
    vocab: int,
    context: int,
) -> Path:
    """Write (once) a GGUF of a llama-architecture model at Q4_K, the output layer at Q6_K and the
    norms at F32, as llama.cpp's convert + llama-quantize Q4_K_M lays it out."""
    import gguf
    import numpy as np

    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    head_dim = hidden // heads
    q4, q6, f32 = (
        gguf.GGMLQuantizationType.Q4_K,
        gguf.GGMLQuantizationType.Q6_K,
        gguf.GGMLQuantizationType.F32,
    )

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    writer.add_block_count(layers)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_context_length(context)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    writer.add_token_list([f"<t{i}>" for i in range(vocab)])

    total = 0

    def tensor(tname: str, rows: int, cols: int, kind: gguf.GGMLQuantizationType) -> None:
        nonlocal total
        block, size = gguf.GGML_QUANT_SIZES[kind]
        per_row = cols // block * size
        nbytes = rows * per_row
        writer.add_tensor_info(tname, (rows, per_row), np.dtype(np.uint8), nbytes, raw_dtype=kind)
        total += -(-nbytes // ALIGNMENT) * ALIGNMENT

    def vector(tname: str, n: int) -> None:
        nonlocal total
        writer.add_tensor_info(tname, (n,), np.dtype(np.float32), n * 4, raw_dtype=f32)
        total += -(-(n * 4) // ALIGNMENT) * ALIGNMENT

    tensor("token_embd.weight", vocab, hidden, q4)
    for i in range(layers):
        vector(f"blk.{i}.attn_norm.weight", hidden)
        tensor(f"blk.{i}.attn_q.weight", hidden, hidden, q4)
        tensor(f"blk.{i}.attn_k.weight", kv_heads * head_dim, hidden, q4)
        tensor(f"blk.{i}.attn_v.weight", kv_heads * head_dim, hidden, q4)
        tensor(f"blk.{i}.attn_output.weight", hidden, hidden, q4)
        vector(f"blk.{i}.ffn_norm.weight", hidden)
        tensor(f"blk.{i}.ffn_gate.weight", ffn, hidden, q4)
        tensor(f"blk.{i}.ffn_up.weight", ffn, hidden, q4)
        tensor(f"blk.{i}.ffn_down.weight", hidden, ffn, q4)
    vector("output_norm.weight", hidden)
    tensor("output.weight", vocab, hidden, q6)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    start = -(-path.stat().st_size // ALIGNMENT) * ALIGNMENT
    with path.open("r+b") as handle:
        handle.truncate(start + total)  # the data section: a hole of its real size
    return path
