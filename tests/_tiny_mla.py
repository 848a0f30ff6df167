"""The tiny DeepSeek-V3 (multi-head latent attention: its cache keys and values differ in size) that the
static-step and onnxruntime-genai tests share (``from _tiny_mla import tiny_deepseek_v3``)."""

from __future__ import annotations

import torch


def tiny_deepseek_v3(eos_token_id: int | None = None, **config_ids):
    """No end token unless ``eos_token_id``; ``config_ids``: other token ids of the config (bos_token_id)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    config = DeepseekV3Config(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                              num_hidden_layers=2, first_k_dense_replace=2, num_attention_heads=2, num_key_value_heads=2,
                              q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                              pad_token_id=None, eos_token_id=eos_token_id, **config_ids)
    return DeepseekV3ForCausalLM(config).eval()
