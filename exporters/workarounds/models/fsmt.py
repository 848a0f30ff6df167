"""Model patch (FSMT): the decoder's self-attention masked to the positions written, over a static cache.

Cause. ``FSMTModel.forward`` (models/fsmt/modeling_fsmt.py:857-866) builds the decoder's causal and padding
masks only when ``use_cache`` is off; with a cache it passes neither, which holds over a dynamic cache (the
keys are the positions written so far, and generate feeds the decoder one token per call), not over a
static cache, whose keys are ``max_cache_len`` slots, the unwritten ones zero: each query then gives those
slots the weight of a zero logit. The model's own ``generate(cache_implementation='static')`` differs from
its default generate by 2.6e-3 in the logits at step 0 (eager, the sweep's tiny model); the exported static
step, over the same cache, by 3.0e-3 (test_generate dynamo/static).

What this changes (only for the decoder's self-attention over a static cache layer, one with a
``cumulative_length`` tensor and a maximum length). Each query attends to the slots written once this call
has written its own, ``j < past + tgt_len``: the keys a dynamic cache would hold. That is not a causal mask,
and deliberately so: over a dynamic cache FSMT's decoder has none either, so a call with several decoder
tokens (the zoo's generate passes a 6-token decoder prompt) attends among them both ways, and the static
form gives what the dynamic one gives (a causal mask here left layer 1's cached keys of that prompt 2.2e-3
from eager's, test_generate onnx/static). An additive mask, added to any mask the caller gave.
Cross-attention, the encoder, and self-attention without a cache or over a dynamic one run the original
unchanged.

    before: attn_mask=None                         (every one of max_cache_len slots attended)
    after:  attn_mask[i, j] = 0 if j < past + tgt_len else finfo.min

Remove when: FSMT masks its decoder's attention to the positions written (for example with masking_utils'
create_causal_mask over the cache, as Bart does).
"""

from __future__ import annotations

import functools

from exporters.utils import register_patch
from exporters.workarounds.models._static_slots import static_self_layer, written_slots_mask


@register_patch("dynamo", "transformers.models.fsmt.modeling_fsmt.Attention.forward")
def _patch_fsmt_static_self_attention(original):
    @functools.wraps(original)
    def forward(self, query, key, key_padding_mask=None, layer_state=None, attn_mask=None,
                output_attentions=False, **kwargs):
        layer = None if self.encoder_decoder_attention else static_self_layer(layer_state, self.layer_idx)
        if layer is not None:
            mask = written_slots_mask(layer.cumulative_length, query.size(0), layer.max_cache_len,
                                      self.q_proj.weight.dtype)
            attn_mask = mask if attn_mask is None else attn_mask + mask
        return original(self, query, key, key_padding_mask=key_padding_mask, layer_state=layer_state,
                        attn_mask=attn_mask, output_attentions=output_attentions, **kwargs)

    return forward
