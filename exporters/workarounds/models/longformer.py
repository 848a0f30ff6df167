"""Model patch: Longformer-style global attention with static shapes.

Cause. Longformer and LED's encoder self-attention mix a sliding window with "global" tokens
(``attention_mask == 2``, or ``global_attention_mask``): every token also attends to the global
ones, and a global token attends to the whole sequence through its own projections. The
encoder reads ``is_global_attn = is_index_global_attn.flatten().any().item()`` and the layers
branch on it, then gather the global positions with ``nonzero()`` into buffers sized by
``num_global.max()``: torch.export stops on the Python branch (``GuardOnDataDependentSymNode``),
and every shape after it depends on the mask values.

What this changes (while tracing only). ``*SelfAttention.forward`` computes the same attention
with every position a candidate global key and a candidate global query, masked:

- global-key scores for all L positions, ``finfo.min`` where the position is not global (the
  original fills its padding slots the same way), concatenated before the window scores;
- the output is ``probs[..., :L] @ v`` plus the window part, as the original sums its two parts;
- global-query attention for all positions, kept (``where``) only at the global tokens, which is
  where the original writes it.

Masked scores underflow to exactly 0 after the softmax, so each row has the same weights as the
original; only the summation order differs (~1e-7). With no global token in the batch (the original's
``is_global_attn`` False) the window part takes the softmax over the window scores alone, as the original
does, and the global-key part is exactly 0: the result equals the original's bit for bit (a decoder
generating over an LED encoder's output carried the ~1e-7 to 3.4e-05 by its fifth token). The work grows from L x (2w + 1 + g) to
L x (2w + 1 + L) scores per head: fine for export and tiny models, quadratic for long inputs.
``output_attentions=True`` runs the original (its outputs are shaped by the global count).

Longformer's question-answering and multiple-choice heads derive the global tokens from the
input (everything before the first separator): ``_get_question_end_index`` finds it with
``nonzero()`` and asserts three separators per row. Traced, it takes the first separator of each
row by ``argmax`` (the same index when the row is well formed); the three-separator check stays
eager's only.

Their ``_chunk`` makes overlapping chunks with ``as_strided`` over the strides of a view that is
not contiguous (the heads transposed out of [L, B, H, D]), after counting them with
``torch.div(L, 2w, rounding_mode="trunc")``, a tensor. Traced with a symbolic length the count is
a data-dependent size; exported to ONNX the ``as_strided`` reads the values as if contiguous
(window scores off by up to 1.4 in a layer; LongformerModel's output by 3.7e-4). Traced, it takes
the model's own ``onnx_export`` branch, ``unfold``, which computes the same chunks from values.

Remove when: Longformer's and LED's encoder self-attention computes global attention without
``.item()`` and ``nonzero()`` (a mask over a fixed number of global slots),
``_get_question_end_index`` finds the first separator without ``nonzero()``, and ``_chunk`` takes
its ``unfold`` spelling under export (transformers' modeling_longformer.py, modeling_led.py): check
with
``python -m sweeps.recheck workarounds --only
patch:dynamo:transformers.models.longformer.modeling_longformer.LongformerSelfAttention.forward``.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn

from exporters.utils import register_patch

GLOBAL_ATTENTION_PATHS: tuple[str, ...] = (
    "transformers.models.longformer.modeling_longformer.LongformerSelfAttention.forward",
    "transformers.models.led.modeling_led.LEDEncoderSelfAttention.forward",
)


def _heads(self, x: torch.Tensor, length: int, batch: int) -> torch.Tensor:
    """[L, B, E] -> [B, L, H, D]"""
    return x.view(length, batch, self.num_heads, self.head_dim).transpose(0, 1)


def dense_global_attention(self, hidden_states, attention_mask, is_index_masked, is_index_global_attn):
    """The module's attention output [B, L, E], global tokens included, with static shapes."""
    hidden_states = hidden_states.transpose(0, 1)  # [L, B, E]
    length, batch, embed_dim = hidden_states.size()
    window = self.one_sided_attn_window_size
    query = _heads(self, self.query(hidden_states) / math.sqrt(self.head_dim), length, batch)
    key = _heads(self, self.key(hidden_states), length, batch)
    value = _heads(self, self.value(hidden_states), length, batch)
    lowest = torch.finfo(query.dtype).min

    # window scores, padding removed, as the original computes them: [B, L, H, 2w + 1]
    window_scores = self._sliding_chunks_query_key_matmul(query, key, window)
    removed = (attention_mask != 0)[:, :, None, None]
    float_mask = removed.type_as(query).masked_fill(removed, lowest)
    window_scores = window_scores + self._sliding_chunks_query_key_matmul(
        float_mask.new_ones(size=float_mask.size()), float_mask, window
    )
    # every position as a global key, masked unless it is one: [B, L, H, L]
    global_key_scores = torch.einsum("blhd,bshd->blhs", query, key)
    global_key_scores = global_key_scores.masked_fill(~is_index_global_attn[:, None, None, :], lowest)

    scores = torch.cat((global_key_scores, window_scores), dim=-1)
    probs = nn.functional.softmax(scores, dim=-1, dtype=torch.float32)
    probs = torch.masked_fill(probs, is_index_masked[:, :, None, None], 0.0).type_as(scores)
    probs = nn.functional.dropout(probs, p=self.dropout, training=self.training)

    # with no global token in the batch, the original's softmax runs over the window scores alone: the same weights,
    # but a reduction over 2w + 1 values, not L + 2w + 1, rounds differently (LED's encoder output 2e-06 off eager,
    # carried to 3.4e-05 in a decoder's logits by the fifth generated token); take that softmax there, bit for bit
    window_probs = nn.functional.softmax(window_scores, dim=-1, dtype=torch.float32)
    window_probs = torch.masked_fill(window_probs, is_index_masked[:, :, None, None], 0.0).type_as(scores)
    window_probs = nn.functional.dropout(window_probs, p=self.dropout, training=self.training)
    window_probs = torch.where(is_index_global_attn.any(), probs[..., length:], window_probs)

    from_global_keys = torch.matmul(probs[..., :length].transpose(1, 2), value.transpose(1, 2)).transpose(1, 2)
    from_window = self._sliding_chunks_matmul_attn_probs_value(window_probs.contiguous(), value, window)
    output = (from_global_keys + from_window).transpose(0, 1).reshape(length, batch, embed_dim)

    # every position as a global query over the whole sequence; kept at the global tokens
    def flat_heads(x):  # [L, B, E] -> [B * H, L, D]
        return x.contiguous().view(length, batch * self.num_heads, self.head_dim).transpose(0, 1)

    global_query = flat_heads(self.query_global(hidden_states) / math.sqrt(self.head_dim))
    global_scores = torch.bmm(global_query, flat_heads(self.key_global(hidden_states)).transpose(1, 2))
    global_scores = global_scores.view(batch, self.num_heads, length, length)
    global_scores = global_scores.masked_fill(is_index_masked[:, None, None, :], lowest)
    global_probs = nn.functional.softmax(global_scores.view(batch * self.num_heads, length, length), dim=-1,
                                         dtype=torch.float32)
    global_probs = nn.functional.dropout(global_probs.type_as(global_scores), p=self.dropout, training=self.training)
    global_output = torch.bmm(global_probs, flat_heads(self.value_global(hidden_states)))  # [B * H, L, D]
    global_output = global_output.view(batch, self.num_heads, length, self.head_dim).permute(2, 0, 1, 3)
    global_output = global_output.reshape(length, batch, embed_dim)
    output = torch.where(is_index_global_attn.transpose(0, 1)[:, :, None], global_output, output)
    return output.transpose(0, 1)


