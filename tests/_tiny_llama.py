"""The tiny Llama the generation and runner tests share (``from _tiny_llama import tiny_llama``; tests/
is on sys.path). initializer_range 0.2: at the default 0.02 a tiny model emits one token at every step,
and a loop of it would hide a broken cache from a token check."""

from __future__ import annotations

import torch


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2)
    return LlamaForCausalLM(cfg).eval()
