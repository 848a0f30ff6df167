"""The tiny Qwen3-Next (a gated delta rule layer beside an attention layer: linear-attention conv and recurrent
states in its cache) that the static-step and onnxruntime-genai tests share (``from _tiny_hybrid import
tiny_qwen3_next``)."""

from __future__ import annotations

import torch


def tiny_qwen3_next(eos_token_id: int | None = None, **config_ids):
    """No end token unless ``eos_token_id``; ``config_ids``: other token ids of the config (bos_token_id)."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(0)
    config = Qwen3NextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_value_heads=2,
                             linear_num_key_heads=1, linear_key_head_dim=8, linear_value_head_dim=8,
                             linear_conv_kernel_dim=3, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
                             shared_expert_intermediate_size=16, layer_types=["linear_attention", "full_attention"],
                             eos_token_id=eos_token_id, pad_token_id=None, **config_ids)
    return Qwen3NextForCausalLM(config).eval()
