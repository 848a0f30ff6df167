"""Overrides for multimodal models (data only; see sweeps/zoo/overrides/__init__.py for the format)."""

_CODES = 64          # the shrunk VQ codebook size (shrink.py: codebook_size/num_embeddings -> 64)
_FIRST_IMAGE_BPE = 30  # image-code token ids 30..93, below the special ids at the top of the vocab


def _chameleon_vocab() -> dict:
    # "IMGIMG" + code digits spelled A..J + one trailing char (dropped by the model)
    names = {"IMGIMG" + "".join(chr(ord("A") + int(c)) for c in str(i)) + "Z": _FIRST_IMAGE_BPE + i for i in range(_CODES)}
    return {"<image>": 120, **names}


def _emu3_vocab() -> dict:
    # "<|visual token NNNNNN|>": the model reads the code from characters [-8:-2]
    # "<|extra_200|>" is the end-of-row token the model appends to every row of image codes
    names = {f"<|visual token {i:06d}|>": _FIRST_IMAGE_BPE + i for i in range(_CODES)}
    return {"<image>": 120, "<|extra_200|>": 119, **names}


_THINKER = {
    "reason": "the thinker model reads vision_start_token_id, which only the top-level Omni config defines",
    "config": {"vision_start_token_id": 100},
}

_COMPASS_ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}

_GDINO = {
    "reason": "class logits are padded with -inf up to max_text_len; equal to the zoo's text length (7) they are finite. "
              "input_proj_vision's GroupNorm(32, d_model): at the shrunk d_model=32 each group is one channel, and on "
              "the 1x1 extra feature level one element, whose normalized value is exactly 0 in theory and rounding "
              "noise (~1e-5) in practice, which the fusion layer's LayerNorm then scales by 1/sqrt(eps) (~300x); "
              "d_model=64 gives 2 channels per group (the released 256 gives 8)",
    "config": {"max_text_len": 7, "d_model": 64},
}

