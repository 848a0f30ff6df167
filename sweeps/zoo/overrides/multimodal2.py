"""Overrides for multimodal models, second half of the alphabet (data only; format in __init__)."""

OVERRIDES: dict[str, dict] = {
    "inkling_mm_model": {
        "reason": "vision tower takes channels-last patch clips (N, temporal_patch, P, P, C): a 3x3 RGB patch x 2 frames makes the generic (B, frames, C, H, W) clip that exact shape; audio token table (mel bins x mel vocab) shrunk",
        "config": {"vision_config.patch_size": 3, "vision_config.image_size": 3, "vision_config.temporal_patch_size": 2,
                   "vision_config.num_channels": 3,
                   # audio token table is n_mel_bins * mel_vocab_size rows (80 * 128 = 330K params): shrink both
                   "audio_config.n_mel_bins": 8, "audio_config.mel_vocab_size": 16},
        "inputs": {"images_per_sample": 2},
    },
    "kimi_k25": {
        "reason": "square learned pos grid (pos_emb_width is shrunk as a width, height is not) and a (2, 2) merge kernel that the generic grid rule only sees as spatial_merge_size",
        "config": {"vision_config.spatial_merge_size": 2, "vision_config.pos_emb_height": 8, "vision_config.pos_emb_width": 8},
    },
    "kimi_k25_vision": {
        "reason": "square learned pos grid (pos_emb_width is shrunk as a width, height is not) and a (2, 2) merge kernel that the generic grid rule only sees as spatial_merge_size",
        "config": {"spatial_merge_size": 2, "pos_emb_height": 8, "pos_emb_width": 8},
    },
    "muse_spark": {
        "reason": "vision adapter reads the pixel-shuffled tower output (out_hidden_size = vision hidden * merge_size**2); audio pyramid stages narrowed (patch-folding convs made ~1M params)",
        "config": {"out_hidden_size": 128, "audio_config.hidden_sizes": [8, 16, 16, 32], "vision_config.pos_emb_height": 8,
                   "vision_config.pos_emb_width": 8},
    },
    "muse_glimmer": {
        "reason": "the vision adapter reads the pixel-shuffled tower output: out_hidden_size = vision hidden_size * merge_size**2 (learned pos grid cut to 8x8)",
        "config": {"out_hidden_size": 128, "vision_config.pos_emb_height": 8, "vision_config.pos_emb_width": 8},
    },
    # neomme's model-type entry lives in text.py (head_dim); these class entries add the image layout
    "NeoMMEModel": {
        "reason": "pixel_values are (num_patches, 3*p*p) rows, one per placeholder token: a one-patch image (image_size == patch_size) makes the patch-sequence layout (B, 1, 3*p*p) count one token per row",
        "config": {"image_size": 8, "patch_size": 8},
    },
    "NeoMMEForMaskedLM": {
        "reason": "pixel_values are (num_patches, 3*p*p) rows, one per placeholder token: a one-patch image (image_size == patch_size) makes the patch-sequence layout (B, 1, 3*p*p) count one token per row",
        "config": {"image_size": 8, "patch_size": 8},
    },
    "pp_formulanet": {
        "reason": "a vision encoder-decoder whose main input is pixel_values; forward's input_ids only stand in for "
                  "decoder ids (shifted right when decoder_input_ids are absent): generate takes the image and the decoder "
                  "prompt (input_ids would reach generate's _expand_inputs_for_generation twice)",
        "generate": {"inputs": {"drop": ["input_ids", "attention_mask"]}},
    },
    "pi0": {
        "reason": "robot state (B, max_state_dim), flow-matching noise/time (drawn inside forward when absent: passed so the "
                  "forward is deterministic) and the DiT's action embeddings (state token + chunk) have no generic recipe; chunk 50 -> 4",
        "config": {"chunk_size": 4},
        # one camera per sample, its (32 / patch 8) ** 2 = 16 image tokens after a 2-token prefix
        "inputs": {"images_per_sample": 1, "seq_len": 20, "place": {"vlm_config.image_token_id": list(range(2, 18))},
                   "tensors": {
            "pixel_attention_mask": {"shape": ["B", 1], "kind": "ones", "dtype": "bool"},
            "state": {"shape": ["B", "max_state_dim"]},
            "noise": {"shape": ["B", "chunk_size", "max_action_dim"]},
            "timestep": {"shape": ["B"], "kind": "rand"},
            "action_embeds": {"shape": ["B", "chunk_size + 1", "dit_config.hidden_size"]},
        }},
    },
    "shieldgemma2": {
        "reason": "the yes/no logit indices default to 10784/3771 (modeling getattr fallback, not token-id fields the vocab shrink remaps): point them inside the tiny vocab",
        "config": {"yes_token_index": 100, "no_token_index": 101},
    },
    "t5gemma2_encoder": {
        "reason": "T5Gemma2Config copies dropout_rate into the encoder's text_config; the standalone encoder config never sets it but its MLP reads it",
        "config": {"text_config.dropout_rate": 0.0},
    },
    "paddleocr_vl": {
        "reason": "text rope falls back to a hard-coded mrope_section [16, 24, 24] when the config has none: give one summing to the tiny head_dim // 2",
        "config": {"text_config.rope_parameters.mrope_section": [2, 1, 1]},
    },
    "xlstm": {
        "reason": "the cache sizes its states from qk/v dims rounded up to 64 while the layers use hidden*factor unrounded: factors 2.0 make both 64; num_blocks (the real block count) follows the 2 layers",
        "config": {"qk_dim_factor": 2.0, "v_dim_factor": 2.0, "num_blocks": 2},
    },
    "vision-text-dual-encoder": {
        "reason": "the visual projection reads the ViT pooler output, whose width pooler_output_size (768) is not shrunk with hidden_size",
        "config": {"vision_config.pooler_output_size": 32},
    },
    "unlimited_ocr": {
        "reason": "the SAM neck's last downsample conv feeds the CLIP encoder as patch embeddings: downsample_channels[-1] must equal the encoder hidden_size (channel lists shrink by 8, widths to 32)",
        "config": {"vision_config.sam_config.downsample_channels": [16, 32]},
    },
    "inkling2": {
        "reason": "pixel_values are channels-last token crops (N, p*merge, p*merge, C); with patch 3 and merge 1 the generic (N, C, p, p) patch layout has exactly that shape (no recipe makes merge>1 crops)",
        "config": {"vision_config.patch_size": 3, "vision_config.spatial_merge_size": 1},
    },
    "inkling2_vision": {
        "reason": "pixel_values are channels-last token crops (N, p*merge, p*merge, C); with patch 3 and merge 1 the generic (N, C, p, p) patch layout has exactly that shape (no recipe makes merge>1 crops)",
        "config": {"patch_size": 3, "spatial_merge_size": 1},
    },
    "molmo2": {
        "reason": "the ViT adds a fixed (num_position_embeddings, hidden) table to every crop's patches: the stored 729 (27x27 of 378 px) is derived from image_size / patch_size, so drop it to re-derive 16 (4x4 of the tiny 32 px crop)",
        "config": {"vision_config.num_position_embeddings": "<delete>"},
    },
    "idefics": {
        "reason": "images come as (B, num_images, C, H, W) with a per-token image_attention_mask (B, S, num_images) (made by the generic rule)",
        "inputs": {"images_per_sample": 1},
    },
}
