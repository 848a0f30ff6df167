"""Forward inputs for a tiny model, derived from the config and ``inspect.signature(model.forward)``.

Batch ``B`` = 2, text length ``S`` = 7, decoder length ``T`` = 5, so that no dim is 0/1 and
distinct dims have distinct sizes.  Everything is drawn from a seeded ``torch.Generator``.
"""

from __future__ import annotations

import inspect
import math
import re
from typing import Any

import torch

B = 2
S = 7
T_DEC = 5

_ID_KEY = re.compile(r"(_token_id|_token_index|_token_ids|_id)$")

# forward parameters we never fill (training-only, caching, output flags, alternatives)
_NEVER = {
    "labels", "inputs_embeds", "decoder_inputs_embeds", "past_key_values", "use_cache", "output_attentions",
    "output_hidden_states", "return_dict", "head_mask", "decoder_head_mask", "cross_attn_head_mask",
    "encoder_outputs", "cache_position", "position_ids", "decoder_position_ids", "return_loss", "kwargs",
    "logits_to_keep", "num_logits_to_keep", "interpolate_pos_encoding", "mc_labels", "start_positions",
    "end_positions", "next_sentence_label", "sentence_order_label", "bool_masked_pos", "noise",
    "mask_time_indices", "sampled_negative_indices", "output_router_logits", "past_values_mask", "return_loss",
}


def special_token_ids(config) -> set[int]:
    """Every int/list-of-int field named like a special token id, anywhere in the config tree."""
    out: set[int] = set()

    def walk(d: dict):
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v)
            elif isinstance(k, str) and _ID_KEY.search(k) and isinstance(v, int) and not isinstance(v, bool):
                out.add(v)
            elif isinstance(k, str) and _ID_KEY.search(k) and isinstance(v, list):
                out.update(x for x in v if isinstance(x, int) and not isinstance(x, bool))

    walk(config.to_dict())
    return out


def text_vocab(config) -> int:
    try:
        tc = config.get_text_config(decoder=True)
    except Exception:
        tc = config
    v = getattr(tc, "vocab_size", None) or getattr(config, "vocab_size", None)
    if not v:
        for name in ("text_config", "decoder", "decoder_config", "language_config", "llm_config"):
            sub = getattr(config, name, None)
            if sub is not None and getattr(sub, "vocab_size", None):
                return sub.vocab_size
    return int(v) if v else 100


def token_ids(gen: torch.Generator, shape, vocab: int, avoid: set[int]) -> torch.Tensor:
    """Ids in [3, vocab) avoiding special ids (pad/bos/eos/image placeholders...)."""
    allowed = [i for i in range(min(3, vocab - 1), vocab) if i not in avoid]
    if not allowed:
        allowed = list(range(vocab))
    table = torch.tensor(allowed, dtype=torch.long)
    idx = torch.randint(0, len(allowed), shape, generator=gen)
    return table[idx]


def _sub(config, *names):
    for n in names:
        sub = getattr(config, n, None)
        if sub is not None and not isinstance(sub, (int, float, str, bool, list, dict)):
            return sub
    return config


def vision_config(config):
    vlm = _sub(config, "vlm_config")  # wrappers around a whole VLM (ColQwen2, PI0): its vision tower
    if vlm is not config:
        config = vlm
    return _sub(config, "vision_config", "image_config", "vision_tower_config", "backbone_config", "encoder")


def _as_hw(v, default=32):
    if v is None:
        return default, default
    if isinstance(v, (list, tuple)):
        if len(v) == 1:
            return int(v[0]), int(v[0])
        return int(v[-2]), int(v[-1])
    if isinstance(v, dict):
        return int(v.get("height", v.get("shortest_edge", default))), int(v.get("width", v.get("shortest_edge", default)))
    return int(v), int(v)