OVERRIDES: dict[str, dict] = {
    "decision_transformer": {
        "reason": "max_ep_len (4096) sizes the timestep embedding table; 64 episode steps cover any zoo trajectory",
        "config": {"max_ep_len": 64},  # the forward itself still needs a states/actions/... recipe (see zoo notes)
    },
    "blt": {
        "reason": "with use_cache the forward builds DynamicCache(config=BltConfig), which has no num_hidden_layers (any config)",
        "config": {"use_cache": False,
                   # the global transformer's width as the local encoder/decoder see it (a name the shrinker misses)
                   "encoder_config.hidden_size_global": 32, "decoder_config.hidden_size_global": 32,
                   "encoder_hash_byte_group_vocab": 64},  # hash n-gram embedding rows (500002 x hidden otherwise)
    },
    "granite4_vision": {
        "reason": "window Q-Former projectors: downsample_rate / deepstack map default None, qformer heads = vision hidden // 64",
        "config": {"downsample_rate": "1/2",  # 4x4 patch grid: 2x2 key windows, 1 query each (spatial groups halve too)
                   "deepstack_layer_map": [[1, 0], [2, 1]],  # (vision hidden-state index, LLM layer) pairs
                   "spatial_target_layers": [2, 3, 4, 5],  # 4 offset groups, each injected at its own LLM layer
                   "text_config.num_hidden_layers": 6, "vision_config.hidden_size": 64},
    },
    "glm_image": {
        "reason": "image path needs images_per_sample and a target grid per sample in image_grid_thw (no recipe): text path",
        "inputs": {"drop": ["pixel_values", "image_grid_thw"]},
    },
    "FlavaForPreTraining": {
        "reason": "config.return_loss defaults to True, which makes forward demand codebook_pixel_values for MIM labels; inference run",
        "config": {"return_loss": False, "init_codebook": False},  # the DALL-E codebook (600k params) only makes MIM labels
    },
    "ernie4_5_vl_moe": {
        "reason": "mrope interleaves the h and w sections pairwise (torch.stack), so they must be equal: [1, 1, 2] sums to head_dim 8 / 2",
        "config": {"text_config.rope_parameters.mrope_section": [1, 1, 2]},
    },
    "dots3_note": {
        "reason": "the audio tower also needs chunk_sample_lengths (waveform samples per chunk), which no recipe makes: image+text path",
        "config": {"audio_config.conv_output_size": "<delete>"},  # derived: downsample width * ceil(feature_size / 8)
        "inputs": {"drop": ["input_features"]},
    },
    "deepseek_vl_hybrid": {
        "reason": "feature count needs high_res_pixel_values too (not probed) and the error misreports it: 16 tokens per image",
        "inputs": {"seq_len": 20, "place": {"image_token_id": list(range(2, 18))}},  # (32 / patch 8) ** 2 = 16 queries
    },
    "deepseek_ocr2": {
        "reason": "text mlp_layer_types and num_experts_per_tok default to None but every decoder layer indexes them",
        "config": {"text_config.mlp_layer_types": ["dense", "sparse"], "text_config.num_experts_per_tok": 2,
                   # the SAM neck's last downsample width feeds the Qwen2 encoder directly (896 == 896 by default)
                   "vision_config.sam_config.downsample_channels": [16, 32]},
    },
    "align": {
        "reason": "EfficientNet stem is hard-coded round_filters(32): first 3 default stages, unscaled, narrowed by width_coefficient",
        "config": {"vision_config.in_channels": [32, 16, 24], "vision_config.out_channels": [16, 24, 40],
                   "vision_config.strides": [1, 2, 2], "vision_config.kernel_sizes": [3, 3, 5],
                   "vision_config.expand_ratios": [1, 6, 6], "vision_config.num_block_repeats": [1, 1, 1],
                   "vision_config.width_coefficient": 0.25, "vision_config.depth_coefficient": 1.0,
                   "projection_dim": 16},  # image embeds are round_filters(40) = 16 wide; text is projected to match
    },
    "altclip": {
        "reason": "the text tower's type_vocab_size is 1 but the zoo feeds token types 0/1; project_dim is an unshrunk width",
        "config": {"text_config.type_vocab_size": 2, "text_config.project_dim": 32},
    },
    "Blip2ForImageTextRetrieval": {
        "reason": "with image_token_index set, forward strips num_query_tokens (8) leading image tokens off input_ids",
        "config": {"qformer_config.use_qformer_text_input": True},  # the ITM/ITC head runs text through the Q-Former
        "inputs": {"seq_len": 15, "place": {"image_token_index": [0, 1, 2, 3, 4, 5, 6, 7]}},
    },
    "bridgetower": {
        "reason": "the CLIP vision tower hard-codes heads = hidden_size // 64; 64 gives one head",
        "config": {"vision_config.hidden_size": 64},
    },
    "bros": {
        "reason": "bbox sinusoid dims are hidden // 4 // dim_bbox(8), must be even: hidden 64; derived dims are recomputed",
        "config": {"hidden_size": 64, "dim_bbox_sinusoid_emb_2d": "<delete>", "dim_bbox_sinusoid_emb_1d": "<delete>",
                   "dim_bbox_projection": "<delete>"},
    },
    "grounding-dino": _GDINO,
    "mm-grounding-dino": _GDINO,
    "aria": {
        "reason": "the projector maps a patch count to a query count; the tiny 32 px / patch 8 tower has 16 patches",
        "config": {"projector_patch_to_query_dict": {16: 4}, "max_value_projector_patch_to_query_dict": 4},
    },
    "diffusion_gemma": {
        "reason": "text layers always build the MoE router but num_experts / top_k / moe width default to None",
        "config": {"text_config.num_experts": 4, "text_config.top_k_experts": 2, "text_config.moe_intermediate_size": 64},
    },
    "step3p7": {
        "reason": "sliding-window heads (num_sliding_attention_heads) need sliding_window, which defaults to None",
        "config": {"text_config.sliding_window": 4},
    },
    "cohere_compass_text": {
        "reason": "default rope_parameters is empty but the rotary embedding looks it up per layer type",
        "config": {"rope_parameters": _COMPASS_ROPE},
    },
    "cohere_compass": {
        "reason": "default rope_parameters is empty but the rotary embedding looks it up per layer type",
        "config": {"text_config.rope_parameters": _COMPASS_ROPE},
    },
    "lilt": {
        "reason": "layout embeddings use hidden_size // 6 per box coordinate; 48 divides by 6, heads and shrink ratio 4",
        "config": {"hidden_size": 48},
    },
    "qwen2_5_omni_thinker": _THINKER,
    "qwen3_omni_moe_thinker": _THINKER,
    "qwen4_exp": {
        "reason": "QSA indexer fields are optional in the config but the full-attention layers always build the indexer"
                  "; 8 indexer heads, not 2: a block scores the sum over heads of relu(q . k), so with 2 heads a quarter of the blocks score exactly 0 and top-k chooses among those ties by tie order, which eager (topk over the loop's complete blocks), the vectorized indexer (a fixed block grid) and ONNX TopK (lower index first) break differently; with 8 heads a tie needs every head negative (1 block in 256)",
        "config": {"text_config.indexer_n_heads": 8, "text_config.indexer_kv_heads": 1, "text_config.indexer_head_dim": 8,
                   "text_config.indexer_budget": 4, "text_config.indexer_compress_ratio": 2},
    },
    "colqwen2": {
        "reason": "image features are scattered into the vlm_config.image_token_id positions without a count check (and it "
                  "has no get_image_features to count them): the generic 4x6-patch grid merged 2x2 gives 6 tokens per image",
        "inputs": {"seq_len": 10, "place": {"vlm_config.image_token_id": [2, 3, 4, 5, 6, 7]}},
    },
    "perceiver": {
        "reason": "cross-attention qk width defaults to the preprocessor's channel count (e.g. 322); one head divides any",
        "config": {"num_cross_attention_heads": 1,
                   "num_self_attends_per_block": 2},  # a layer count (26) that the shrinker's names do not match
        "inputs": {"pixel_rank": 4},  # num_frames in the config is for the video autoencoder only
    },
    "PerceiverModel": {
        "reason": "the bare model has no preprocessor: `inputs` are already-embedded (B, S, d_model) arrays",
        "inputs": {"tensors": {"inputs": {"shape": ["B", "S", "d_model"]}}},
    },
    "PerceiverForImageClassificationLearned": {
        "reason": "its preprocessor hard-codes 256-wide trainable positions for every pixel (image_size**2 x 256): 16 px images",
        "config": {"image_size": 16},
    },
    "mllama": {
        "reason": "vision_output_dim = hidden * (1 + number of intermediate layers) (32 * 6); not a free width",
        "config": {"vision_config.vision_output_dim": 192},
    },
    "glm4v_moe": {
        "reason": "modeling rotates half of head_dim (hard-coded) with mrope sections [2, 1, 1]: head_dim 16 fits",
        "config": {"text_config.head_dim": 16, "text_config.rope_parameters.mrope_section": [2, 1, 1]},
    },
    "glm4v_moe_text": {
        "reason": "modeling rotates half of head_dim (hard-coded) with mrope sections [2, 1, 1]: head_dim 16 fits",
        "config": {"head_dim": 16, "rope_parameters.mrope_section": [2, 1, 1]},
    },
    "chameleon": {
        "reason": "vocabulary_map (VQ code -> BPE id) defaults to None; the model needs one covering the tiny codebook",
        "config": {"vocabulary_map": _chameleon_vocab(), "image_token_id": 120},
    },
    "emu3": {
        "reason": "vocabulary_map (visual token -> BPE id) defaults to None (the VQ attention block, hidden_size wide, runs on "
                  "base_channels * channel_multiplier[-1]: the shrinker's all-ones channel_multiplier keeps that)",
        "config": {"vocabulary_map": _emu3_vocab(), "image_token_id": 120},
    },
    "phi4_multimodal": {
        "reason": "the audio conformer's layer count is num_blocks (24), a name the shrinker does not read as layers "
                  "(eomt/esm/perceiver use it otherwise)",
        "config": {"audio_config.num_blocks": 2},
    },
}
