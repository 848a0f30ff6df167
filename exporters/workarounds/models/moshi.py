"""Model patch (Moshi): over a cache that keeps every position, the window eager's sliding-window cache gives.

Cause. Moshi's config sets ``sliding_window``, so the cache eager generate builds (``DynamicCache(config)``)
has ``DynamicSlidingWindowLayer``s, which keep only the last ``sliding_window - 1`` positions between calls,
but ``MoshiModel.forward`` masks with ``create_causal_mask`` (models/moshi/modeling_moshi.py:775), never the
window. What eager computes is therefore the cache's doing: a call attends causally to the positions the
layer kept before it (the last ``window - 1``) and to its own tokens, so the prompt (one call) sees itself
whole and each decode step the ``window - 1`` positions before it. The generation export keeps every
position instead (a plain dynamic layer, exporters/generation/sliding_forms.py, or a full-length static
one) and leaves the window to the model's mask, which has none here: teacher-forced logits differed from
eager's by 3.19 from step 1 (tiny config: window 4, prompt 7; test_generate dynamo/dynamic and dynamo/static).

What this changes (while tracing only, and only where the cache's layers keep every position: no
``DynamicSlidingWindowLayer`` or ``StaticSlidingWindowLayer``). The mask Moshi builds gets one more condition,
that a key be no earlier than ``window - 1`` positions before the call's first token,

    before: kv <= q                                  (causal over every position kept)
    after:  kv <= q and kv >= past - (window - 1)    (past: the positions cached before this call)

which is what eager's layer lets the call see. Without a cache (the forward export), or over eager's own
sliding-window layers, the original mask is built unchanged.

Remove when: MoshiModel masks with create_sliding_window_causal_mask when config.sliding_window is set (as
Mistral does); the sweep's reference then changes with it.
"""

from __future__ import annotations

import functools

import torch

from exporters.utils import register_patch


def keeps_every_position(cache) -> bool:
    """Whether ``cache`` has layers and none of them is a sliding-window one (each keeps every position)."""
    from transformers.cache_utils import DynamicSlidingWindowLayer, StaticSlidingWindowLayer

    layers = getattr(cache, "layers", None)
    return bool(layers) and not any(isinstance(layer, (DynamicSlidingWindowLayer, StaticSlidingWindowLayer))
                                    for layer in layers)


def kept_by_window(past, window: int):
    """``and_mask_function`` for masking_utils: key ``kv`` is visible when it is one of the last ``window - 1``
    positions before the call (which starts at position ``past``) or later."""
    first = past - (window - 1)

    def visible(batch_idx, head_idx, q_idx, kv_idx):
        return kv_idx >= first

    return visible


@register_patch("dynamo", "transformers.models.moshi.modeling_moshi.create_causal_mask")
def _patch_moshi_window(original):
    from transformers.masking_utils import and_masks

    @functools.wraps(original)
    def create_causal_mask(config, inputs_embeds, attention_mask, past_key_values, position_ids=None,
                           *args, **kwargs):
        window = getattr(config, "sliding_window", None)
        if window is None or args or not keeps_every_position(past_key_values):
            return original(config, inputs_embeds, attention_mask, past_key_values, position_ids, *args, **kwargs)
        past = past_key_values.get_seq_length()
        if isinstance(past, torch.Tensor):
            past = past.reshape(())
        window_mask, given = kept_by_window(past, window), kwargs.get("and_mask_function")
        kwargs["and_mask_function"] = window_mask if given is None else and_masks(given, window_mask)
        return original(config, inputs_embeds, attention_mask, past_key_values, position_ids, **kwargs)

    return create_causal_mask
