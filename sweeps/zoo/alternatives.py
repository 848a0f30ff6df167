"""Input layout alternatives that ``build_tiny`` tries when a forward refuses the generic inputs."""

from __future__ import annotations

import inspect

import torch

from .inputs import _patch, patchify


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
