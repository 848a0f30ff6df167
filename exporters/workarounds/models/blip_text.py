"""Model patch (Blip's text decoder): a static cache kept apart from the cross-attention keys.

Cause. ``BlipTextEncoder.forward`` (models/blip/modeling_blip_text.py:345-353) wraps a DynamicCache (or none) in an
EncoderDecoderCache, whose cross-attention half holds the image's keys and values; any other cache it passes on as
it is, so over a static cache the cross-attention layers write the image's positions (17 in the sweep's tiny
model) into the self-attention layers' slots: ``index_copy_(): index 13 is out of bounds for dimension 2 with size
13`` in eager ``generate(cache_implementation='static')`` of BlipTextLMHeadModel, which BlipForConditionalGeneration's
generate hands its text decoder to.

What this changes (only for a cache that is neither an EncoderDecoderCache nor a DynamicCache, with
``use_cache``: a static one). It is wrapped the same way, ``EncoderDecoderCache(cache, DynamicCache())``: the
static cache keeps the text's positions, and the cross-attention keys go to a cache of their own, computed from
``encoder_hidden_states`` at the call (as the static encoder-decoder step does for every encoder-decoder). Every
other cache, and no cache, runs the original unchanged.

    before: past_key_values = static cache          (text and image keys in the same layers)
    after:  past_key_values = EncoderDecoderCache(static cache, DynamicCache())

Remove when: BlipTextEncoder wraps every self-attention cache in an EncoderDecoderCache, not a DynamicCache only.
"""

from __future__ import annotations

import functools

from exporters.utils import register_patch


@register_patch("dynamo", "transformers.models.blip.modeling_blip_text.BlipTextEncoder.forward")
def _patch_blip_text_static_cache(original):
    @functools.wraps(original)
    def forward(self, hidden_states, attention_mask=None, encoder_hidden_states=None, encoder_attention_mask=None,
                past_key_values=None, use_cache=None, **kwargs):
        from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache

        if use_cache and isinstance(past_key_values, Cache) \
                and not isinstance(past_key_values, (DynamicCache, EncoderDecoderCache)):
            past_key_values = EncoderDecoderCache(past_key_values, DynamicCache(config=self.config))
        return original(self, hidden_states, attention_mask=attention_mask, encoder_hidden_states=encoder_hidden_states,
                        encoder_attention_mask=encoder_attention_mask, past_key_values=past_key_values,
                        use_cache=use_cache, **kwargs)

    return forward
