"""Overrides for vision models (data only; see sweeps/zoo/overrides/__init__.py for the format)."""

_FOUR_TAPS = {
    "reason": "the semantic-segmentation head requires exactly 4 out_indices (feature taps) into the encoder",
    "config": {"num_hidden_layers": 4, "out_indices": [1, 2, 3, 4], "out_features": "<delete>", "stage_names": "<delete>"},
}

# PP-OCR large-kernel PAN neck: (kernel, stride, padding) per conv of an intra-class block, as the released
# checkpoints ship them (the config class leaves intraclass_block_config / scale_factor_list / kernel_list None)
_INTRACLASS_NECK = {
    "intraclass_block_config": {
        "reduce_channel": [1, 1, 0], "return_channel": [1, 1, 0],
        "vertical_long_to_small_conv_longratio": [[7, 1], 1, [3, 0]],
        "vertical_long_to_small_conv_midratio": [[5, 1], 1, [2, 0]],
        "vertical_long_to_small_conv_shortratio": [[3, 1], 1, [1, 0]],
        "horizontal_small_to_long_conv_longratio": [[1, 7], 1, [0, 3]],
        "horizontal_small_to_long_conv_midratio": [[1, 5], 1, [0, 2]],
        "horizontal_small_to_long_conv_shortratio": [[1, 3], 1, [0, 1]],
        "symmetric_conv_long_longratio": [7, 1, 3],
        "symmetric_conv_long_midratio": [5, 1, 2],
        "symmetric_conv_long_shortratio": [3, 1, 1],
    },
    "scale_factor_list": [1, 2, 4, 8],
    "kernel_list": [3, 2, 2],
}

# UVDoc [in, out, dilation, downsample] / [channels, dilation] tables: 8-16 channels, every dilation kept
_UVDOC_TABLES = {
    "resnet_head": [[3, 8], [8, 8]],
    "resnet_configs": [[[8, 8, 1, False], [8, 8, 3, False]],
                       [[8, 16, 1, True], [16, 16, 3, False]],
                       [[16, 16, 1, True], [16, 16, 3, False]]],
    "stage_configs": [[[16, 1]], [[16, 2]], [[16, 5]], [[16, 8], [16, 3], [16, 2]],
                      [[16, 12], [16, 7], [16, 4]], [[16, 18], [16, 12], [16, 6]]],
}

# RT-DETR family: the decoder queries are the torch.topk(num_queries) of per-anchor encoder scores. At the default
# normal(0, 0.01/0.02) conv init the HGNetV2 backbone / hybrid encoder shrink features to ~1e-15, every score equals
# the enc_score_head bias, and ONNX TopK (lowest index first) and torch.topk break that full tie differently. The
# std is tuned per type: the encoder's conv stack is exponential in it (0.3 explodes D-FINE's encoder to 1e9)
_TOPK_SCORE_REASON = ("conv features vanish (~1e-15) at the 0.01 init std, so all encoder query scores tie and the "
                      "top-k query selection is arbitrary; these stds keep them >= 1e-3 apart with O(1) activations")

