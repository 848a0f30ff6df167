"""Forward inputs for a tiny model, derived from the config and ``inspect.signature(model.forward)``.

Batch ``B`` = 2, text length ``S`` = 7, decoder length ``T`` = 5, so that no dim is 0/1 and
distinct dims have distinct sizes.  Everything is drawn from a seeded ``torch.Generator``.
"""

from __future__ import annotations

import inspect
import math
import re

import torch

from ._inputs_common import T_DEC, B, S, _as_hw, _sub, token_ids, vision_config
from .documented import _dotted, documented_input, tensor_from_recipe

_ID_KEY = re.compile(r"(_token_id|_token_index|_token_ids|_id)$")

# forward parameters we never fill (training-only, caching, output flags, alternatives)
_NEVER = {
    "labels", "inputs_embeds", "decoder_inputs_embeds", "past_key_values", "use_cache", "output_attentions",
    "output_hidden_states", "return_dict", "head_mask", "decoder_head_mask", "cross_attn_head_mask",
    "encoder_outputs", "cache_position", "position_ids", "decoder_position_ids", "return_loss", "kwargs",
    "logits_to_keep", "num_logits_to_keep", "interpolate_pos_encoding", "mc_labels", "start_positions",
    "end_positions", "next_sentence_label", "sentence_order_label", "bool_masked_pos", "noise",
    "mask_time_indices", "sampled_negative_indices", "output_router_logits", "past_values_mask",
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
    feat = (
        getattr(ac, "feature_projection_input_dim", None)
        or getattr(ac, "input_dim", None)
        or getattr(ac, "feature_size", None)
        or getattr(ac, "input_feat_per_channel", None)
        or getattr(ac, "input_feat_size", None)
        or 16
    )
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
            out["static_categorical_features"] = torch.stack([torch.randint(0, max(int(c), 1), (B,), generator=gen) for c in card], dim=1)
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
    return {
        "pixel_values": patches,
        "image_token_pooling": torch.cat(pooled),
        "image_grids": grids,
        "image_num_crops": torch.full((b,), 2, dtype=torch.long),
    }


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
    absent = {
        mod
        for mod, key in (("image", "vision_config"), ("audio", "audio_config"))
        if key in getattr(config, "sub_configs", {}) and getattr(config, key, None) is None
    }

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
                out["token_type_ids"] = torch.stack([torch.randint(0, max(int(t), 1), (B, seq), generator=gen) for t in tvs], dim=-1)
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
    if (
        has("pixel_values_videos")
        and not has("video_grid_thw")
        and (_is_required(params["pixel_values_videos"]) or not has("pixel_values"))
    ):
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
    if (
        has("input_features")
        and has("input_values")
        and not (_is_required(params["input_features"]) or _is_required(params["input_values"]))
    ):
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
        if (
            has("attention_mask")
            and "attention_mask" not in out
            and out["input_values"].dim() == 2
            and getattr(config, "feat_extract_norm", "layer") == "layer"
        ):
            out["attention_mask"] = torch.ones(out["input_values"].shape, dtype=torch.long)
    seqcls_encdec = type(model).__name__.endswith("ForSequenceClassification") and getattr(config, "is_encoder_decoder", False)
    if seqcls_encdec and "input_ids" in out and isinstance(getattr(config, "eos_token_id", None), int):
        # the head pools the decoder state at the (single, last) eos of each row; decoder
        # inputs are derived from input_ids by the model
        out["input_ids"][:, -1] = config.eos_token_id
    if seqcls_encdec and has("decoder_input_ids") and "input_ids" in out:
        out["decoder_input_ids"] = out["input_ids"].clone()
    if (
        has("decoder_input_ids")
        and not seqcls_encdec
        and "decoder_input_ids" not in out
        and (getattr(config, "is_encoder_decoder", False) or "input_ids" in out or _is_required(params["decoder_input_ids"]))
    ):
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
        mask[:, 1 : 1 + n] = True
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
            raise MissingInputRecipe(
                f"{type(model).__name__}.forward requires `{name}` and the zoo has no generic rule for it; "
                f"add an input recipe for model type {getattr(config, 'model_type', '?')!r} in sweeps/zoo/overrides/"
            )
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
