"""Tiny models for the real llama-server (tests/e2e/test_real_backends.py): a llama-architecture GGUF with
two layers of small random weights, on a real 32,000-token vocabulary (a vocabulary-only GGUF from
llama.cpp's sources). About 9 MB, written in a few seconds; nothing is downloaded. Its answers are noise,
but they are a real server's: loaded, tokenized, generated and streamed token by token."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

EMBEDDING, FEED_FORWARD, HEADS, BLOCKS = 64, 128, 4, 2


def write_tiny_model(vocabulary: Path, out: Path, *, seed: int, context: int) -> Path:
    """A model at ``out`` whose weights ``seed`` draws; ``context`` is its trained context length."""
    vocab = gguf.GGUFReader(vocabulary)
    writer = gguf.GGUFWriter(str(out), "llama")
    size = 0
    for field in vocab.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
        if field.name == "tokenizer.ggml.tokens":
            size = len(field.data)
    writer.add_vocab_size(size)
    writer.add_context_length(context)
    writer.add_embedding_length(EMBEDDING)
    writer.add_block_count(BLOCKS)
    writer.add_feed_forward_length(FEED_FORWARD)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_rope_dimension_count(EMBEDDING // HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    rng = np.random.default_rng(seed)

    def weights(*shape: int) -> np.ndarray:  # numpy's shape is ggml's reversed
        return (rng.standard_normal(shape) * 0.02).astype(np.float16)

    ones = np.ones(EMBEDDING, dtype=np.float32)
    writer.add_tensor("token_embd.weight", weights(size, EMBEDDING))
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", weights(size, EMBEDDING))
    for block in range(BLOCKS):
        name = f"blk.{block}."
        writer.add_tensor(name + "attn_norm.weight", ones)
        writer.add_tensor(name + "ffn_norm.weight", ones)
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{name}{part}.weight", weights(EMBEDDING, EMBEDDING))
        writer.add_tensor(name + "ffn_gate.weight", weights(FEED_FORWARD, EMBEDDING))
        writer.add_tensor(name + "ffn_up.weight", weights(FEED_FORWARD, EMBEDDING))
        writer.add_tensor(name + "ffn_down.weight", weights(EMBEDDING, FEED_FORWARD))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
