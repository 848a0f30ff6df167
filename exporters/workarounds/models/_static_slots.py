"""Helpers for patches of decoders over a static cache (fsmt.py, led.py, gpt_neo.py): the static self-attention
layer a call writes to, and the mask of the slots written."""

from __future__ import annotations

import torch


def static_self_layer(cache, layer_idx: int | None):
    """The static self-attention layer ``layer_idx`` of ``cache`` (an EncoderDecoderCache's self-attention cache, or
    the cache itself): one with a ``cumulative_length`` tensor and a ``max_cache_len``; None for any other."""
    if cache is None or layer_idx is None:
        return None
    cache = getattr(cache, "self_attention_cache", cache)
    layers = getattr(cache, "layers", None)
    if not layers or layer_idx >= len(layers):
        return None
    layer = layers[layer_idx]
    written = getattr(layer, "cumulative_length", None)
    if not isinstance(written, torch.Tensor) or getattr(layer, "max_cache_len", None) is None:
        return None
    return layer


def written_slots_mask(past: torch.Tensor, queries: int, slots: int, dtype: torch.dtype) -> torch.Tensor:
    """``[1, slots]`` additive mask: every query sees the slots written once this call wrote its ``queries``
    tokens after the ``past`` ones, ``j < past + queries`` (the keys a dynamic cache would hold)."""
    written = past.reshape(()).to(torch.long) + queries
    seen = torch.arange(slots, device=past.device)[None, :] < written
    zero = torch.zeros((), dtype=dtype, device=past.device)
    return torch.where(seen, zero, torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=past.device))
