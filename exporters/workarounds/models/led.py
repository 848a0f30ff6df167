"""Model patch (LED): the decoder's one-token self-attention masked to the slots written, over a static cache.

Cause. ``LEDDecoder.forward`` (models/led/modeling_led.py:1651) builds its causal mask only for a call over more
than one token ("only create a causal mask when we go over a single token"), which holds over a dynamic cache
(the keys are the positions written so far), not over a static cache, whose keys are ``max_cache_len`` slots,
the unwritten ones zero: a one-token call then weighs those slots too. The static step feeds the decoder
prompt one token a call, so its first call attended to 15 unwritten slots of 16 and left the default generate
at step 0 (test_generate dynamo/static: 254 of 256 logits differ, 5.56 at worst, at 195e834; eager over a
static cache, the prompt a token a call, the same).

What this changes (only for the decoder's self-attention over a static cache layer, one with a
``cumulative_length`` tensor and a maximum length, and only where the decoder passed no mask: its one-token
calls). Each query attends to the slots written once this call has written its own, ``j < past + tgt_len``
(for one token: the positions so far and itself, the keys a dynamic cache holds), as an additive
``[batch, 1, tgt_len, max_cache_len]`` mask. Cross-attention, the encoder, calls with a mask, and
self-attention without a cache or over a dynamic one run the original unchanged.

    before: attention_mask=None                    (every one of max_cache_len slots attended)
    after:  attention_mask[b, 0, i, j] = 0 if j < past + tgt_len else finfo.min

Remove when: LEDDecoder builds its mask for one-token calls as well (as Bart's decoder does).
"""

from __future__ import annotations

import functools

from exporters.utils import register_patch
from exporters.workarounds.models._static_slots import static_self_layer, written_slots_mask


@register_patch("dynamo", "transformers.models.led.modeling_led.LEDDecoderAttention.forward")
def _patch_led_static_one_token_mask(original):
    @functools.wraps(original)
    def forward(self, hidden_states, key_value_states=None, past_key_values=None, attention_mask=None,
                output_attentions=False, **kwargs):
        layer = None
        if key_value_states is None and attention_mask is None:
            layer = static_self_layer(past_key_values, self.layer_idx)
        if layer is not None:
            batch, queries = hidden_states.shape[:2]
            mask = written_slots_mask(layer.cumulative_length, queries, layer.max_cache_len, hidden_states.dtype)
            attention_mask = mask[None, None].expand(batch, 1, queries, layer.max_cache_len)
        return original(self, hidden_states, key_value_states=key_value_states, past_key_values=past_key_values,
                        attention_mask=attention_mask, output_attentions=output_attentions, **kwargs)

    return forward
