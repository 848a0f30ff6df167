"""Generic config shrinker.

``shrink_config_dict(d)`` takes ``config.to_dict()`` of a default config and returns a
copy where every size is made tiny while the constraints that tie sizes together hold:

* one width ``H`` for every hidden/embedding/projection size (many models silently
  assume two of them are equal), heads that divide it, kv heads dividing heads,
  explicit head dims of ``H // heads``;
* layer counts cut to 2, with per-layer lists (``layer_types`` ...) cut to the same
  length, keeping one of each distinct kind first;
* vocabularies cut to ``VOCAB`` with every special token id remapped *consistently*
  (one old id -> one new id, across nested sub-configs) into the top of the vocabulary;
* image/patch/window sizes cut keeping the patch grid integral;
* nested sub-configs (text/vision/audio/encoder/decoder/backbone ...) shrunk the same way.

Rules are keyed on field *names*; per-model fixes live in ``sweeps.zoo.overrides``.
"""

from __future__ import annotations

import copy
import re
from typing import Any

H = 32          # every hidden/embedding width
HEADS = 4       # attention heads (H // HEADS == HEAD_DIM)
HEAD_DIM = 8
KV_HEADS = 2
FFN = 64        # intermediate sizes
LAYERS = 2
VOCAB = 128
IMAGE = 32
PATCH = 8
MAX_POS = 512
EXPERTS = 4
EXPERTS_PER_TOK = 2
WINDOW = 4
CHANNEL_DIV = 8  # channel lists (CNN stages) are divided by this, keeping their ratios


