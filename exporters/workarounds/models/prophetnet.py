"""Model patch (ProphetNet): the decode step's position id without a Python ``int`` of the length.

Cause. ``ProphetNetPositionalEmbeddings.forward`` (models/prophetnet/modeling_prophetnet.py) computes
a decode step's position as ``torch.ones((1, 1)) * int(self.padding_idx + num_input_ids)``, where
``num_input_ids`` is the past length plus the new tokens. With a dynamic cache the ``int()`` turns the
symbolic length into the traced number, and torch.export keeps the guard ``past + new == 8``: the
exported decode step refuses every other length ("torch.export recorded the condition
past_key_values__0.size()[2] + input_ids.size()[1] == 8", test_generate dynamo/dynamic at 54a9425).

What this changes (while tracing only). The same position, left symbolic: ``padding_idx + past + new``
added to a ``[1, 1]`` tensor of zeros, so the value follows the length at run time. The prompt path
(no cache yet, positions from the mask) and calls with ``position_ids`` go to ``forward`` unchanged.

    before: torch.ones((1, 1)) * int(padding_idx + past + new)   (guard: past + new == 8)
    after:  torch.zeros((1, 1)) + (padding_idx + past + new)     (no guard)

Remove when: ``ProphetNetPositionalEmbeddings.forward`` drops the ``int()`` cast.
"""

from __future__ import annotations

import functools

import torch

from exporters.utils import register_patch


@register_patch("dynamo", "transformers.models.prophetnet.modeling_prophetnet.ProphetNetPositionalEmbeddings.forward")
def _patch_prophetnet_decode_position(original):
    @functools.wraps(original)
    def forward(self, inputs_shape, device, attention_mask=None, past_key_values=None, position_ids=None):
        if position_ids is None and self.padding_idx is not None and past_key_values is not None \
                and past_key_values.get_seq_length() != 0:
            length = inputs_shape[1] + past_key_values.get_seq_length()
            position_ids = torch.zeros((1, 1), dtype=torch.long, device=device) + (self.padding_idx + length)
            return torch.nn.Embedding.forward(self, position_ids), position_ids
        return original(self, inputs_shape, device, attention_mask, past_key_values, position_ids)

    return forward