def num_frames(config) -> int | None:
    vc = vision_config(config)
    for src in (vc, config):
        v = getattr(src, "num_frames", None) or getattr(src, "frames_per_clip", None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def pixel_values(gen, config, frames: int | None = None) -> torch.Tensor:
    """(B, C, H, W) images, or (B, frames, C, H, W) clips for video models / multi-image models."""
    vc = vision_config(config)
    c = getattr(vc, "num_channels", None) or getattr(config, "num_channels", None) or 3
    h, w = _as_hw(getattr(vc, "image_size", None) or getattr(config, "image_size", None))
    if frames:
        return torch.randn((B, frames, c, h, w), generator=gen)
    return torch.randn((B, c, h, w), generator=gen)


def _audio_cfg(config):
    return _sub(config, "audio_config", "encoder_config", "speech_config", "audio_encoder_config")


def input_features(gen, config) -> torch.Tensor:
    ac = _audio_cfg(config)
    mel = getattr(ac, "num_mel_bins", None)
    stacked = getattr(ac, "num_stacked_frames", None)
    if mel and isinstance(stacked, int) and stacked > 1:  # low-frame-rate stacking (FunASR): (B, T, mel * k)
        return torch.randn((B, 64, mel * stacked), generator=gen)
    if mel:
        msp = getattr(ac, "max_source_positions", None)
        nw = getattr(ac, "n_window", None)
        frames = 2 * msp if msp else (2 * nw if isinstance(nw, int) and nw > 0 else 64)
        return torch.randn((B, mel, frames), generator=gen)  # (B, mel, T); see ALTERNATIVES for (B, T, mel)
    feat = getattr(ac, "feature_projection_input_dim", None) or getattr(ac, "input_dim", None) or getattr(ac, "feature_size", None) or getattr(ac, "input_feat_per_channel", None) or getattr(ac, "input_feat_size", None) or 16
    chans = getattr(ac, "input_channels", 1) or 1
    return torch.randn((B, 64, feat * chans), generator=gen)


def input_values(gen, config) -> torch.Tensor:
    ac = _audio_cfg(config)
    mel, frames = getattr(ac, "num_mel_bins", None), getattr(ac, "max_length", None)
    if isinstance(mel, int) and isinstance(frames, int) and not getattr(ac, "conv_dim", None):
        return torch.randn((B, frames, mel), generator=gen)  # spectrogram models (AST): (B, time, mel)
    strides = getattr(ac, "conv_stride", None)
    total = math.prod(strides) if strides else 320
    length = max(total * 40, 1600)  # enough frames for TDNN / x-vector kernels
    length = -(-length // 15360) * 15360  # a multiple of common hop/frame sizes (320, 480, 512, 960, 1920, 3840)
    return torch.randn((B, length), generator=gen)


def _patch(config) -> int:
    p = getattr(vision_config(config), "patch_size", None) or getattr(config, "patch_size", None) or 16
    return int(p[0] if isinstance(p, (list, tuple)) else p)


def patchify(x: torch.Tensor, p: int):
    """(B, C, H, W) -> (B, (H/p)*(W/p), C*p*p) patch sequence and (B, 2) grid of (H/p, W/p)."""
    b, c, h, w = x.shape
    gh, gw = h // p, w // p
    x = x[:, :, : gh * p, : gw * p].reshape(b, c, gh, p, gw, p).permute(0, 2, 4, 3, 5, 1).reshape(b, gh * gw, p * p * c)
    return x.contiguous(), torch.tensor([[gh, gw]] * b, dtype=torch.long)


def time_series_inputs(gen, config, has) -> dict:
    """past/future values for forecasting models (TST/Informer/Autoformer, PatchTST/Mixer, TimesFM)."""
    out = {}
    ctx = getattr(config, "context_length", None) or 32
    pred = getattr(config, "prediction_length", None) or getattr(config, "horizon_length", None) or 8
    lags = getattr(config, "lags_sequence", None)
    if lags:  # GluonTS-style: lagged window in front of the context, time features per step
        L = ctx + max(lags)
        n = getattr(config, "input_size", 1) or 1
        ntf = getattr(config, "num_time_features", 0) or 0
        shape = (B, L) if n == 1 else (B, L, n)
        out["past_values"] = torch.randn(shape, generator=gen)
        out["past_time_features"] = torch.randn((B, L, ntf), generator=gen)
        out["past_observed_mask"] = torch.ones(shape)
        fshape = (B, pred) if n == 1 else (B, pred, n)
        if has("future_values"):
            out["future_values"] = torch.randn(fshape, generator=gen)
        if has("future_time_features"):
            out["future_time_features"] = torch.randn((B, pred, ntf), generator=gen)
        ncat = getattr(config, "num_static_categorical_features", 0) or 0
        if has("static_categorical_features") and ncat:
            card = getattr(config, "cardinality", [2] * ncat)
            out["static_categorical_features"] = torch.stack(
                [torch.randint(0, max(int(c), 1), (B,), generator=gen) for c in card], dim=1)
        nreal = getattr(config, "num_static_real_features", 0) or 0
        if has("static_real_features") and nreal:
            out["static_real_features"] = torch.randn((B, nreal), generator=gen)
        return out
    channels = getattr(config, "num_input_channels", None)
    if channels:
        out["past_values"] = torch.randn((B, ctx, channels), generator=gen)
        for mk in ("observed_mask", "past_observed_mask"):
            if has(mk):
                out[mk] = torch.ones((B, ctx, channels))
        return out
    out["past_values"] = torch.randn((B, ctx), generator=gen)
    if has("past_values_padding"):
        out["past_values_padding"] = torch.zeros((B, ctx))
    if has("freq"):
        out["freq"] = torch.zeros((B, 1), dtype=torch.long)
    return out


def _num_patches(config) -> int:
    vc = vision_config(config)
    h, w = _as_hw(getattr(vc, "image_size", None) or getattr(config, "image_size", None))
    p = _patch(config)
    n = (h // p) * (w // p)
    frames = num_frames(config)
    if frames:
        n *= frames // (getattr(vc, "tubelet_size", 1) or 1)
    return n


def _is_required(p) -> bool:
    return p.default is inspect.Parameter.empty


def patch_grid_pixels(gen, config):
    """Qwen2-VL style vision input: pixel_values are flattened patches (sum(t*h*w), C*tp*p*p)
    with a (num_images, 3) grid of (t, h, w) patches; h, w multiples of spatial_merge_size."""
    vc = vision_config(config)
    p = getattr(vc, "patch_size", 14) or 14
    p = p[0] if isinstance(p, (list, tuple)) else p
    tp = getattr(vc, "temporal_patch_size", None) or getattr(vc, "patch_temporal", None) or 1
    m = getattr(vc, "spatial_merge_size", None) or getattr(vc, "merge_size", None) or 1
    c = getattr(vc, "in_channels", None) or getattr(vc, "num_channels", None) or getattr(vc, "in_chans", None) or 3
    gh, gw = 2 * m, 3 * m if m > 1 else 3
    grid = torch.tensor([[1, gh, gw]] * B, dtype=torch.long)
    pv = torch.randn((B * gh * gw, c * tp * p * p), generator=gen)
    return pv, grid


# the image processors' pooling window (Molmo2ImageProcessor.pooling_size); no config field holds it
POOL_HW = (2, 2)


def _pooling_windows(first_patch: int, gh: int, gw: int, ph: int, pw: int) -> torch.Tensor:
    """Indices of a crop's (gh, gw) patch grid grouped into (ph, pw) windows, one row per pooled token,
    the grid padded to whole windows with -1 (as Molmo2's ``arange_for_pooling``)."""
    grid = torch.arange(gh * gw).reshape(gh, gw) + first_patch
    hp, wp = -gh % ph, -gw % pw
    grid = torch.nn.functional.pad(grid, (wp // 2, (wp + 1) // 2, hp // 2, (hp + 1) // 2), value=-1)
    rows, cols = grid.shape[0] // ph, grid.shape[1] // pw
    return grid.reshape(rows, ph, cols, pw).permute(0, 2, 1, 3).reshape(rows * cols, ph * pw)


def crop_pooled_pixels(x: torch.Tensor, p: int, pool=POOL_HW) -> dict:
    """Molmo2 processor layout for (B, C, H, W) images, one per sample: each image is a low-res resized crop
    plus one high-res crop (here the image and its mirror), all crops' patches stacked
    (num_crops, patches_per_crop, p*p*C); ``image_token_pooling`` (num_tokens, ph*pw) holds, per pooled token,
    the global indices of the patches it pools (-1 pads); ``image_grids`` (num_images, 4) the pooled
    (low-res rows, cols, high-res rows, cols); ``image_num_crops`` (num_images,)."""
    b = x.shape[0]
    crops = torch.stack([x, x.flip(-1)], dim=1).flatten(0, 1)  # (b * 2, C, H, W): per image, low-res then high-res
    patches, _ = patchify(crops, p)
    gh, gw = x.shape[-2] // p, x.shape[-1] // p
    n = gh * gw
    pooled = []
    for crop in range(crops.shape[0]):
        pooled.append(_pooling_windows(crop * n, gh, gw, *pool))
    rows, cols = -(-gh // pool[0]), -(-gw // pool[1])
    grids = torch.tensor([[rows, cols, rows, cols]] * b, dtype=torch.long)
    return {"pixel_values": patches, "image_token_pooling": torch.cat(pooled), "image_grids": grids,
            "image_num_crops": torch.full((b,), 2, dtype=torch.long)}


def make_inputs(model, config, seed: int = 0, spec: dict | None = None) -> dict[str, torch.Tensor]:
    """Generic inputs: fill the forward parameters we know by name."""
    spec = spec or {}
    gen = torch.Generator().manual_seed(seed + 1)
    params = inspect.signature(model.forward).parameters
    vocab = text_vocab(config)
    avoid = special_token_ids(config)
    seq = spec.get("seq_len", S)
    out: dict[str, torch.Tensor] = {}
    # a modality whose sub-config is None has no tower: do not feed it
    absent = {mod for mod, key in (("image", "vision_config"), ("audio", "audio_config"))
              if key in getattr(config, "sub_configs", {}) and getattr(config, key, None) is None}

    def has(name):
        if name in params and _is_required(params[name]):
            return True
        if name in ("pixel_values", "pixel_values_videos") and "image" in absent:
            return False
        if name in ("input_features", "input_values") and "audio" in absent:
            return False
        return name in params
    if has("input_ids"):
        out["input_ids"] = token_ids(gen, (B, seq), vocab, avoid)
        if has("attention_mask"):
            out["attention_mask"] = torch.ones((B, seq), dtype=torch.long)
        if has("mm_token_type_ids"):
            out["mm_token_type_ids"] = torch.zeros((B, seq), dtype=torch.long)
        if has("token_type_ids"):
            tvs = getattr(config, "type_vocab_sizes", None)
            if isinstance(tvs, (list, tuple)) and tvs:  # TAPAS: one id per table-structure channel
                out["token_type_ids"] = torch.stack(
                    [torch.randint(0, max(int(t), 1), (B, seq), generator=gen) for t in tvs], dim=-1)
            else:
                tv = getattr(config, "type_vocab_size", None) or 2
                out["token_type_ids"] = torch.randint(0, max(int(tv), 1), (B, seq), generator=gen)
    if has("pixel_values"):
        if has("image_grid_thw"):
            out["pixel_values"], out["image_grid_thw"] = patch_grid_pixels(gen, config)
        else:
            frames = None if spec.get("pixel_rank") == 4 else (spec.get("images_per_sample") or num_frames(config))
            out["pixel_values"] = pixel_values(gen, config, frames)
            pinpoints = getattr(config, "image_grid_pinpoints", None)
            if pinpoints and out["pixel_values"].dim() == 4:
                # any-resolution (LLaVA-NeXT): base view + one tile at the (tiny) native size
                x = out["pixel_values"]
                out["pixel_values"] = torch.stack([x, x.flip(-1)], dim=1)
            if has("image_sizes") and (pinpoints or _is_required(params["image_sizes"])):
                out["image_sizes"] = torch.tensor([list(out["pixel_values"].shape[-2:])] * B)
    if has("spatial_shapes") and "pixel_values" in out and out["pixel_values"].dim() == 4:
        # NaFlex-style towers (Siglip2 ...): pixel_values are patch sequences + their grid
        out["pixel_values"], out["spatial_shapes"] = patchify(out["pixel_values"], _patch(config))
        if has("pixel_attention_mask"):
            out["pixel_attention_mask"] = torch.ones(out["pixel_values"].shape[:2], dtype=torch.long)
    if has("pixel_position_ids") and _is_required(params["pixel_position_ids"]):
        # patch-sequence towers (Gemma4 vision): (B, N, C*p*p) patches with their (x, y) grid positions;
        # the grid is a multiple of the pooling kernel
        k = int(getattr(vision_config(config), "pooling_kernel_size", None) or 1)
        g = 2 * k if k > 1 else 4
        p = _patch(config)
        c = getattr(vision_config(config), "num_channels", None) or 3
        x = torch.rand((B, c, g * p, g * p), generator=gen)
        out["pixel_values"], _ = patchify(x, p)
        ys, xs = torch.meshgrid(torch.arange(g), torch.arange(g), indexing="ij")
        out["pixel_position_ids"] = torch.stack([xs.flatten(), ys.flatten()], dim=-1).expand(B, g * g, 2).clone()
    if has("visual_feats"):
        nb = 5
        feat = getattr(config, "visual_feat_dim", None) or 64
        out["visual_feats"] = torch.randn((B, nb, feat), generator=gen)
        if has("visual_pos"):
            xy = torch.rand((B, nb, 2), generator=gen) * 0.5
            out["visual_pos"] = torch.cat([xy, xy + 0.25], dim=-1)
    if has("pixel_values_videos") and not has("video_grid_thw") and (
            _is_required(params["pixel_values_videos"]) or not has("pixel_values")):
        out["pixel_values_videos"] = pixel_values(gen, config, num_frames(config) or 4)
    for mk in ("merge_sizes", "image_merge_sizes"):
        grid = out.get("image_grid_thw", out.get("grid_thw"))
        if has(mk) and mk not in out and (grid is not None or _is_required(params[mk])):
            m = getattr(vision_config(config), "spatial_merge_size", None) or 1
            out[mk] = torch.full((B,), int(m), dtype=torch.long)
    if has("hidden_states") and (has("grid_thw") or has("image_grid_thw")) and "pixel_values" not in out:
        # Qwen-VL style vision towers take the flattened patches directly
        pv, grid = patch_grid_pixels(gen, config)
        out["hidden_states"] = pv
        out["grid_thw" if has("grid_thw") else "image_grid_thw"] = grid
    elif has("pixel_values") and has("grid_thw") and "grid_thw" not in out:
        out["pixel_values"], out["grid_thw"] = patch_grid_pixels(gen, config)
    if has("input_features") and has("input_values") and not (
            _is_required(params["input_features"]) or _is_required(params["input_values"])):
        # speech encoder-decoders accept both; the encoder decides (conv feature extractor -> waveform)
        enc = getattr(config, "encoder", None) or config
        if getattr(enc, "conv_dim", None):
            params = {k: v for k, v in params.items() if k != "input_features"}
        else:
            params = {k: v for k, v in params.items() if k != "input_values"}
    if has("input_features"):
        out["input_features"] = input_features(gen, config)
        _ac = _audio_cfg(config)
        frames_dim = -1 if getattr(_ac, "num_mel_bins", None) and not (getattr(_ac, "num_stacked_frames", 1) or 1) > 1 else -2
        for mk in ("feature_attention_mask", "input_features_mask", "audio_attention_mask"):
            if has(mk):
                out[mk] = torch.ones((B, out["input_features"].shape[frames_dim]), dtype=torch.long)
                break
    if has("input_values"):
        out["input_values"] = input_values(gen, config)
        if has("attention_mask") and "attention_mask" not in out and out["input_values"].dim() == 2 and \
                getattr(config, "feat_extract_norm", "layer") == "layer":
            out["attention_mask"] = torch.ones(out["input_values"].shape, dtype=torch.long)
    seqcls_encdec = type(model).__name__.endswith("ForSequenceClassification") and getattr(config, "is_encoder_decoder", False)
    if seqcls_encdec and "input_ids" in out and isinstance(getattr(config, "eos_token_id", None), int):
        # the head pools the decoder state at the (single, last) eos of each row; decoder
        # inputs are derived from input_ids by the model
        out["input_ids"][:, -1] = config.eos_token_id
    if seqcls_encdec and has("decoder_input_ids") and "input_ids" in out:
        out["decoder_input_ids"] = out["input_ids"].clone()
    if has("decoder_input_ids") and not seqcls_encdec and "decoder_input_ids" not in out and (
            getattr(config, "is_encoder_decoder", False) or "input_ids" in out or _is_required(params["decoder_input_ids"])):
        out["decoder_input_ids"] = token_ids(gen, (B, T_DEC), vocab, avoid)
    if has("aspect_ratio_ids") and "pixel_values" in out and out["pixel_values"].dim() == 4:
        # Mllama: (B, num_images, num_tiles, C, H, W) with one aspect-ratio id per image
        tiles = getattr(vision_config(config), "max_num_tiles", None) or 4
        x = out["pixel_values"]
        out["pixel_values"] = x[:, None, None].expand(B, 1, tiles, *x.shape[1:]).contiguous()
        out["aspect_ratio_ids"] = torch.ones((B, 1), dtype=torch.long)
        if has("aspect_ratio_mask"):
            out["aspect_ratio_mask"] = torch.ones((B, 1, tiles), dtype=torch.long)
        if has("cross_attention_mask") and "input_ids" in out:
            out["cross_attention_mask"] = torch.ones((B, out["input_ids"].shape[1], 1, tiles), dtype=torch.long)
    if has("image_token_pooling") and has("image_grids") and "pixel_values" in out and out["pixel_values"].dim() == 4:
        # crops pooled into tokens by patch-index windows (Molmo2): the processor's crop/pooling layout
        crop = crop_pooled_pixels(out["pixel_values"], _patch(config))
        out.update({k: v for k, v in crop.items() if k == "pixel_values" or has(k)})
    if has("image_embeds_position_mask") and "pixel_values" in out and "input_ids" in out:
        # Kosmos-2: latent_query_num image slots right after the first token, flagged by the mask
        n = int(getattr(config, "latent_query_num", 64) or 64)
        ids = out["input_ids"]
        slots = token_ids(gen, (B, n), vocab, avoid)
        out["input_ids"] = torch.cat([ids[:, :1], slots, ids[:, 1:]], dim=1)
        mask = torch.zeros_like(out["input_ids"], dtype=torch.bool)
        mask[:, 1:1 + n] = True
        out["image_embeds_position_mask"] = mask
        if "attention_mask" in out:
            out["attention_mask"] = torch.ones_like(out["input_ids"])
    if has("image_attention_mask") and "input_ids" in out and "pixel_values" in out and out["pixel_values"].dim() == 5:
        # Idefics: which of the sample's images each text token may attend to (B, S, num_images)
        out["image_attention_mask"] = torch.ones((*out["input_ids"].shape, out["pixel_values"].shape[1]), dtype=torch.long)
    if has("target_sizes") and "pixel_values" in out and out["pixel_values"].dim() == 4:
        p = _patch(config)
        h, w = out["pixel_values"].shape[-2:]
        out["target_sizes"] = torch.tensor([[h // p, w // p]] * B, dtype=torch.long)
    if has("qformer_input_ids"):
        qc = getattr(config, "qformer_config", None)
        qv = getattr(qc, "vocab_size", None) or vocab
        out["qformer_input_ids"] = token_ids(gen, (B, 6), qv, special_token_ids(qc) if qc is not None else set())
        if has("qformer_attention_mask"):
            out["qformer_attention_mask"] = torch.ones((B, 6), dtype=torch.long)
    if has("task_inputs"):
        tl = getattr(config, "task_seq_len", None) or 8
        out["task_inputs"] = token_ids(gen, (B, tl), vocab, avoid)
    if has("high_res_pixel_values"):
        hc = getattr(config, "high_res_vision_config", None)
        hs = getattr(hc, "image_size", None) or 64
        hh, hw = _as_hw(hs)
        out["high_res_pixel_values"] = torch.randn((B, getattr(hc, "num_channels", 3) or 3, hh, hw), generator=gen)
    if has("audio_mel"):
        mel = getattr(config, "input_feat_size", None) or getattr(config, "num_mel_bins", None) or 128
        out["audio_mel"] = torch.randn((B, 64, mel), generator=gen)
        if has("audio_mel_mask"):
            out["audio_mel_mask"] = torch.zeros((B, 64), dtype=torch.bool)
    if has("query_embeds"):
        nq = getattr(config, "num_query_tokens", None) or 8
        out["query_embeds"] = torch.randn((B, nq, getattr(config, "hidden_size", 32)), generator=gen)
    ehs = getattr(config, "encoder_hidden_size", None)
    if has("encoder_hidden_states") and isinstance(ehs, int) and "query_embeds" in out:
        # a standalone cross-attending query transformer (Q-Former): the frozen image encoder's states
        out["encoder_hidden_states"] = torch.randn((B, 9, ehs), generator=gen)
    if has("bool_masked_pos") and _is_required(params["bool_masked_pos"]):
        n = _num_patches(config)
        mask = torch.zeros((B, n), dtype=torch.bool)
        mask[:, ::2] = True
        out["bool_masked_pos"] = mask
    if has("flattened_patches"):
        vc = vision_config(config)
        p = getattr(vc, "patch_embed_hidden_size", None) or 3 * 16 * 16
        n = 12
        rows = torch.arange(n) // 4 + 1
        cols = torch.arange(n) % 4 + 1
        ids = torch.stack([rows, cols], dim=-1).float().expand(B, n, 2)
        out["flattened_patches"] = torch.cat([ids, torch.randn((B, n, p), generator=gen)], dim=-1)
        if has("attention_mask") and "attention_mask" not in out:
            out["attention_mask"] = torch.ones((B, n), dtype=torch.long)
        if has("decoder_input_ids"):
            out["decoder_input_ids"] = token_ids(gen, (B, T_DEC), vocab, avoid)
    if has("decoder_input_values"):  # speech decoders (SpeechT5 TTS): mel frames
        mel = getattr(config, "num_mel_bins", None) or 80
        out["decoder_input_values"] = torch.randn((B, T_DEC, mel), generator=gen)
    if has("past_values"):
        out.update(time_series_inputs(gen, config, has))
    if has("bbox"):
        x0 = torch.randint(0, 500, (B, seq, 1), generator=gen)
        y0 = torch.randint(0, 500, (B, seq, 1), generator=gen)
        w = torch.randint(1, 400, (B, seq, 1), generator=gen)
        h = torch.randint(1, 400, (B, seq, 1), generator=gen)
        out["bbox"] = torch.cat([x0, y0, x0 + w, y0 + h], dim=-1)
    if getattr(model, "_zoo_multiple_choice", None) or type(model).__name__.endswith("ForMultipleChoice"):
        for k in ("input_ids", "attention_mask", "token_type_ids", "bbox"):
            if k in out:  # (B, S) -> (B, num_choices=3, S)
                v = out[k]
                out[k] = torch.stack([v, v.roll(1, dims=-1 if k != "bbox" else -2), v.roll(2, dims=-1 if k != "bbox" else -2)], dim=1)
    for name in spec.get("drop") or ():  # inputs the forward takes but must not get together (data from overrides)
        out.pop(name, None)
    for id_name, positions in (spec.get("place") or {}).items():
        try:  # put a special token at fixed positions (data from overrides; a dotted path reaches sub-configs)
            tok = _dotted(config, id_name)
        except AttributeError:
            tok = None
        if isinstance(tok, int) and "input_ids" in out:
            for pos in positions:
                out["input_ids"][..., pos] = tok
    for name, recipe in (spec.get("tensors") or {}).items():  # explicit tensors (data from overrides)
        if name in params:  # a model-type entry serves several classes: each takes its own
            out[name] = tensor_from_recipe(gen, config, recipe, out, vocab, avoid)
    for name, value in (spec.get("values") or {}).items():  # non-tensor kwargs (data from overrides), e.g.
        if name in params:  # sample=False for a forward that otherwise draws noise; exporters bake them
            out[name] = value
    # parameters the generic rules cannot name: the shape the forward's docstring documents.  For
    # required ones, and for every documented tensor when nothing above applied (a forward over
    # domain-specific tensors: trajectories, latents, ...)
    fill_all = not out
    for name, p in params.items():
        if name in out or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) or (name in _NEVER and not _is_required(p)):
            continue
        if fill_all or _is_required(p):
            t = documented_input(gen, config, model, name, vocab, avoid)
            if t is not None:
                out[name] = t
    # required parameters we could not fill: say which
    for name, p in params.items():
        if name in out or name in _NEVER or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        if p.default is inspect.Parameter.empty:
            raise MissingInputRecipe(f"{type(model).__name__}.forward requires `{name}` and the zoo has no generic rule for it; "
                                     f"add an input recipe for model type {getattr(config, 'model_type', '?')!r} in sweeps/zoo/overrides/")
    nb = spec.get("batch_size")
    if nb is not None and nb != B:
        return first_samples(out, nb)
    return out


def first_samples(inputs: dict, n: int) -> dict:
    """The inputs of the first ``n`` samples (an override's ``batch_size``, for a forward that only runs at a
    smaller batch).  Only for inputs that are all batch-major: a flattened or packed input cannot be cut."""
    if not 0 < n <= B:
        raise ValueError(f"override batch_size must be in 1..{B}, got {n}")
    bad = [k for k, v in inputs.items() if v.dim() == 0 or v.shape[0] != B]
    if bad:
        raise ValueError(f"override batch_size {n}: inputs {bad} are not batch-major (leading dim {B}); cannot cut them")
    return {k: v[:n].contiguous() for k, v in inputs.items()}


class MissingInputRecipe(TypeError):
    pass


# ---- shapes documented in the forward's docstring -------------------------------------------
_DOC_ARG = r"^\s*{name} \(`torch\.(\w+)`\s+of shape\s+`[\[(](.*?)[\])]`"
_LEN_NAME = re.compile(r"len|frames|tokens|steps|positions|number_of|^num_|time", re.I)
_WIDTH_ALIASES = {"dim": "hidden_size", "embed_dim": "hidden_size", "d_model": "hidden_size", "hidden_dim": "hidden_size"}


def _config_int(config, name):
    for src in (config, getattr(config, "text_config", None)):
        v = getattr(src, name, None) if src is not None else None
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def _eval_dim(expr: str, config, seq: int) -> int | None:
    """One documented dimension: an int, ``batch_size``, a config field (``config.x`` or ``x``),
    a length-like name (the sequence length) or simple arithmetic of those (``dim * len(config.ids)``)."""
    import ast

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "config":
            v = getattr(config, node.attr, None)
            if isinstance(v, (list, tuple)):
                return list(v)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
            raise ValueError(node.attr)
        if isinstance(node, ast.Name):
            n = node.id
            if n == "batch_size":
                return B
            v = _config_int(config, n)
            if v is None and n in _WIDTH_ALIASES:
                v = _config_int(config, _WIDTH_ALIASES[n])
            if v is not None:
                return v
            if n in ("height", "width"):  # image planes: the (tiny) image size the pixel recipes use
                h, w = _as_hw(getattr(vision_config(config), "image_size", None) or getattr(config, "image_size", None))
                return h if n == "height" else w
            if _LEN_NAME.search(n) or n in ("sequence_length", "seq_len", "length"):
                return seq
            raise ValueError(n)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len" and len(node.args) == 1:
            v = ev(node.args[0])
            if isinstance(v, list):
                return len(v)
            raise ValueError("len")
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv)):
            a, b = ev(node.left), ev(node.right)
            if not (isinstance(a, int) and isinstance(b, int)):
                raise ValueError("operand")
            return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b, ast.FloorDiv: a // max(b, 1)}[type(node.op)]
        raise ValueError(ast.dump(node))

    try:
        v = ev(ast.parse(expr.strip(), mode="eval").body)
    except (SyntaxError, ValueError):
        return None
    return v if isinstance(v, int) and v > 0 else None


def documented_shape(model, name: str, config, seq: int = S):
    """(torch type name, shape) of a forward argument as its docstring documents it, or None."""
    doc = getattr(type(model).forward, "__doc__", None) or ""
    m = re.search(_DOC_ARG.format(name=re.escape(name)), doc, re.M)
    if not m:
        return None
    dims = [_eval_dim(d, config, seq) for d in _split_dims(m.group(2))]
    if not dims or any(d is None for d in dims):
        return None
    return m.group(1), tuple(dims)


def _split_dims(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p for p in parts if p.strip()]


def documented_input(gen, config, model, name: str, vocab: int, avoid: set[int]):
    """A tensor of the documented shape: masks all ones, ids in the vocab, other integer tensors
    small indices (< S), float tensors standard normal."""
    found = documented_shape(model, name, config)
    if found is None:
        return None
    kind, shape = found
    if "mask" in name:
        return torch.ones(shape, dtype=torch.bool if kind == "BoolTensor" else torch.long)
    if kind in ("LongTensor", "IntTensor"):
        if name.endswith("ids"):
            return token_ids(gen, shape, vocab, avoid)
        return torch.randint(0, S, shape, generator=gen)
    if kind == "BoolTensor":
        return torch.ones(shape, dtype=torch.bool)
    return torch.randn(shape, generator=gen)


# ---- explicit tensors from override data ------------------------------------------------------
def _resolve_dim(d, config, out):
    """A dim in override data: an int, "B"/"S"/"T", "<input>.<axis>" (a dim of an input built
    above, e.g. "pixel_values.2"), or a config expression as in docstrings ("vision_config.hidden_size * 2")."""
    if isinstance(d, int):
        return d
    if d in ("B", "S", "T"):
        return {"B": B, "S": S, "T": T_DEC}[d]
    m = re.fullmatch(r"(\w+)\.(-?\d+)", d)
    if m and m.group(1) in out:
        return int(out[m.group(1)].shape[int(m.group(2))])
    expr = re.sub(r"\b([a-z_]\w*(?:\.\w+)+)", lambda mm: str(_dotted(config, mm.group(1))), d)
    expr = re.sub(r"\b([BST])\b", lambda mm: str({"B": B, "S": S, "T": T_DEC}[mm.group(1)]), expr)
    v = _eval_dim(expr, config, S)
    if v is None:
        raise ValueError(f"override tensor dim {d!r} does not resolve on {type(config).__name__}")
    return v


def _dotted(config, path):
    cur = config
    for k in path.split("."):
        cur = getattr(cur, k)
    return len(cur) if isinstance(cur, (list, tuple)) else cur


def tensor_from_recipe(gen, config, recipe: dict, out: dict, vocab: int, avoid: set[int]) -> torch.Tensor:
    """{"shape": [dims], "kind": "float" | "rand" | "ids" | "ones" | "zeros" | "int" | "like", "high": dim,
    "dtype": "long" | "bool" | "float", "of": input name (for "like": same shape, fresh values)}."""
    kind = recipe.get("kind", "float")
    if kind == "like":
        shape = tuple(out[recipe["of"]].shape)
    else:
        shape = tuple(_resolve_dim(d, config, out) for d in recipe["shape"])
    dtype = {"long": torch.long, "bool": torch.bool, "float": torch.float32}[recipe.get("dtype", "long" if kind in ("ids", "int") else "float")]
    if kind in ("float", "like"):
        t = torch.randn(shape, generator=gen)
    elif kind == "rand":  # uniform [0, 1): flow-matching times, probabilities
        t = torch.rand(shape, generator=gen)
    elif kind == "ids":
        t = token_ids(gen, shape, vocab, avoid)
    elif kind == "int":
        t = torch.randint(int(_resolve_dim(recipe.get("low", 0), config, out)),
                          int(_resolve_dim(recipe["high"], config, out)), shape, generator=gen)
    elif kind == "ones":
        t = torch.ones(shape)
    elif kind == "zeros":
        t = torch.zeros(shape)
    else:
        raise ValueError(f"unknown override tensor kind {kind!r}")
    return t.to(dtype)


# Layout alternatives: the config cannot say whether audio features are (B, mel, T) or
# (B, T, mel), or whether images come as (B, C, H, W) or (B, num_images, C, H, W).  When the
# first forward fails, build_tiny tries these in order and keeps the first that runs.
def _transpose_features(inputs, config, model):
    x = inputs.get("input_features")
    if x is None or x.dim() != 3:
        return None
    out = dict(inputs)
    out["input_features"] = x.transpose(1, 2).contiguous()
    for mk in ("feature_attention_mask", "input_features_mask", "audio_attention_mask"):
        if mk in out:
            out[mk] = torch.ones(out["input_features"].shape[:2], dtype=torch.long)
    return out


def _features_4d(inputs, config, model):
    """Spectrogram as a one-channel image (B, 1, T, mel) (CLAP's HTSAT tower)."""
    x = inputs.get("input_features")
    if x is None or x.dim() != 3:
        return None
    out = dict(inputs)
    out["input_features"] = x.transpose(1, 2).unsqueeze(1).contiguous()
    return out


def _images_5d(inputs, config, model):
    x = inputs.get("pixel_values")
    if x is None or x.dim() != 4:
        return None
    out = dict(inputs)
    out["pixel_values"] = x.unsqueeze(1)
    return out


def _waveform_3d(inputs, config, model):
    x = inputs.get("input_values")
    if x is None or x.dim() != 2:
        return None
    out = dict(inputs)
    out["input_values"] = x.unsqueeze(1)
    out.pop("attention_mask", None) if out.get("attention_mask") is not None and out["attention_mask"].shape == x.shape else None
    return out


def _images_as_patches(inputs, config, model):
    x = inputs.get("pixel_values")
    p = _patch(config)
    if x is None or x.dim() != 4 or not p:
        return None
    out = dict(inputs)
    out["pixel_values"], _ = patchify(x, p)
    return out


def _with_image_sizes(inputs, config, model):
    x = inputs.get("pixel_values")
    if x is None or "image_sizes" in inputs or x.dim() != 4 or "image_sizes" not in inspect.signature(model.forward).parameters:
        return None
    out = dict(inputs)
    out["image_sizes"] = torch.tensor([list(x.shape[-2:])] * x.shape[0])
    return out


def _patches_as_images(inputs, config, model):
    x = inputs.get("pixel_values")
    if x is None or x.dim() != 2 or not ("image_grid_thw" in inputs or "grid_thw" in inputs):
        return None
    p = _patch(config)
    c = x.shape[1] // (p * p)
    if c * p * p != x.shape[1]:
        return None
    out = dict(inputs)
    out["pixel_values"] = x.reshape(x.shape[0], c, p, p)
    return out


def _packed_patches_with_hw_grid(inputs, config, model):
    """All images' patches concatenated (sum(h*w), C*p*p) with a (num_images, 2) patch grid (image_grid_hw:
    RADIO towers in Nemotron-H Omni), for forwards that take the grid as optional."""
    x = inputs.get("pixel_values")
    if x is None or x.dim() != 4 or "image_grid_hw" in inputs or \
            "image_grid_hw" not in inspect.signature(model.forward).parameters:
        return None
    out = dict(inputs)
    patches, out["image_grid_hw"] = patchify(x, _patch(config))
    out["pixel_values"] = patches.reshape(-1, patches.shape[-1])
    return out


def _patches_per_image(inputs, config, model):
    """Flattened patches padded per image, (num_images, max_patches, D) (ColQwen2's processor)."""
    x, grid = inputs.get("pixel_values"), inputs.get("image_grid_thw")
    if x is None or grid is None or x.dim() != 2 or x.shape[0] % grid.shape[0]:
        return None
    out = dict(inputs)
    out["pixel_values"] = x.reshape(grid.shape[0], x.shape[0] // grid.shape[0], x.shape[1])
    return out


def _packed_patches(inputs, config, model):
    """MiniCPM-V style: all images' patches packed side by side in one (1, C, p, N*p) strip,
    with target_sizes giving each image's patch grid."""
    x = inputs.get("pixel_values")
    if x is None or x.dim() != 4 or "target_sizes" not in inputs:
        return None
    p = _patch(config)
    b, c, h, w = x.shape
    gh, gw = h // p, w // p
    patches = x[:, :, : gh * p, : gw * p].reshape(b, c, gh, p, gw, p).permute(1, 3, 0, 2, 4, 5)  # c, p, b, gh, gw, p
    out = dict(inputs)
    out["pixel_values"] = patches.reshape(1, c, p, b * gh * gw * p).contiguous()
    return out


def _with_pixel_mask(inputs, config, model, five_d=False):
    x = inputs.get("pixel_values")
    if x is None or x.dim() != 4 or "pixel_attention_mask" in inputs or \
            "pixel_attention_mask" not in inspect.signature(model.forward).parameters:
        return None
    out = dict(inputs)
    if five_d:
        x = out["pixel_values"] = x.unsqueeze(1)
    out["pixel_attention_mask"] = torch.ones((*x.shape[:-3], *x.shape[-2:]), dtype=torch.bool)
    return out


def _with_tile_mask(inputs, config, model):
    """Tiled images (B, tiles, C, H, W) with a per-tile validity mask (B, tiles) (Granite-Docling)."""
    x = inputs.get("pixel_values")
    if x is None or x.dim() != 4 or "pixel_attention_mask" in inputs or \
            "pixel_attention_mask" not in inspect.signature(model.forward).parameters:
        return None
    out = dict(inputs)
    out["pixel_values"] = x.unsqueeze(1)
    out["pixel_attention_mask"] = torch.ones((x.shape[0], 1), dtype=torch.bool)
    return out


def _image_pairs(inputs, config, model):
    x = inputs.get("pixel_values")
    if x is None or x.dim() != 4:
        return None
    out = dict(inputs)
    out["pixel_values"] = torch.stack([x, x.flip(-1)], dim=1)  # keypoint matching: (B, 2, C, H, W)
    return out


def _text_line_images(inputs, config, model):
    x = inputs.get("pixel_values")
    if x is None or x.dim() != 4:
        return None
    out = dict(inputs)  # OCR recognizers / deep CNNs: a 64x128 text-line image survives 32x downsampling
    out["pixel_values"] = torch.nn.functional.interpolate(x, size=(64, 128), mode="bilinear", align_corners=False)
    return out


ALTERNATIVES = (
    ("images with a pixel mask", _with_pixel_mask),
    ("images (B, num_images, C, H, W) with a pixel mask", lambda i, c, m: _with_pixel_mask(i, c, m, five_d=True)),
    ("images (B, tiles, C, H, W) with a per-tile mask (B, tiles)", _with_tile_mask),
    ("patches packed in one strip (MiniCPM-V)", _packed_patches),
    ("flattened patches as (N, C, p, p)", _patches_as_images),
    ("flattened patches padded per image (num_images, max_patches, D)", _patches_per_image),
    ("images with their sizes (image_sizes)", _with_image_sizes),
    ("packed patches with a (num_images, 2) patch grid (image_grid_hw)", _packed_patches_with_hw_grid),
    ("images as patch sequences (B, N, C*p*p)", _images_as_patches),
    ("audio features (B, T, mel)", _transpose_features),
    ("images (B, num_images, C, H, W)", _images_5d),
    ("audio features as a one-channel image (B, 1, T, mel)", _features_4d),
    ("waveform (B, channels, samples)", _waveform_3d),
    ("image pairs (B, 2, C, H, W)", _image_pairs),
    ("larger text-line images (64x128)", _text_line_images),
)
