"""Model patch (Hiera MAE): the visible mask units gathered with a static count instead of
boolean compaction.

Cause. With an MAE head, ``HieraModel.forward`` keeps the visible tokens with
``hidden_states[positions].view(batch_size, -1, hidden_size)`` (models/hiera/modeling_hiera.py:
864-866). Boolean indexing has a data-dependent length (an unbacked ``u0``), and with a dynamic
batch and image size ``HieraEncoder.reroll`` then views that length through the unroll schedule
("Could not guard on data-dependent expression 64*((u0//64)) < 2"). Yet the count is fixed:
``HieraPatchEmbeddings.random_masking`` (line 188) marks exactly
``len_keep = int(num_windows * (1 - mask_ratio))`` mask units per image, whatever the noise, and
each unit covers ``prod(masked_unit_size)`` tokens.

What this changes (while tracing only, and only on the MAE path). The same tokens, in the same
order, are gathered with that known count: each kept token's rank in its row (a cumulative sum of
the keep flags) picks its slot, and slot r holds the position of the row's r-th kept token, in
increasing order, exactly the order boolean indexing yields (no sort: ONNX and the ExecuTorch
runtime have no stable sort). The rest of ``forward`` is unchanged. Without an MAE head (no mask)
the call goes to ``forward`` unchanged.

    before: h = h[mask.unsqueeze(-1).tile(1, area, hidden)].view(batch, -1, hidden)   # u0 tokens
    after:  keep = mask.tile(1, area); rank = cumsum(keep) - 1
            order[r] = argmax(where(keep, rank, K) == r)  for r < K = len_keep * area
            h = h.gather(1, order[..., None].expand(-1, -1, hidden))                  # static count

Remove when: ``HieraModel.forward`` keeps the visible tokens of an MAE run by gathering its known
number of mask units (``len_keep`` per image) instead of boolean indexing with ``positions``
(transformers' modeling_hiera.py).
"""

from __future__ import annotations

import functools
import math

import torch

from exporters.utils import register_patch
from exporters.workarounds.models._compaction import gather_rows, kept_in_order


def kept_tokens(hidden_states: torch.Tensor, bool_masked_pos: torch.Tensor, mask_unit_area: int,
                kept_units: int) -> torch.Tensor:
    """``hidden_states[positions].view(batch, -1, hidden)`` as Hiera computes it, for a mask with
    exactly ``kept_units`` True per row: a gather with a static count, same tokens, same order."""
    keep = bool_masked_pos.tile(1, mask_unit_area)  # token j belongs to mask unit j % num_windows
    torch._check(keep.shape[1] == hidden_states.shape[1],
                 lambda: f"Hiera: {keep.shape[1]} mask positions for {hidden_states.shape[1]} tokens")
    order, _ = kept_in_order(keep, kept_units * mask_unit_area)  # every row keeps exactly that many
    return gather_rows(hidden_states, order)


def kept_units(patch_embeddings) -> int:
    """How many mask units ``random_masking`` keeps per image (its own ``len_keep``)."""
    return int(math.prod(patch_embeddings.mask_spatial_shape) * (1 - patch_embeddings.mask_ratio))


@register_patch("dynamo", "transformers.models.hiera.modeling_hiera.HieraModel.forward")
def _patch_hiera_kept_units_static(original):
    from transformers.models.hiera import modeling_hiera as mh

    @functools.wraps(original)
    def forward(self, pixel_values=None, noise=None, output_attentions=None, output_hidden_states=None,
                interpolate_pos_encoding=None, return_dict=None, **kwargs):
        if pixel_values is None or not self.embeddings.is_mae:
            return original(self, pixel_values=pixel_values, noise=noise, output_attentions=output_attentions,
                            output_hidden_states=output_hidden_states,
                            interpolate_pos_encoding=interpolate_pos_encoding, return_dict=return_dict, **kwargs)
        config = self.config
        output_attentions = output_attentions if output_attentions is not None else config.output_attentions
        output_hidden_states = (output_hidden_states if output_hidden_states is not None
                                else config.output_hidden_states)
        return_dict = return_dict if return_dict is not None else config.return_dict

        embedding_output, bool_masked_pos, ids_restore = self.embeddings(
            pixel_values, interpolate_pos_encoding=interpolate_pos_encoding, noise=noise)
        hidden_states = mh.unroll(embedding_output, image_shape=(pixel_values.shape[-2], pixel_values.shape[-1]),
                                  patch_stride=config.patch_stride, schedule=self.unroll_schedule)
        hidden_states = kept_tokens(hidden_states, bool_masked_pos, math.prod(config.masked_unit_size),
                                    kept_units(self.embeddings.patch_embeddings))
        encoder_outputs = self.encoder(hidden_states, bool_masked_pos=bool_masked_pos,
                                       output_attentions=output_attentions,
                                       output_hidden_states=output_hidden_states, return_dict=return_dict)
        sequence_output = encoder_outputs[0]
        pooled_output = self.pooler(sequence_output) if self.pooler is not None else None
        if not return_dict:
            head_outputs = (sequence_output, pooled_output) if pooled_output is not None else (sequence_output,)
            return head_outputs + (bool_masked_pos, ids_restore) + encoder_outputs[1:]
        return mh.HieraModelOutput(
            last_hidden_state=sequence_output, pooler_output=pooled_output, bool_masked_pos=bool_masked_pos,
            ids_restore=ids_restore, hidden_states=encoder_outputs.hidden_states,
            attentions=encoder_outputs.attentions, reshaped_hidden_states=encoder_outputs.reshaped_hidden_states)

    return forward
