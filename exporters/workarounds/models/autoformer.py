"""Model patch (Autoformer): an attention mask that masks nothing is checked and dropped, as eager drops it.

Cause. ``AutoformerAttention.forward`` adds the 4-D padding mask to its autocorrelation weights with
``attn_weights.view(bsz, num_heads, tgt_len, src_len)`` (models/autoformer/modeling_autoformer.py:
516), but those weights are (bsz * heads, tgt_len, head_dim): unless head_dim happens to equal
src_len, any mask raises ("shape '[2, 2, 8, 8]' is invalid for input of size 512"). Eager passes
only because ``create_bidirectional_mask`` drops a mask that keeps every position, which it never
does under torch.export (masking_utils.py, ``is_torchdynamo_exporting``): the exported model gets
the mask and fails.

What this changes (while tracing only), when head_dim differs from src_len (the case eager cannot
run with a mask): the mask must keep every position, checked at run time in the graph
(``torch_compilable_check``: the artifact refuses a padding mask, where eager raises), and the
attention runs without it, as in eager. When head_dim equals src_len the call is unchanged.

    before: forward(h, attention_mask=m)   -> view error under export (eager never sees m)
    after:  check(m keeps all); forward(h, attention_mask=None)

Remove when: ``AutoformerAttention.forward`` applies the padding mask in the shape of its
autocorrelation weights, (bsz * heads, tgt_len, head_dim), instead of viewing them as (bsz, heads,
tgt_len, src_len) (transformers' modeling_autoformer.py).
"""

from __future__ import annotations

import functools

import torch

from exporters.utils import register_patch


def keeps_everything(mask: torch.Tensor) -> torch.Tensor:
    """A 0-d bool: the boolean or additive attention mask ``mask`` masks no position."""
    return mask.all() if mask.dtype == torch.bool else (mask == 0).all()


@register_patch("dynamo", "transformers.models.autoformer.modeling_autoformer.AutoformerAttention.forward")
def _patch_autoformer_all_keep_mask_dropped(original):
    from transformers.utils.import_utils import torch_compilable_check

    @functools.wraps(original)
    def forward(self, hidden_states, key_value_states=None, past_key_values=None, attention_mask=None, **kwargs):
        if attention_mask is not None and attention_mask.shape[-1] != self.head_dim:
            torch_compilable_check(keeps_everything(attention_mask),
                                   "AutoformerAttention cannot apply a padding mask (eager raises on one)")
            attention_mask = None
        return original(self, hidden_states, key_value_states=key_value_states, past_key_values=past_key_values,
                        attention_mask=attention_mask, **kwargs)

    return forward