OVERRIDES: dict[str, dict] = {
    "beit": _FOUR_TAPS,
    "levit": {
        "reason": "the patch embedding is a fixed stack of four stride-2 convs (16x); patch_size must stay 16",
        "config": {"patch_size": 16, "image_size": 64},
    },
    "sapiens2": {
        "reason": "dense-prediction head layout (upsample/conv stacks) is left None in the default head_config",
        "config": {"head_config.upsample_out_channels": [32, 16], "head_config.upsample_kernel_sizes": [4, 4],
                   "head_config.use_pixel_shuffle": False, "head_config.conv_out_channels": [16],
                   "head_config.conv_kernel_sizes": [1]},
    },
    "mobilevitv2": {
        "reason": "32x downsampling before the 2x2 unfold of the last stage: 32 px leaves 1x1, 64 px leaves 2x2",
        "config": {"image_size": 64},
    },
    "detr": {
        "reason": "the panoptic mask head concatenates hidden + attention-head channels into GroupNorm(8): 32 + 8 heads",
        "config": {"encoder_attention_heads": 8, "decoder_attention_heads": 8},
    },
    "mobilevit": {
        "reason": "transformer widths come from the hidden_sizes list (144/192/240 -> 18/24/30): 2 heads divide them",
        "config": {"num_attention_heads": 2},
    },
    "data2vec-vision": _FOUR_TAPS,
    "efficientnet": {
        "reason": "top conv width is hard-coded as round_filters(1280) (x width_coefficient); hidden_dim must match it",
        "config": {"width_coefficient": 0.25, "depth_coefficient": 1.0, "hidden_dim": 320},
    },
    "tipsv2_dpt": {
        "reason": "_init_weights draws every Linear with kaiming_normal_(mode='fan_out'): the 2/3-output decoder head gets "
                  "std-1 weights (gain ~6 on fan_in 32) over the fusion stage's ~100-scale features, so logits/normals "
                  "are O(800) and fp32 eager itself is 5e-4 off fp64 (atol 1e-4 is below the summation noise); "
                  "the head at std 0.02 keeps outputs O(10)",
        "reinit": {"*decoder.head.weight": 0.02},
    },
    "depth_pro": {
        "reason": "12-layer hook ids and 256/1024-wide feature dims sit at top level, outside the dinov2 towers the shrinker cuts; "
                  "input must be >= patch_size / min(scaled_images_ratios) (image_size here sizes the zoo input)",
        "config": {"patch_size": 16, "image_size": 64, "merge_padding_value": 1,
                   "intermediate_hook_ids": [1, 0], "intermediate_feature_dims": [16, 16],
                   "scaled_images_feature_dims": [32, 32, 16],
                   "patch_model_config.patch_size": 4, "patch_model_config.image_size": 16,
                   "image_model_config.patch_size": 4, "image_model_config.image_size": 16,
                   "fov_model_config.patch_size": 4, "fov_model_config.image_size": 16},
    },
    "DepthProForDepthEstimation": {
        "reason": "_init_weights draws every conv with kaiming_normal_(mode='fan_out'): the head's last 1x1 conv (32 -> 1 "
                  "channel, fan_out 1) gets std-1.4 weights (gain ~8) over the fusion stage's ~100-scale features, so "
                  "predicted_depth is O(600) and fp32 eager itself is 6e-4 off fp64 (atol 1e-4 is below the summation "
                  "noise); that conv at std 0.02 keeps the depth O(10)",
        "reinit": {"head.layers.4.weight": 0.02},
    },
    "efficientloftr": {
        "reason": "rope embeds hidden/2 channels from head_dim * partial_rotary_factor(4): needs head_dim == hidden/8 (8 heads); "
                  "forward takes image pairs (B, 2, C, H, W)",
        "config": {"num_attention_heads": 8, "num_key_value_heads": 8, "image_size": 64, "fine_matching_slice_dim": 4},
        "inputs": {"images_per_sample": 2},
    },
    "superglue": {
        "reason": "keypoint matching: image pairs (B, 2, C, H, W); the SuperPoint descriptor width (256, not a shrunk name) must equal hidden_size",
        "config": {"keypoint_detector_config.descriptor_decoder_dim": 32, "keypoint_encoder_sizes": [8, 16],
                   "gnn_layers_types": ["self", "cross"], "sinkhorn_iterations": 10, "image_size": 64,
                   "keypoint_detector_config.max_keypoints": 32},
        "inputs": {"images_per_sample": 2},
        # SuperPoint's 10 convs at the 0.02-std init shrink the signal to nothing: every one of the 3600 pixels
        # scores exactly 1/65, so top-k picks its 32 keypoints by tie order (torch and ONNX TopK differ);
        # drawn detector weights make the scores, hence the keypoints, a real choice
        "reinit": {"keypoint_detector.*.weight": 0.2},
    },
    "eomt": {
        "reason": "queries join at layer num_hidden_layers - num_blocks: num_blocks (4, not a layer-count name) must be < the 2 layers",
        "config": {"num_blocks": 1},
    },
    "eomt_dinov3": {
        "reason": "queries join at layer num_hidden_layers - num_blocks: num_blocks (4, not a layer-count name) must be < the 2 layers",
        "config": {"num_blocks": 1},
    },
    "HieraForPreTraining": {
        "reason": "the MAE decoder sizes default to None (only pretraining builds a decoder); 64 px gives 2x2 mask units to mask",
        "config": {"decoder_hidden_size": 32, "decoder_depth": 1, "decoder_num_heads": 2, "image_size": [64, 64]},
        # random_masking draws torch.rand(B, prod(mask_spatial_shape)) unless given `noise`: a seeded one instead;
        # mask_spatial_shape = image_size // patch_stride // masked_unit_size = 64 // 4 // 8 = 2x2 -> 4 mask units
        "inputs": {"tensors": {"noise": {"shape": ["B", 4], "kind": "rand"}}},
    },
    "vit_mae": {
        "reason": "random_masking draws torch.rand(B, num_patches) unless given `noise` (eager and export would mask "
                  "different patches): a seeded uniform noise of that shape",
        "inputs": {"tensors": {"noise": {"shape": ["B", "(image_size // patch_size) * (image_size // patch_size)"], "kind": "rand"}}},
    },
    "hiera": {
        "reason": "width doubles per stage (x2 over 4 stages) and the pretraining fusion heads scale with the last stage: start at 8",
        "config": {"embed_dim": 8},
    },
    "lw_detr": {
        "reason": "projector_scale_factors defaults to [] (no feature levels; the encoder concatenates nothing): one 1x level, derived fields re-derived",
        "config": {"projector_scale_factors": [1.0], "num_feature_levels": "<delete>", "projector_in_channels": "<delete>",
                   "projector_out_channels": "<delete>"},
    },
    "pp_ocrv5_mobile_det": {
        "reason": "backbone channels are make_divisible(c * scale, divisor=16) but num_features assumes int(c * scale): "
                  "the shrunk channel table only stays consistent with scale 1 and divisor 2"
                  "; the neck's SE blocks divide neck_out_channels by 4 twice (needs a multiple of 16)",
        "config": {"backbone_config.scale": 1.0, "backbone_config.divisor": 2, "neck_out_channels": 16},
    },
    "pp_ocrv5_mobile_rec": {
        "reason": "the 32x-strided backbone then avg_pool2d(3, 2) needs a >= 96 x 64 text-line input (image_size sizes the zoo input); "
                  "head_out_channels is the CTC character set (2299 after shrinking)",
        "config": {"image_size": [96, 128], "head_out_channels": 64},
    },
    "pp_ocrv5_server_det": {
        "reason": "the neck's intra-class block convs, upsample factors and head kernels default to None (set by checkpoints)",
        "config": dict(_INTRACLASS_NECK),
    },
    "pp_ocrv6_medium_det": {
        "reason": "neck convs/upsample factors/head kernels default to None, and the default backbone is the recognizer's "
                  "([2, 1] strides, one tap): the released det checkpoint taps all 4 stride-2 stages for the 4-level PAN neck",
        "config": {**_INTRACLASS_NECK,
                   "backbone_config.block_configs": [[[3, 12, 12, 1, True]], [[3, 12, 24, 2, False]],
                                                     [[3, 24, 48, 2, False]], [[3, 48, 64, 2, False]]],
                   "backbone_config.out_features": ["stage1", "stage2", "stage3", "stage4"],
                   "backbone_config.out_indices": [1, 2, 3, 4],
                   "backbone_config.stage_out_channels": "<delete>", "backbone_config.depths": "<delete>"},
    },
    "pp_ocrv6_small_det": {
        "reason": "the default backbone is the recognizer's ([2, 1] strides, one tap): the det neck fuses 4 stride-2 stages whose "
                  "widths must equal layer_list_out_channels; its SE blocks divide neck_out_channels by 4 twice",
        "config": {"backbone_config.block_configs": [[[3, 12, 12, 1, True]], [[3, 12, 24, 2, False]],
                                                     [[3, 24, 48, 2, False]], [[3, 48, 64, 2, False]]],
                   "backbone_config.out_features": ["stage1", "stage2", "stage3", "stage4"],
                   "backbone_config.out_indices": [1, 2, 3, 4],
                   "backbone_config.stage_out_channels": "<delete>", "backbone_config.depths": "<delete>",
                   "layer_list_out_channels": [12, 24, 48, 64], "neck_out_channels": 16},
    },
    "slanet": {
        "reason": "PP-LCNet channels are make_divisible(c * scale, divisor=16) but num_features assumes c * scale: divisor 2 keeps "
                  "the shrunk table consistent; the structure decoder loops max_text_length (500) steps",
        "config": {"backbone_config.divisor": 2, "max_text_length": 16},
    },
    "slanext": {
        "reason": "the structure decoder loops up to max_text_length (500) steps: 16 keeps the unrolled export small",
        "config": {"max_text_length": 16},
    },
    "pp_doclayout_v2": {
        "reason": "per-label score thresholds and reading-order priorities default to None (set by checkpoints): one per label (2); "
                  "the reading-order box embeddings (171/170 wide over 1024 positions, names the shrinker does not know) dominate the size; "
                  + _TOPK_SCORE_REASON,
        "config": {"class_thresholds": [0.5, 0.5], "class_order": [0, 1], "initializer_range": 0.25, "backbone_config.initializer_range": 0.3,
                   "reading_order_config.coordinate_size": 8, "reading_order_config.shape_size": 8},
    },
    "pp_doclayout_v3": {
        "reason": "x4_feat_dim is the width of the backbone's stride-4 stage (stage_out_channels[0]; a name the shrinker keeps); "
                  + _TOPK_SCORE_REASON,
        "config": {"x4_feat_dim": 16, "initializer_range": 0.25, "backbone_config.initializer_range": 0.3},
    },
    "pp_doclayout_v4": {"reason": _TOPK_SCORE_REASON, "config": {"initializer_range": 0.25, "backbone_config.initializer_range": 0.3}},
    "d_fine": {"reason": _TOPK_SCORE_REASON, "config": {"initializer_range": 0.2, "backbone_config.initializer_range": 0.25}},
    "deimv2": {"reason": _TOPK_SCORE_REASON, "config": {"initializer_range": 0.2, "backbone_config.initializer_range": 0.2}},
    "rt_detr": {"reason": _TOPK_SCORE_REASON + " (its ResNet backbone is Kaiming-initialised)", "config": {"initializer_range": 0.2}},
    "rt_detr_v2": {"reason": _TOPK_SCORE_REASON + " (its ResNet backbone is Kaiming-initialised)", "config": {"initializer_range": 0.2}},
    "sam": {
        "reason": "the prompt encoder's dense grid (image_embedding_size) must equal image_size / patch_size of the vision tower, "
                  "and the random-Fourier positional embedding (2 * num_pos_feats) the neck width",
        "config": {"prompt_encoder_config.image_embedding_size": 4, "vision_config.num_pos_feats": 16},
    },
    "sam_hq": {
        "reason": "as sam (dense grid = image_size / patch_size, 2 * num_pos_feats = neck width); the HQ head compresses "
                  "early ViT features of width vit_dim (= vision hidden_size)",
        "config": {"prompt_encoder_config.image_embedding_size": 4, "vision_config.num_pos_feats": 16,
                   "mask_decoder_config.vit_dim": 32},
    },
    "sam2": {
        "reason": "backbone_feature_sizes is the stride-4/8/16 grid of a 1024 px image (256/128/64): 32 px gives 8/4/2; "
                  "the prompt encoder's dense grid is image_size / patch_size, the stride 16 of the image embedding",
        "config": {"vision_config.backbone_feature_sizes": [[8, 8], [4, 4], [2, 2]], "prompt_encoder_config.patch_size": 16},
    },
    "sam3_tracker": {
        "reason": "backbone_feature_sizes is the 4x/2x/1x FPN grid of a 1008 px image at patch 14 (288/144/72): "
                  "32 px at patch 8 gives 16/8/4",
        "config": {"vision_config.backbone_feature_sizes": [[16, 16], [8, 8], [4, 4]]},
    },
    "seggpt": {
        "reason": "image_size (H, W) is the prompt and the query stacked on the height axis: each input is (H/2, W); "
                  "the prompt image/mask have the input's shape",
        "config": {"image_size": [64, 32]},
        "inputs": {"tensors": {
            "pixel_values": {"shape": ["B", "num_channels", 32, 32]},
            "prompt_pixel_values": {"kind": "like", "of": "pixel_values"},
            "prompt_masks": {"kind": "like", "of": "pixel_values"},
        }},
    },
    "tvp": {
        "reason": "the frame-pad visual prompt is built at max_img_size (448) and added to the frames, so it must equal the "
                  "input size: 64 px, since the 32x ResNet grid is max-pooled 2x again (image_size sizes the zoo input); "
                  "batch 1 for an upstream bug: modeling_tvp.py:242 views the (width, hidden) column table as (batch_size, 1, width, hidden)",
        "config": {"max_img_size": 64, "visual_prompt_size": 8, "image_size": 64},
        # batch 1: upstream bug, transformers 5.23.0 modeling_tvp.py:242-244 (TvpVisualInputEmbedding.add_2d_positional_embeddings)
        # views the (width, hidden) column table as (batch_size, 1, width, hidden), which only holds for batch 1
        "inputs": {"batch_size": 1},
    },
    "uvdoc": {
        "reason": "channel/dilation tables (resnet, 6 bridges, head) are nested lists the shrinker leaves at 32-128 wide (7.7M "
                  "params); the head concatenates all 6 bridge outputs (out_features must tap every bridge stage); reflect padding "
                  "at stride 8 needs a >= 64 px input (image_size sizes the zoo input)",
        "config": {**{f"backbone_config.{k}": v for k, v in _UVDOC_TABLES.items()},
                   "backbone_config.out_features": ["stage1", "stage2", "stage3", "stage4", "stage5", "stage6"],
                   "backbone_config.out_indices": [1, 2, 3, 4, 5, 6], "backbone_config.depths": "<delete>",
                   "bridge_connector": [16, 16], "out_point_positions2D": [[16, 8], [8, 2]],
                   "image_size": [64, 64]},
    },
    "mask2former": {
        "reason": "feature_size is the pixel decoder's width (256, GroupNorm(32) over it), not an audio feature dim as the "
                  "shrinker reads that name elsewhere",
        "config": {"feature_size": 32},
    },
    "uvdoc_backbone": {
        "reason": "channel/dilation tables (resnet, 6 bridges, head) are nested lists the shrinker leaves at 32-128 wide (7.7M "
                  "params): the same tiny tables as uvdoc's backbone_config",
        "config": {**_UVDOC_TABLES, "depths": "<delete>"},
    },
    "vitmatte": {
        "reason": "the 3-stage stride-2 ConvStream (1/8) is fused with the ViT grid upsampled 2x: the patch must be 16",
        "config": {"backbone_config.patch_size": 16, "backbone_config.image_size": 64, "backbone_config.pretrain_image_size": 64},
    },
    "zoedepth": {
        "reason": "the metric head's bottleneck input is the DPT neck output: bottleneck_features must equal fusion_hidden_size",
        "config": {"bottleneck_features": 32},
    },
}
