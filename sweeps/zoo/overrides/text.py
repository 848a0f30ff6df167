"""Overrides for text models (data only; see sweeps/zoo/overrides/__init__.py for the format)."""

OVERRIDES: dict[str, dict] = {
    "reformer": {
        "reason": "axial position shape/dims must factor max_position_embeddings and sum to hidden_size",
        "config": {"axial_pos_shape": [4, 4], "axial_pos_embds_dim": [16, 16], "max_position_embeddings": 16,
                   "local_attn_chunk_length": 4, "lsh_attn_chunk_length": 4},
    },
    "xmod": {
        "reason": "language adapters need a default language to route inputs",
        "config": {"default_language": "en_XX"},
    },
    "lfm2_moe": {
        "reason": "layer_types defaults to None but the modeling code indexes it per layer",
        "config": {"layer_types": ["conv", "full_attention"]},
    },
    "dbrx": {
        "reason": "modeling reads attn_config.rope_theta and clamps with clip_qkv, both unset in the nested default",
        "config": {"attn_config.rope_theta": 10000.0, "attn_config.clip_qkv": 8.0},
    },
}
