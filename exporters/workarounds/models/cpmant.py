"""Model patch (CpmAnt): the left-padding mask without a Python list of the sequence length.

Cause. ``CpmAntModel._prepare_attention_mask`` (models/cpmant/modeling_cpmant.py) builds the
left-padding mask from ``torch.tensor(list(range(seqlen - self.prompt_length))[::-1])``: a Python
list as long as the sequence, so torch.export fixes the sequence length at the traced one ("input
'input_ids' dim 1 is static in this artifact (exported as 8), got 9", test_generate dynamo/dynamic
at 54a9425: CpmAnt's generate re-feeds the whole sequence each step).

What this changes (while tracing only). The same descending positions as a tensor op,
``torch.arange(seqlen - prompt_length).flip(0)``; the rest of the mask is the original's.

    before: torch.tensor(list(range(L - p))[::-1])   (L baked)
    after:  torch.arange(L - p).flip(0)              (L symbolic)

Remove when: ``_prepare_attention_mask`` builds that range with ``torch.arange``.
"""

from __future__ import annotations

import functools

import torch

from exporters.utils import register_patch


@register_patch("dynamo", "transformers.models.cpmant.modeling_cpmant.CpmAntModel._prepare_attention_mask")
def _patch_cpmant_padding_mask(original):
    @functools.wraps(original)
    def _prepare_attention_mask(self, input_ids, span, context, length):
        batch, seqlen, device = input_ids.size(0), input_ids.size(1), input_ids.device
        directional = torch.arange(seqlen, device=device) <= torch.arange(seqlen, device=device).view(-1, 1)
        attention_mask = context[:, None, :] | (context[:, :, None].logical_not() & directional.view(1, seqlen, seqlen))
        attention_mask = attention_mask & (span[:, None, :] == span[:, :, None])
        positions = torch.arange(seqlen - self.prompt_length, device=device).flip(0)
        mask_1d = positions[None, :].repeat(batch, 1) < length[:, None]
        mask_1d = torch.cat((torch.ones(batch, self.prompt_length, device=device).bool(), mask_1d), dim=1)
        return mask_1d.view(batch, seqlen, 1) & mask_1d.view(batch, 1, seqlen) & attention_mask

    return _prepare_attention_mask
