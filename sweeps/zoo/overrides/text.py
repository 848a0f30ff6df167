"""Overrides for text models (data only; see sweeps/zoo/overrides/__init__.py for the format)."""

OVERRIDES: dict[str, dict] = {
    "afmoe": {
        "reason": "AfmoePreTrainedModel._init_weights zeroes router.gate (and expert_bias), so every expert "
                  "scores sigmoid(0) = 0.5 and top-k picks by tie order, which torch (nth_element) and ONNX "
                  "TopK (lower index first) define differently; a drawn gate makes the routing a real choice",
        "reinit": {"*.router.gate.weight": 0.02},
    },
    "reformer": {
        "reason": "axial position shape/dims must factor max_position_embeddings and sum to hidden_size; "
                  "LSH attention draws its hash rotations at random on every call unless hash_seed is set, "
                  "so without it no two runs (eager included) agree",
        "config": {"axial_pos_shape": [4, 4], "axial_pos_embds_dim": [16, 16], "max_position_embeddings": 16,
                   "local_attn_chunk_length": 4, "lsh_attn_chunk_length": 4, "hash_seed": 0},
    },
    "xlnet": {
        "reason": "XLNetLMHeadModel.prepare_inputs_for_generation appends a dummy token to input_ids but passes token_type_ids "
                  "through at the prompt's length, so the segment einsum sees 8 vs 7 positions: generate without them",
        "generate": {"inputs": {"drop": ["token_type_ids"]}},
    },
    "xmod": {
        "reason": "language adapters need a default language to route inputs",
        "config": {"default_language": "en_XX"},
    },
    "lfm2_moe": {
        "reason": "layer_types defaults to None but the modeling code indexes it per layer",
        "config": {"layer_types": ["conv", "full_attention"]},
    },
    "granitemoehybrid": {
        "reason": "default layer_types are all linear-attention; the cache needs one attention layer",
        "config": {"layer_types": ["linear_attention", "full_attention"]},
    },
    "longformer": {
        "reason": "QA/multiple-choice heads find the question end from exactly three separator tokens",
        "inputs": {"place": {"sep_token_id": [2, 3, -1]}},
    },
    "splinter": {
        "reason": "the QA head needs at least one question token per sample",
        "inputs": {"place": {"question_token_id": [1]}},
    },
    "deepseek_v2": {
        "reason": "routing sizes default to None (dense checkpoint defaults) but the MoE layers read them",
        "config": {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1},
    },
    "recurrent_gemma": {
        "reason": "block_types cycle by layer index; with 2 layers the default pattern has no attention block",
        "config": {"block_types": ["recurrent", "attention"]},
    },
    "zamba": {
        "reason": "the shared transformer is tied across hybrid layers: needs two hybrid layers (4-layer stack)",
        "config": {"num_hidden_layers": 4, "attn_layer_period": 2, "attn_layer_offset": 1,
                   "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"],
                   "attention_hidden_size": 64},  # the shared block attends over concat(hidden, embeddings)
    },
    "qwen4_exp_text": {
        "reason": "QSA indexer fields are optional in the config but the full-attention layers always build the indexer"
                  "; 8 indexer heads, not 2: a block scores the sum over heads of relu(q . k), so with 2 heads a quarter of the blocks score exactly 0 and top-k chooses among those ties by tie order, which eager (topk over the loop's complete blocks), the vectorized indexer (a fixed block grid) and ONNX TopK (lower index first) break differently; with 8 heads a tie needs every head negative (1 block in 256)",
        "config": {"indexer_n_heads": 8, "indexer_kv_heads": 1, "indexer_head_dim": 8, "indexer_budget": 4,
                   "indexer_compress_ratio": 2},
    },
    "jev": {
        "reason": "judge head over one prompt: per-question mark positions (1..S, indexing hidden states), option counts and "
                  "question types (0..2, indexing config.offsets) have no generic recipe",
        "inputs": {"tensors": {
            "marks": {"shape": ["B", 3], "kind": "int", "low": 1, "high": "S + 1"},
            "num_options": {"shape": ["B", 3], "kind": "int", "low": 1, "high": 3},
            "question_type_ids": {"shape": ["B", 3], "kind": "int", "high": 3},
        }},
    },
    "neomme": {
        "reason": "validator: partial_rotary_factor 0.25 must rotate a multiple of 4 dims (M-RoPE axes): head_dim 16",
        "config": {"head_dim": 16},
    },
    "gemma4_assistant": {
        "reason": "validator: per-layer-input sizes must be 0 for the assistant (its own default text config has 256 / 262144)",
        "base": {"text_config": {"hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0}},  # default fails otherwise
    },
    "T5GemmaEncoderModel": {
        "reason": "the encoder-only class refuses a config flagged is_encoder_decoder (the t5gemma default)",
        "config": {"is_encoder_decoder": False},
    },
    "hrm_text": {
        "reason": "cache slots: num_hidden_layers == num_layers_per_stack * H_cycles * (L_cycles + 1)",
        "config": {"num_layers_per_stack": 1, "H_cycles": 2, "L_cycles": 1, "L_bp_cycles": [1], "num_hidden_layers": 4},
    },
    "dots1": {
        "reason": "expert counts (routed, shared, per token) default to None but the MoE layers allocate them",
        "config": {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1},
    },
    "dbrx": {
        "reason": "modeling reads attn_config.rope_theta and clamps with clip_qkv, both unset in the nested default",
        "config": {"attn_config.rope_theta": 10000.0, "attn_config.clip_qkv": 8.0},
    },
}

_TS = {
    "reason": "prediction/context lengths default to None; lags and time features define the input window",
    "config": {"prediction_length": 4, "context_length": 8, "lags_sequence": [1, 2, 3], "num_time_features": 2,
               "feature_size": "<delete>"},  # derived from the above; the stale default would win
}
OVERRIDES.update({
    "time_series_transformer": _TS,
    "informer": _TS,
    "autoformer": {**_TS, "config": {**_TS["config"], "label_length": 4},
                   "reason": _TS["reason"] + "; label_length (decoder warm-up) must fit in context_length"},
})