@register_patch("dynamo", *GLOBAL_ATTENTION_PATHS)
def _patch_global_attention(original):
    """Longformer/LED global attention branches on ``.item()`` of the mask and gathers global tokens with
    ``nonzero()``: compute it over all positions, masked, with static shapes.

    before: if mask.any().item(): nonzero() -> attention over [num_global] gathered slots
    after:  attention over all L positions, finfo.min where not global; torch.where at global queries
    """

    @functools.wraps(original)
    def forward(self, hidden_states, attention_mask=None, is_index_masked=None, is_index_global_attn=None,
                is_global_attn=None, output_attentions=False):
        if output_attentions:
            return original(self, hidden_states, attention_mask, is_index_masked, is_index_global_attn,
                            is_global_attn, output_attentions)
        return (dense_global_attention(self, hidden_states, attention_mask, is_index_masked, is_index_global_attn),)

    return forward


@register_patch("dynamo", "transformers.models.longformer.modeling_longformer._get_question_end_index")
def _patch_question_end_index(original):
    """The first separator of each row, found with ``nonzero()`` (a data-dependent count): take it by argmax.

    before: (input_ids == sep).nonzero().view(B, 3, 2)[:, 0, 1]
    after:  (input_ids == sep).int().argmax(-1)
    """

    @functools.wraps(original)
    def question_end_index(input_ids, sep_token_id):
        return (input_ids == sep_token_id).int().argmax(dim=-1)

    return question_end_index


@register_patch("dynamo", "transformers.models.longformer.modeling_longformer.LongformerSelfAttention._chunk",
                "transformers.models.led.modeling_led.LEDEncoderSelfAttention._chunk")
def _patch_chunk_by_unfold(original):
    """Overlapping window chunks by ``as_strided`` on a view whose strides are not contiguous, with a chunk
    count from ``torch.div`` (a tensor, so a data-dependent size when the length is symbolic): take
    the model's own ``onnx_export`` branch, ``unfold``, which computes the same chunks from values.

    before: view(B, torch.div(L, 2w, rounding_mode="trunc"), 2w, D).as_strided(...)
    after:  unfold(1, 2w, w).transpose(2, 3)
    """

    @functools.wraps(original)
    def chunk(hidden_states, window_overlap, onnx_export=False):
        return original(hidden_states, window_overlap, True)

    return chunk
