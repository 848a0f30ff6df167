"""Model patch (Kosmos-2): the text model's attention mask over the keys a static cache returns.

Cause. ``Kosmos2TextTransformer._prepare_decoder_attention_mask`` (models/kosmos2/modeling_kosmos2.py:926) builds
its causal mask over ``past_key_values_length + query_length`` columns, the positions written so far, and none at
all for one query. That is the keys' length over a dynamic cache, not over a static one, whose layers return all
``max_cache_len`` slots: the prompt's mask has 71 columns beside 71 + n keys (``generate(cache_implementation=
'static')`` fails in eager: 'The size of tensor a (73) must match the size of tensor b (71) at non-singleton
dimension 3'), and a one-token call, with no mask, would attend over the slots not written yet.

What this changes (only over a static cache: its first layer with a ``cumulative_length`` tensor and a
``max_cache_len``, models/_static_slots.py). While
the text transformer's forward runs over such a cache, the mask is built over its ``max_cache_len`` columns: query
i (at position ``past + i``) sees slot j where ``j <= past + i``, every later slot (not written yet) gets the
dtype's minimum, as the original's causal part gives the columns it has. A 2D ``attention_mask`` is read over the
same columns (one over the written positions only is padded with zeros: those slots are masked anyway); a 4D one,
which generate builds itself over a static cache (``create_masks_for_generate``), already spans the keys and is
taken as it is (boolean: kept -> 0, else the minimum). Without a cache or over a dynamic one the original runs.

    before: causal [q, past + q] (+ expanded mask [q, past + q]); none where q == 1
    after:  causal [q, max_cache_len], 0 where slot <= past + i, else min (+ expanded mask [q, max_cache_len])

Remove when: Kosmos-2's text model builds its mask with masking_utils' create_causal_mask (over the cache's key
length and ``cache_position``), as the models generate's static cache was built for do.
"""

from __future__ import annotations

import contextvars
import functools
import inspect

import torch

from exporters.utils import register_patch
from exporters.workarounds.models._static_slots import static_self_layer

_TEXT = "transformers.models.kosmos2.modeling_kosmos2.Kosmos2TextTransformer"
# the static cache's key length while the text transformer's forward runs over one, else None
_KEY_LENGTH: contextvars.ContextVar[int | None] = contextvars.ContextVar("kosmos2_static_key_length", default=None)


def static_key_length(cache) -> int | None:
    """The length of the keys ``cache`` returns where it is a static one (every layer ``max_cache_len`` slots), else
    None (no cache, a dynamic one)."""
    layer = static_self_layer(cache, 0)
    return None if layer is None else int(layer.max_cache_len)


def _mask_over_keys(attention_mask, input_shape, inputs_embeds, past_key_values_length, key_length: int):
    """The decoder mask ``[batch, 1, q, key_length]``: causal by position over every slot, the caller's mask added."""
    dtype, device = inputs_embeds.dtype, inputs_embeds.device
    lowest = torch.finfo(dtype).min
    if attention_mask is not None and attention_mask.dim() == 4:  # generate's own, over the static cache's keys
        if attention_mask.dtype == torch.bool:
            return torch.zeros((), dtype=dtype, device=device).masked_fill(~attention_mask, lowest)
        return attention_mask.to(dtype)
    batch, length = input_shape[0], input_shape[-1]
    rows = torch.arange(length, device=device).unsqueeze(-1) + past_key_values_length
    slots = torch.arange(key_length, device=device).unsqueeze(0)
    causal = torch.zeros((length, key_length), dtype=dtype, device=device).masked_fill(slots > rows, lowest)
    causal = causal[None, None].expand(batch, 1, length, key_length)
    if attention_mask is None:
        return causal
    if attention_mask.shape[-1] < key_length:  # over the written positions only: the later slots are masked anyway
        attention_mask = torch.nn.functional.pad(attention_mask, (0, key_length - attention_mask.shape[-1]))
    expanded = attention_mask[:, None, None, :].expand(batch, 1, length, key_length).to(dtype)
    inverted = 1.0 - expanded
    return inverted.masked_fill(inverted.to(torch.bool), lowest) + causal


@register_patch("dynamo", f"{_TEXT}.forward")
def _patch_kosmos2_text_forward(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        cache = signature.bind_partial(self, *args, **kwargs).arguments.get("past_key_values")
        token = _KEY_LENGTH.set(static_key_length(cache))
        try:
            return original(self, *args, **kwargs)
        finally:
            _KEY_LENGTH.reset(token)

    return forward


@register_patch("dynamo", f"{_TEXT}._prepare_decoder_attention_mask")
def _patch_kosmos2_decoder_mask(original):
    @functools.wraps(original)
    def prepare(self, attention_mask, input_shape, inputs_embeds, past_key_values_length):
        key_length = _KEY_LENGTH.get()
        if key_length is None:
            return original(self, attention_mask, input_shape, inputs_embeds, past_key_values_length)
        return _mask_over_keys(attention_mask, input_shape, inputs_embeds, past_key_values_length, key_length)

    return prepare