def scale_channels(x: int) -> int:
    return x if x < 16 else -(-x // CHANNEL_DIV)

# keys whose value is never touched (ids, flags that look like sizes, ...)
_KEEP = {
    "num_channels", "num_labels", "seed", "sampling_rate", "sample_rate", "rope_theta", "num_classes",
    "type_vocab_size", "initializer_range", "layer_norm_eps", "max_depth", "min_depth", "input_sampling_rate",
    "output_sampling_rate", "semantic_sample_rate", "scale", "divisor", "depth_divisor", "n_positions_scale",
    "rotary_embedding_base", "positional_encoding_temperature", "positional_embedding_temperature",
    "temperature_height", "temperature_width", "max_timescale", "diffusion_max_period", "ignore_value",
    "semantic_loss_ignore_index", "loss_ignore_index", "label_length", "num_parallel_samples",
    "relation_bias_theta", "frequency_embedding_size", "model_max_length", "max_length", "max_new_tokens",
    "t2u_max_new_tokens", "num_inference_steps", "inference_num_steps",
}

_SUBCONFIG_HINT = re.compile(r"(^|_)(config|configs)$")
_TOKEN_ID = re.compile(r"(_token_id|_token_index|_token_ids|^(?!.*(seed|layer|expert)).*_(bos|eos|pad|start|end|mask|sep|cls|unk|patch)_id"
                       r"|^im_(start|end|newline)_id|^codec_\w+_id|_stream_\w+_id)$")
_LAYERS = re.compile(
    r"^((num|n)_)?(\w+_)?(hidden_)?layers$|^depth$|^(\w+_)?num_layers$|^n_layers?$|^num_hidden_layers$|"
    r"^(\w+_)?(encoder|decoder)_layers$|^num_(encoder|decoder|spatial|global)_layers$|^layers$"
)
_LAYERS_EXCLUDE = {
    "max_window_layers", "num_kv_shared_layers", "mlp_only_layers", "moe_layers", "no_rope_layers",
    "cross_attention_layers", "num_first_full_attention_layers", "num_last_full_attention_layers",
    "look_ahead_layers", "look_backward_layers", "rope_scaling_layers", "spatial_target_layers",
    "subsample_layers", "num_timestamp_prediction_layers", "aligner_num_add_layers",
    "encode_proj_layers", "target_layer_ids", "extract_layers", "num_feat_extract_layers",
}
_KV_HEADS = re.compile(r"(key_value_heads|kv_heads|num_query_groups|key_value_attention_heads)$")
_HEADS = re.compile(r"(^|_)(heads|n_head|n_heads|num_heads|attention_heads)$")
_HEAD_DIM = re.compile(r"(head_dim|^d_kv|^d_head|dim_head|head_size|^kv_channels|attention_head_size|attention_head_dim)$")
_FFN = re.compile(
    r"(intermediate_size|ffn_dim|^d_ff|^dff|ff_dim|dim_feedforward|mlp_dim|^n_inner|^d_inner|feedforward_dim|linear_units|"
    r"intermediate_dim|feed_forward_size|ffn_hidden_size|dim_ff|expert_ffn_hidden_size|mlp_hidden_size|intermediate_size_mlp|"
    r"feed_forward_hidden_size)$"
)
_WIDTH = re.compile(
    r"(hidden_size|^d_model|n_embd|embed_dim|embedding_dim|embedding_size|hidden_dim|projection_dim|proj_dim|"
    r"^dim$|model_dim|^width$|_width$|output_dim|^d_latents|latent_dim|codebook_dim|codevector_dim|"
    r"hidden_channels|bottleneck_size|projection_size|^proj_size|_out_channel|^\w+_feature_size|^(adapter|projector)_(in|out|input|output)_(dim|size)|^enc_dim|^decoder_dim|emb_dim|^d_rel|^text_config_dim)$"
)
_EXPERTS = re.compile(r"^(num_experts|num_local_experts|n_routed_experts|moe_num_experts|num_experts_total|n_experts)$")
_EXPERTS_TOK = re.compile(r"^(num_experts_per_tok|num_experts_per_token|moe_topk|top_k|moe_top_k|moe_k|num_selected_experts)$")
_MAX_POS = re.compile(r"(max_position_embeddings|^n_positions|^n_ctx|max_target_positions|"
                      r"max_text_positions|max_speech_positions|max_(encoder|decoder)_position_embeddings)$")
_LORA = re.compile(r"(_lora_rank|^q_lora_rank|^kv_lora_rank|^o_lora_rank)$")


_COUNTED_INDEX_LISTS = ("backbone_out_indices", "intermediate_hook_ids", "intermediate_layers_indices", "extract_layers",
                        "vision_feature_layers", "feature_layers", "out_indices")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _looks_like_config(v: Any) -> bool:
    return isinstance(v, dict) and ("model_type" in v or "architectures" in v or "hidden_size" in v or "d_model" in v)


class _TokenMap:
    """One old special id -> one new id, shared across the whole config tree."""

    def __init__(self, vocab: int):
        self.vocab = vocab
        self.map: dict[int, int] = {}
        self.next = vocab - 1

    def fresh(self) -> int:
        new = self.next
        self.next -= 1
        return new

    def __call__(self, old: int) -> int:
        if old < 0:
            return old
        if old < self.vocab // 2:     # small ids (0/1/2...) are already valid and meaningful
            return old
        if old not in self.map:
            self.map[old] = self.next
            self.next -= 1
        return self.map[old]


def _pick_layer_items(items: list, n: int) -> list:
    """Cut a per-layer list to n entries keeping one of each distinct kind first (in order)."""
    if len(items) <= n:
        return list(items)
    chosen_idx: list[int] = []
    seen = []
    for i, it in enumerate(items):
        key = repr(it)
        if key not in seen:
            seen.append(key)
            chosen_idx.append(i)
    chosen_idx = chosen_idx[:n]
    for i in range(len(items)):
        if len(chosen_idx) >= n:
            break
        if i not in chosen_idx:
            chosen_idx.append(i)
    return [items[i] for i in sorted(chosen_idx)]


def _shrink_heads(v: int) -> int:
    if v >= HEADS:
        return HEADS
    return v if H % v == 0 else 2


def shrink_config_dict(d: dict, vocab_map: _TokenMap | None = None, _depth: int = 0) -> dict:
    d = copy.deepcopy(d)
    if vocab_map is None:
        vocab_map = _TokenMap(VOCAB)
    _shrink_level(d, vocab_map, _depth)
    return d


def _shrink_level(d: dict, tm: _TokenMap, depth: int) -> None:
    orig = dict(d)
    # --- layer counts first (lists below are cut to them) -------------------------------
    orig_layers = {}
    # hierarchical backbones: the stage count is len(depths); cut depths, never the stage count
    staged = isinstance(d.get("depths"), list)
    # feature taps whose *count* matters (a neck expects k maps): keep k layers
    need = LAYERS
    for k in _COUNTED_INDEX_LISTS:
        v = d.get(k)
        if isinstance(v, list) and len(v) > 1 and all(_is_int(x) for x in v):
            need = max(need, len(v))
    for k, v in list(d.items()):
        if staged and (k in ("num_layers", "num_stages") or (_is_int(v) and v == len(d["depths"]))):
            continue  # a stage count, tied to len(depths)
        if _is_int(v) and k not in _LAYERS_EXCLUDE and _LAYERS.search(k) and v > need:
            orig_layers[k] = v
            d[k] = need
    n_layers = d.get("num_hidden_layers", d.get("num_layers", d.get("n_layer", LAYERS)))
    n_orig = orig.get("num_hidden_layers", orig.get("num_layers", orig.get("n_layer")))
    for k, v in list(d.items()):
        kl = k.lower()
        if isinstance(v, dict) and v.get("model_type") == "timm_backbone" and str(v.get("backbone", "")).startswith("resnet"):
            # timm cannot be installed here; transformers' own ResNet is the same architecture, so a
            # timm ResNet backbone is swapped for it (then shrunk like any backbone)
            v = d[k] = {"model_type": "resnet", "layer_type": "bottleneck", "embedding_size": 64,
                        "hidden_sizes": [256, 512, 1024, 2048], "depths": [3, 4, 6, 3],
                        "out_indices": list(v.get("out_indices") or [4]), "num_channels": v.get("num_channels", 3)}
        if isinstance(v, dict):
            if _looks_like_config(v) or _SUBCONFIG_HINT.search(kl):
                _shrink_level(v, tm, depth + 1)
            continue
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v) and all(_looks_like_config(x) for x in v):
            for x in v:
                _shrink_level(x, tm, depth + 1)
            continue
        if kl in _KEEP or isinstance(v, bool):
            continue
        if _is_int(v) or (isinstance(v, list) and v and all(_is_int(x) for x in v)):
            if _TOKEN_ID.search(kl):
                d[k] = [tm(x) for x in v] if isinstance(v, list) else tm(v)
                continue
        if kl in ("width_multiplier", "depth_multiplier") and isinstance(v, float) and v > 1 / CHANNEL_DIV:
            d[k] = 1 / CHANNEL_DIV  # hard-coded stage widths times this float: the channel-list division
            continue
        if not _is_int(v):
            continue
        if kl.endswith("vocab_size") or kl.startswith("vocab_size_per"):
            if v > VOCAB:
                d[k] = VOCAB
        elif _KV_HEADS.search(kl):
            pass  # after heads
        elif _HEADS.search(kl):
            d[k] = _shrink_heads(v)
        elif kl in ("qk_rope_head_dim", "rope_head_dim", "rotary_dim", "rotary_emb_dim", "index_rope_head_dim"):
            if v > HEAD_DIM // 2:
                d[k] = HEAD_DIM // 2  # the rotary part must leave a non-rotary remainder of the head
        elif _HEAD_DIM.search(kl):
            if v > HEAD_DIM:
                d[k] = HEAD_DIM
        elif _FFN.search(kl):
            if v > FFN:
                d[k] = FFN
        elif kl in ("num_groups", "norm_num_groups", "num_norm_groups"):
            if v > 4:
                d[k] = 4  # GroupNorm groups must divide the (scaled) channel counts
        elif kl == "num_windows":
            if v > 4:
                d[k] = 4  # image_size / num_windows must stay a multiple of sqrt(num_windows)
        elif kl == "condition_dim":
            if v > H:
                d[k] = H  # conditioning on the backbone hidden state
        elif kl in ("base_channels",):
            if v > 32:
                d[k] = 32  # VQ-GAN stacks GroupNorm(32) over multiples of this
        elif kl in ("num_filters", "n_filters", "base_filters", "ngf", "ndf"):
            if v > 4:
                d[k] = 4  # codec/VQ conv stacks double this per downsampling stage
        elif kl in ("upsample_initial_channel", "duration_predictor_filter_channels", "flow_size",
                    "latent_channels", "number_output_channels"):
            if v > H:
                d[k] = H
        elif kl == "encoder_hidden_size" and isinstance(orig.get("downsampling_ratios"), list):
            if v > 4:
                d[k] = 4  # codec conv encoders (DAC family) double this per downsampling stage (x16-x32)
        elif kl == "num_res_blocks":
            if v > 1:
                d[k] = 1  # VQ-GAN resnet blocks per resolution level (decoder has one more)
        elif kl.startswith("hidden_size_per_layer"):
            if v > HEAD_DIM:
                d[k] = HEAD_DIM  # per-layer input embeddings (Gemma3n/4): vocab x layers x this
        elif _WIDTH.search(kl) or kl.endswith("hidden_size"):
            if v > H:
                d[k] = H
        elif _EXPERTS.search(kl):
            if v > EXPERTS:
                d[k] = EXPERTS
        elif kl in ("n_group", "num_expert_group", "n_groups_experts"):
            if v > 2:
                d[k] = 2  # EXPERTS // n_group experts per group, >= 2 for the group top-2 score
        elif kl in ("topk_group", "num_topk_groups"):
            if v > 1:
                d[k] = 1
        elif _EXPERTS_TOK.search(kl):
            if v > EXPERTS_PER_TOK:
                d[k] = EXPERTS_PER_TOK
        elif _MAX_POS.search(kl):
            if v > MAX_POS:
                d[k] = MAX_POS
        elif _LORA.search(kl):
            if v > 16:
                d[k] = 16
        elif kl in ("image_size", "img_size", "pretrain_image_size", "crop_size", "resolution") or (
                kl == "input_size" and "patch_size" in d and v >= 64):
            if v > IMAGE:
                d[k] = IMAGE
        elif kl in ("patch_size",):
            if v > PATCH:
                d[k] = PATCH
        elif kl in ("window_size", "sliding_window", "sliding_window_size", "attention_window_size", "local_attention",
                    "attention_chunk_size", "attention_window"):
            if v > WINDOW:
                d[k] = WINDOW if "sliding" not in kl else max(WINDOW, 4)
        elif kl in ("num_mel_bins", "n_mel_bins", "mel_dim", "feature_size", "input_feat_size", "spectrogram_bins",
                    "feature_projection_input_dim", "input_feat_per_channel"):
            pass  # audio feature dims are cheap and coupled to front-end strides/projections: keep them
        elif kl in ("num_frames", "frames_per_clip"):
            if v > 4:
                d[k] = 4
        elif kl in ("num_codebooks", "n_codebooks", "num_quantizers", "num_code_groups"):
            if v > 2:
                d[k] = 2
        elif kl in ("codebook_size", "num_embeddings", "codebook_vocab_size"):
            if v > 64:
                d[k] = 64
        elif kl in ("context_length",) and "patch_length" in d or kl == "context_length" and v > 64:
            if v > 64:
                d[k] = 64
        elif kl in ("prediction_length", "horizon_length"):
            if v > 16:
                d[k] = 16
        elif kl in ("max_source_positions",):
            if v > 64:
                d[k] = 64  # whisper-like encoders need exactly 2*max_source_positions frames
        elif kl in ("mm_tokens_per_image", "num_image_tokens", "image_seq_length", "vision_soft_tokens_per_image",
                    "audio_soft_tokens_per_image"):
            if v > 4:
                d[k] = 4
        elif kl.startswith("num_first_") or kl.startswith("num_last_"):
            if v > 1:
                d[k] = 1  # e.g. full-attention layers at each end of a 2-layer stack
        elif kl.endswith("channels") and kl not in ("num_channels", "in_channels", "input_channels", "num_input_channels"):
            d[k] = scale_channels(v)  # same map as channel lists, so ints and lists stay coupled
        elif kl in ("num_queries", "num_query_tokens", "num_latents", "num_denoising", "two_stage_num_proposals"):
            if v > 8:
                d[k] = 8
    # --- kv heads ----------------------------------------------------------------------
    for k, v in list(d.items()):
        if _is_int(v) and _KV_HEADS.search(k.lower()):
            sibling = k.replace("key_value_heads", "attention_heads")  # encoder_num_key_value_heads -> ..._attention_heads
            heads_key = next((hk for hk in (sibling, "num_attention_heads", "n_head", "num_heads", "encoder_attention_heads")
                              if hk != k and _is_int(d.get(hk))), None)
            new_heads = d[heads_key] if heads_key else HEADS
            old_heads = orig.get(heads_key) if heads_key else None
            if old_heads is not None and v == old_heads:
                d[k] = new_heads
            elif v == 1:
                d[k] = 1
            else:
                d[k] = KV_HEADS if new_heads % KV_HEADS == 0 else 1
    if "vocab_size" in d and d["vocab_size"] is None and depth >= 0 and ("hidden_size" in d or "d_model" in d):
        d["vocab_size"] = VOCAB  # None vocab: the embedding cannot be built
    # a multimodal config with a tower but no placeholder id: give it a fresh one
    for key, tower in (("image_token_index", "vision_config"), ("image_token_id", "vision_config"),
                       ("audio_token_index", "audio_config"), ("audio_token_id", "audio_config"),
                       ("video_token_index", "vision_config"), ("video_token_id", "vision_config")):
        if key in d and d[key] is None and isinstance(d.get(tower), dict):
            d[key] = tm.fresh()
    # 2-D layout embeddings: 4 * coordinate_size + 2 * shape_size == hidden (LayoutLMv2/3, LiLT, Bros ...)
    if _is_int(d.get("coordinate_size")) and _is_int(d.get("shape_size")) and _is_int(d.get("hidden_size")) and \
            4 * orig["coordinate_size"] + 2 * orig["shape_size"] == orig.get("hidden_size"):
        d["coordinate_size"], d["shape_size"] = d["hidden_size"] // 8, d["hidden_size"] // 4
    # pixel-shuffle adapters (Llama 4 vision): the adapter MLP input is hidden / ratio**2
    psr = d.get("pixel_shuffle_ratio")
    # (the default Llama 4 vision config itself breaks this: 768 / 0.25 != 5632, its checkpoints use 1408)
    if isinstance(psr, float) and 0 < psr < 1 and _is_int(d.get("hidden_size")) and _is_int(d.get("intermediate_size")):
        d["intermediate_size"] = int(d["hidden_size"] / psr ** 2)
    # widths that were a multiple of hidden_size (concat of two streams ...) stay that multiple
    if _is_int(orig.get("hidden_size")) and _is_int(d.get("hidden_size")) and orig["hidden_size"] != d["hidden_size"]:
        for k2 in ("attention_hidden_size",):
            o = orig.get(k2)
            if _is_int(o) and o != orig["hidden_size"] and o % orig["hidden_size"] == 0:
                d[k2] = d["hidden_size"] * (o // orig["hidden_size"])
    # group counts that equalled the width (depthwise convs) follow it
    for wk in ("hidden_size", "d_model"):
        if _is_int(orig.get(wk)) and _is_int(d.get(wk)) and orig[wk] != d[wk]:
            for k2, v2 in list(d.items()):
                if k2.endswith("groups") and _is_int(v2) and v2 == orig[wk]:
                    d[k2] = d[wk]
    lt = d.get("layer_types")
    if "sliding_window" in d and d["sliding_window"] is None and isinstance(lt, list) and "sliding_attention" in lt:
        d["sliding_window"] = WINDOW  # sliding layers need a window
    if _is_int(d.get("num_kv_shared_layers")) and _is_int(n_layers) and d["num_kv_shared_layers"] >= n_layers:
        d["num_kv_shared_layers"] = 0  # KV sharing needs more layers than a 2-layer stack has
    # fields left None whose modeling code then reads them anyway (getattr(config, "head_dim", ...) sees None)
    heads_key = next((hk for hk in ("num_attention_heads", "n_head", "num_heads") if _is_int(d.get(hk))), None)
    width_key = next((wk for wk in ("hidden_size", "d_model", "n_embd", "embed_dim") if _is_int(d.get(wk))), None)
    if heads_key and width_key:
        if "head_dim" in d and d["head_dim"] is None:
            d["head_dim"] = max(d[width_key] // d[heads_key], 1)
        for kvk in ("num_key_value_heads",):
            if kvk in d and d[kvk] is None:
                d[kvk] = d[heads_key]
    # SSM (mamba-style) blocks: heads * head_dim must equal expand * hidden
    for nh, hdk, exk in (("num_heads", "head_dim", "expand"), ("mamba_n_heads", "mamba_d_head", "mamba_expand"),
                         ("mamba_num_heads", "mamba_head_dim", "mamba_expand"), ("n_mamba_heads", "mamba_headdim", "mamba_expand"),
                         ("mamba_num_heads", "mamba_head_dim", "expand")):
        if all(_is_int(d.get(x)) for x in (nh, hdk)) and isinstance(d.get(exk), (int, float)) and _is_int(d.get("hidden_size")):
            inner = int(d[exk] * d["hidden_size"])
            if _is_int(d.get("mamba_d_ssm")):
                d["mamba_d_ssm"] = inner
            if d[nh] * d[hdk] != inner:
                d[hdk] = HEAD_DIM if inner % HEAD_DIM == 0 else 1
                d[nh] = inner // d[hdk]
    # head-dim family sizes that were equal stay equal (e.g. head_dim == qk_rope_head_dim in MLA models)
    hd_keys = [k for k in d if _is_int(d.get(k)) and _is_int(orig.get(k))
               and (_HEAD_DIM.search(k.lower()) or "rope_head_dim" in k or k == "rotary_dim")]
    for a in hd_keys:
        for b in hd_keys:
            if a < b and orig[a] == orig[b] and d[a] != d[b]:
                d[a] = d[b] = min(d[a], d[b])
    # deepseek-style split head dims
    if _is_int(d.get("qk_nope_head_dim")) and _is_int(d.get("qk_rope_head_dim")):
        for hk in ("qk_head_dim", "head_dim"):
            if _is_int(d.get(hk)) and (
                    hk == "qk_head_dim" or orig.get(hk) == orig.get("qk_nope_head_dim", 0) + orig.get("qk_rope_head_dim", 0)):
                d[hk] = d["qk_nope_head_dim"] + d["qk_rope_head_dim"]
    # --- per-layer lists ---------------------------------------------------------------
    if _is_int(n_orig) and _is_int(n_layers) and n_layers != n_orig:
        for k, v in list(d.items()):
            if isinstance(v, list) and len(v) == n_orig and k not in (
                    "eos_token_id", "depths", "hidden_sizes", "out_indices", "out_features", "stage_names"):
                d[k] = _pick_layer_items(v, n_layers)
    # --- backbones: out_indices must name existing stages; out_features is re-derived -------
    oi = orig.get("out_indices")
    if not staged and isinstance(oi, list) and oi and all(_is_int(x) for x in oi) and isinstance(d.get("stage_names"), list):
        lk = next((k for k in ("num_hidden_layers", "num_layers") if _is_int(d.get(k))), None)
        if lk is not None and max(oi) > d[lk]:
            k_out = len(oi)
            d[lk] = max(d[lk], min(k_out, orig[lk]))
            d["out_indices"] = list(range(d[lk] - k_out + 1, d[lk] + 1))
            d["out_features"] = None
            d["stage_names"] = ["stem"] + [f"stage{i}" for i in range(1, d[lk] + 1)]
            for k2, v2 in list(d.items()):  # per-layer lists follow the new count
                if (isinstance(v2, list) and isinstance(orig.get(k2), list) and len(orig[k2]) == orig[lk]
                        and k2 not in ("out_indices", "stage_names")):
                    d[k2] = _pick_layer_items(orig[k2], d[lk])
    # --- list-valued stage descriptions (hierarchical vision backbones) ------------------
    for k, v in list(d.items()):
        kl = k.lower()
        if kl.endswith("channels") and isinstance(v, list) and v and all(
                isinstance(x, list) and all(_is_int(y) for y in x) for x in v):
            d[k] = [[scale_channels(y) for y in x] for x in v]  # per-block channel tables
            continue
        if not (isinstance(v, list) and v and all(_is_int(x) for x in v)):
            continue
        if kl == "depths" or kl.endswith("_depths") or kl in (
                "blocks_per_stage", "stage_num_blocks", "num_block_repeats", "block_repeats", "stage_numb_of_layers"):
            d[k] = [min(x, 1) if x > 0 else x for x in v]
        elif kl in ("hidden_sizes", "embed_dims", "embed_dim_per_stage", "neck_hidden_sizes", "encoder_hidden_sizes",
                    "stage_out_channels", "stage_in_channels", "stage_mid_channels", "backbone_channel_list",
                    "conv_dim", "tdnn_dim", "convstream_hidden_sizes", "fusion_hidden_sizes", "embedding_dimension",
                    "embed_dim", "hidden_size", "decoder_in_channels", "encoder_in_channels", "in_channels", "out_channels") \
                or kl.endswith("channels") or kl.endswith("hidden_sizes") or kl.endswith("fusion_dims") \
                or (kl == "out_features" and min(v) >= 16):
            # scale every channel list by the same factor so lists that must agree across
            # sub-configs (backbone hidden_sizes == encoder_in_channels ...) still agree
            # one fixed map for every entry of every channel list (x -> ceil(x / CHANNEL_DIV) from
            # 16 up; small values such as RGB stay): values that were equal stay equal, across lists
            # and sub-configs, so stage-to-stage and backbone-to-neck couplings survive
            d[k] = [scale_channels(x) for x in v]
        elif kl == "channel_multiplier":
            d[k] = [1] * len(v)  # VQ-GAN width per resolution level: base_channels everywhere, same level count
        elif "key_value_heads" in kl:  # per-layer kv heads: MHA layers follow the heads, GQA layers get KV_HEADS
            hk = next((h for h in ("num_attention_heads", "num_heads") if _is_int(orig.get(h))), None)
            d[k] = [d[hk] if hk and x == orig[hk] else min(x, KV_HEADS) for x in v]
        elif kl in ("num_heads", "num_attention_heads", "num_attention_heads_per_stage", "attention_heads"):
            d[k] = [min(x, 2) for x in v]
        elif kl in ("image_size", "img_size", "pretrain_image_size"):
            d[k] = [min(x, IMAGE) for x in v]
        elif kl in ("patch_size",):
            d[k] = [min(x, PATCH) for x in v]
        elif kl in ("intermediate_size", "moe_intermediate_size"):
            d[k] = [min(x, FFN) for x in v]
        elif kl in ("window_size",):
            d[k] = [min(x, WINDOW) for x in v]
        elif kl in ("mrope_section",):
            pass  # handled with rope below
    # --- PaddlePaddle-style stage tables: block_configs[stage][block] = [kernel, in, out, stride, se]
    bc = d.get("block_configs")
    if isinstance(bc, list) and bc and all(isinstance(st, list) for st in bc):
        deps = d.get("depths") if isinstance(d.get("depths"), list) else None
        new_bc = []
        for i, stage in enumerate(bc):
            keep = stage[: max(1, deps[i])] if deps and i < len(deps) and _is_int(deps[i]) else stage
            new_bc.append([[b[0], scale_channels(b[1]), scale_channels(b[2]), *b[3:]]
                           if isinstance(b, list) and len(b) >= 3 and _is_int(b[1]) and _is_int(b[2]) else b for b in keep])
        d["block_configs"] = new_bc
    # --- heterogeneous per-layer configs: keys are layer indices ---------------------------
    plc = d.get("per_layer_config")
    if isinstance(plc, dict) and plc and not all(str(k).lstrip("-").isdigit() for k in plc):
        for v in plc.values():  # keyed by layer type: keep the keys, shrink the sizes
            if isinstance(v, dict):
                v0 = dict(v)
                _shrink_level(v, tm, depth + 1)
                _mla_head_dim(v, v0, d, orig)
    elif isinstance(plc, dict) and plc and _is_int(n_layers):
        items = sorted(((int(k), v) for k, v in plc.items()), key=lambda kv: kv[0])
        distinct, seen = [], []
        for _, v in items:
            if repr(v) not in seen:
                seen.append(repr(v))
                distinct.append(v)
        distinct = distinct[: n_layers]
        shrunk = []
        for v in distinct:  # per-layer overrides hold sizes too (head_dim, kv heads ...): same rules
            v0, v = v, dict(v)
            _shrink_level(v, tm, depth + 1)
            _mla_head_dim(v, v0, d, orig)
            shrunk.append(v)
        d["per_layer_config"] = {str(n_layers - len(shrunk) + i): v for i, v in enumerate(shrunk)}
    # a width that equalled the first stage of a channel list follows that list (Hiera: hidden == stage 1)
    for lk in ("embed_dim_per_stage", "hidden_sizes", "embed_dims"):
        lo, ln = orig.get(lk), d.get(lk)
        if isinstance(lo, list) and isinstance(ln, list) and lo and ln and _is_int(orig.get("hidden_size")) \
                and orig["hidden_size"] == lo[0] and _is_int(d.get("hidden_size")):
            d["hidden_size"] = ln[0]
    # --- windowed hierarchical backbones (Swin family): last stage must hold one window ---
    if staged and _is_int(d.get("window_size")) and _is_int(d.get("patch_size")) and _is_int(d.get("image_size")):
        d["window_size"] = min(orig.get("window_size", 2), 2)
        d["image_size"] = max(d["image_size"], d["patch_size"] * 2 ** (len(d["depths"]) - 1) * d["window_size"])
    # --- taps into the vision tower's hidden states (it has LAYERS layers now) ---------------
    for k in ("vision_feature_layer", "vision_feature_layers", "feature_layers"):
        v = d.get(k)
        wrap = lambda x: -(1 + (-x - 1) % LAYERS) if x < 0 else x % (LAYERS + 1)  # noqa: E731
        if _is_int(v):
            d[k] = wrap(v)
        elif isinstance(v, list) and v and all(_is_int(x) for x in v):
            d[k] = [wrap(x) for x in v]
    # --- any-resolution grids (LLaVA-NeXT): pinpoints in units of the tiny image size ----------
    if isinstance(d.get("image_grid_pinpoints"), list) and d["image_grid_pinpoints"]:
        d["image_grid_pinpoints"] = [[IMAGE, IMAGE], [IMAGE, 2 * IMAGE], [2 * IMAGE, IMAGE], [2 * IMAGE, 2 * IMAGE]]
    # --- windowed patch-merging towers (Qwen2.5-VL): window = patch * merge * 2 -------------
    if not staged and _is_int(d.get("window_size")) and _is_int(d.get("patch_size")) and _is_int(d.get("spatial_merge_size")):
        if _is_int(orig.get("window_size")) and orig["window_size"] >= orig["patch_size"] * orig["spatial_merge_size"]:
            d["window_size"] = d["patch_size"] * d["spatial_merge_size"] * 2
    # --- rope parameters (mrope sections must sum to head_dim // 2) -----------------------
    for rk in ("rope_parameters", "rope_scaling"):
        rp = d.get(rk)
        if isinstance(rp, dict):
            hd = d.get("head_dim") if _is_int(d.get("head_dim")) else None
            if hd is None and _is_int(d.get("hidden_size")) and _is_int(d.get("num_attention_heads")):
                hd = d["hidden_size"] // d["num_attention_heads"]
            ms = rp.get("mrope_section")
            if isinstance(ms, list) and ms and hd:
                prf = rp.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0)) or 1.0
                rp["mrope_section"] = _split_sum(int(hd * prf) // 2, len(ms))
            for key in ("original_max_position_embeddings",):
                if _is_int(rp.get(key)) and rp[key] > MAX_POS:
                    rp[key] = MAX_POS
            for key in ("short_factor", "long_factor"):
                if isinstance(rp.get(key), list) and hd:
                    n = (hd * float(rp.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0)) or 1.0)) // 2
                    rp[key] = rp[key][: max(int(n), 1)]
    # --- special-case: block-level index lists referencing removed layers ----------------
    if _is_int(n_layers):
        for k, v in list(d.items()):
            kl = k.lower()
            if isinstance(v, list) and v and all(_is_int(x) for x in v) and (
                kl not in ("out_indices",) and (kl.endswith("_indexes") or kl.endswith("_indices"))
                or kl.endswith("_idxs") or kl.endswith("_layer_ids")
                or kl in ("global_attn_indexes", "fullatt_block_indexes", "deepstack_visual_indexes", "mlp_only_layers",
                          "moe_layers", "no_rope_layers", "cross_attention_layers", "full_attn_idxs", "kv_source_layers")
            ):
                if kl == "no_rope_layers" and len(v) > n_layers:
                    d[k] = _pick_layer_items(v, n_layers)
                    continue
                if kl in _COUNTED_INDEX_LISTS and (max(v) >= n_layers or min(v) < -n_layers):
                    kk = len(v)
                    d[k] = list(range(n_layers - kk, n_layers)) if min(v) >= 0 else list(range(-kk, 0))
                    continue
                kept = [x for x in v if -n_layers <= x < n_layers]
                d[k] = kept if kept else [n_layers - 1]
        for k2 in list(d):  # hybrid period/offset layouts (Jamba, Zamba): keep one of each kind in n layers
            if k2.endswith("_layer_offset") and _is_int(d[k2]) and d[k2] >= n_layers:
                d[k2] = n_layers - 1
            if k2.endswith("_layer_period") and _is_int(d[k2]) and d[k2] > n_layers:
                d[k2] = n_layers
        if _is_int(d.get("merge_index")) and isinstance(d.get("intermediate_hidden_state_indices"), list):
            d["merge_index"] = min(d["merge_index"], min(d["intermediate_hidden_state_indices"]))
        if "attn_layer_indices" in orig and orig["attn_layer_indices"] is None and "mamba_d_state" in d:
            d["attn_layer_indices"] = [n_layers - 1]  # hybrid SSMs: keep one attention layer


def _mla_head_dim(v: dict, v0: dict, parent: dict, parent0: dict) -> None:
    """A per-layer override whose head_dim was qk_nope + qk_rope (inheriting either from the
    parent) keeps that relation after shrinking."""
    if not any(k in v for k in ("head_dim", "qk_nope_head_dim", "qk_rope_head_dim")):
        return
    get = lambda dd, dd_parent, k: dd.get(k, dd_parent.get(k))  # noqa: E731
    n0, r0 = get(v0, parent0, "qk_nope_head_dim"), get(v0, parent0, "qk_rope_head_dim")
    n1, r1 = get(v, parent, "qk_nope_head_dim"), get(v, parent, "qk_rope_head_dim")
    if all(_is_int(x) for x in (n0, r0, n1, r1)) and get(v0, parent0, "head_dim") == n0 + r0:
        v["head_dim"] = n1 + r1


def _split_sum(total: int, parts: int) -> list[int]:
    base = total // parts
    out = [base] * parts
    out[0] += total - base * parts
    return out
