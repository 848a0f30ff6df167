"""Model patch (Granite Speech, Granite Speech Plus): the conformer's block attention masks its last,
padded block without a strided slice of a dynamic step; the audio projector counts its windows in
integer arithmetic.

Cause. ``GraniteSpeechConformerAttention.forward`` (models/granite_speech/modeling_granite_speech.py:169,
copied as ``GraniteSpeechPlusConformerAttention`` in models/granite_speech_plus) cuts the audio frames
into blocks of ``context_size``, right-pads the last one and masks its padded rows and columns with

    if remainder > 0:
        pos_attn[num_blocks - 1 : pos_attn.shape[0] : num_blocks].masked_fill_(mask, mask_value)

With a dynamic number of frames, ``num_blocks`` is a symbol, and a slice whose step is a symbol has a
length torch.export cannot express from the input sizes: ``PendingUnbackedSymbolNotFound: Pending
unbacked symbols {u3, u2} not in returned outputs FakeTensor(..., size=(u0, 4, 200, 200))``. The
``if remainder > 0`` would also pin the number of frames to one side of a multiple of the block.

What this changes (while tracing only). The scores are viewed as ``(batch, num_blocks, heads, c, c)``
and one mask over ``(num_blocks, 1, c, c)`` selects the last block's entries outside its
``num_features - (num_blocks - 1) * c`` valid rows and columns; ``masked_fill`` writes the same
``-finfo.max`` there, so the attention gets the very same scores. When the frames fill the blocks
(remainder 0) the valid length is the whole block and the mask is empty, as the original's skipped
branch; the pad is then 0 frames. No branch on the frame count remains.

    before: if remainder > 0: pad; pos_attn[nb - 1 :: nb].masked_fill_(mask, -max)
    after:  pad by nb * c - n; pos_attn.view(b, nb, h, c, c).masked_fill(last_block & outside_valid, -max)

The projector. ``GraniteSpeechEncoderProjector.forward`` (modeling_granite_speech.py:105, and its Plus
copy) counts its query windows as ``math.ceil(seq_len / self.window_size)``: with a dynamic number of
frames that is a float division and a ``math.ceil`` node in the graph, which the program serializer
refuses (``SerializeError: Failed serializing node ceil ... op <built-in function ceil> is not in
_SYM_OPS``). The patched projector takes ``(seq_len + window - 1) // window``, the same integer.

    before: nblocks = math.ceil(seq_len / window)          -> sym_float, math.ceil node
    after:  nblocks = (seq_len + window - 1) // window     -> FloorDiv, same value

Remove when: the conformer attention masks the padded block without a slice stepped by the block
count and without branching on the remainder (transformers' modeling_granite_speech.py and
modeling_granite_speech_plus.py), and the projector and attention count blocks with integer ceil division.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from exporters.utils import register_patch

CONFORMER_ATTENTION_PATHS: tuple[str, ...] = (
    "transformers.models.granite_speech.modeling_granite_speech.GraniteSpeechConformerAttention.forward",
    "transformers.models.granite_speech_plus.modeling_granite_speech_plus.GraniteSpeechPlusConformerAttention.forward",
)

PROJECTOR_PATHS: tuple[str, ...] = (
    "transformers.models.granite_speech.modeling_granite_speech.GraniteSpeechEncoderProjector.forward",
    "transformers.models.granite_speech_plus.modeling_granite_speech_plus.GraniteSpeechPlusEncoderProjector.forward",
)


@register_patch("dynamo", *CONFORMER_ATTENTION_PATHS)
def _patch_conformer_block_mask(original):
    """The conformer attention masked its last padded block through a slice stepped by the (dynamic) block
    count, behind ``if remainder > 0``: the same mask over a (batch, blocks, ...) view, with no branch.

    before: pos_attn[num_blocks - 1 : pos_attn.shape[0] : num_blocks].masked_fill_(mask, mask_value)
    after:  pos_attn.view(b, num_blocks, h, c, c).masked_fill(last_block_mask, mask_value)
    """

    @functools.wraps(original)
    def forward(self, hidden_states: torch.Tensor, attention_dists: torch.Tensor) -> torch.Tensor:
        hidden_states = self.pre_norm(hidden_states)
        bsz, num_features, _ = hidden_states.shape
        context = self.context_size

        num_blocks = (num_features + context - 1) // context
        hidden_states = F.pad(hidden_states, (0, 0, 0, num_blocks * context - num_features))

        query_states = self.to_q(hidden_states)
        key_states, value_states = self.to_kv(hidden_states).chunk(2, dim=-1)

        flat_bsz = bsz * num_blocks
        query_states = query_states.reshape(flat_bsz, context, self.num_heads, -1).transpose(1, 2)
        key_states = key_states.reshape(flat_bsz, context, self.num_heads, -1).transpose(1, 2)
        value_states = value_states.reshape(flat_bsz, context, self.num_heads, -1).transpose(1, 2)

        rel_pos_emb = self.rel_pos_emb(attention_dists)
        pos_attn = torch.einsum("b h c d, c r d -> b h c r", query_states, rel_pos_emb) * self.scale

        # the last block holds `valid` frames (all `context` when they fill it): mask the rest of it
        valid = num_features - (num_blocks - 1) * context
        device = hidden_states.device
        inside = torch.arange(context, device=device) < valid
        outside = ~(inside[:, None] & inside[None, :])
        last = torch.arange(num_blocks, device=device) == num_blocks - 1
        mask = last[:, None, None, None] & outside[None, None]
        mask_value = -torch.finfo(pos_attn.dtype).max
        pos_attn = pos_attn.reshape(bsz, num_blocks, *pos_attn.shape[1:]).masked_fill(mask, mask_value)
        pos_attn = pos_attn.reshape(flat_bsz, *pos_attn.shape[2:])

        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            out = F.scaled_dot_product_attention(
                query_states, key_states, value_states, attn_mask=pos_attn, scale=self.scale
            )
        out = out.transpose(1, 2).reshape(bsz, hidden_states.shape[1], -1)
        out = self.to_out(out[:, :num_features, :])
        return self.dropout(out)

    return forward


@register_patch("dynamo", *PROJECTOR_PATHS)
def _patch_projector_integer_blocks(original):
    """The audio projector counted its windows with ``math.ceil`` of a float division (a node the program
    serializer refuses for a dynamic length): the same count by integer ceil division.

    before: nblocks = math.ceil(seq_len / self.window_size)
    after:  nblocks = (seq_len + self.window_size - 1) // self.window_size
    """

    @functools.wraps(original)
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        batch_size, seq_len, dim = hidden_states.size()
        nblocks = (seq_len + self.window_size - 1) // self.window_size
        pad = nblocks * self.window_size - seq_len
        hidden_states = F.pad(hidden_states, (0, 0, 0, pad), "constant", 0)
        hidden_states = hidden_states.view(batch_size * nblocks, self.window_size, dim)

        query_output = self.qformer(
            query_embeds=self.query,
            encoder_hidden_states=hidden_states,
            encoder_attention_mask=None,
            return_dict=True,
        )
        return self.linear(
            query_output.last_hidden_state.view(batch_size, nblocks * self.window_size // self.downsample_rate, -1)
        )

    return forward
