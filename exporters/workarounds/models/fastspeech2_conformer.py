"""Model patch (FastSpeech2Conformer): the length regulator without its Python branch and per-sample
loop: every frame looks its phoneme up by comparing the frame index with the cumulative durations.

Cause. ``length_regulator`` (models/fastspeech2_conformer/modeling_fastspeech2_conformer.py:82-124)
branches on ``if duration_labels.sum() == 0`` (a tensor value: "Could not guard on data-dependent
expression Eq(u0, 0)") and then fills a zero tensor with ``repeat_interleave`` per sample in a Python
loop over the batch.

What this changes (while tracing only). The same output, computed for the whole batch: all-zero
durations become ones with ``torch.where`` (the branch wrote ones into exactly those rows, and it is
taken only when every row is zero); the frame count is the largest total duration (a data-dependent
size, as in eager); frame ``t`` of sample ``i`` holds phoneme ``#{j : cumsum(d_i)[j] <= t}`` (what
``repeat_interleave`` puts there) while ``t`` is below that sample's total, and zeros after it.
Unlike eager, the caller's ``duration_labels`` is not written to.

    before: if d.sum() == 0: d[...] = 1; for i: out[i, :len] = repeat_interleave(x[i], d[i])
    after:  d = where(d.sum() == 0, 1, d); index = (cumsum(d)[:, None, :] <= t[:, None]).sum(-1)
            out = where(t < d.sum(1), x.gather(1, index), 0)

The decoder's relative positional encoding then sees that data-dependent frame count:
``FastSpeech2ConformerRelPositionalEncoding.forward`` (line 763) keeps a 5000-position table and
re-extends it under ``if pos_enc.size(1) >= x.size(1) * 2 - 1`` ("Could not guard on
data-dependent expression 2*u0 - 1 <= 9999"), then slices the 2L - 1 positions around its centre.
For a data-dependent length the patched forward computes those 2L - 1 positions directly with the
model's own ``extend_pos_enc`` (the slice is exactly that table: positions L-1..0, then 1..L-1), so
any length works, as in eager; the stored table is left as it is. Other lengths go to ``forward``.
Its attention's ``shift_relative_position_tensor`` (line 381) does the Transformer-XL shift by a
zero column and ``view`` of a sliced tensor, whose stride check cannot be decided for a
data-dependent length ("Eq(u0, 1)"); for such lengths the same shift is one gather,
``out[..., i, j] = in[..., i, j - i + T - 1]``.

Remove when: ``length_regulator`` expands the durations for the whole batch without the branch on
``duration_labels.sum() == 0`` and the per-sample ``repeat_interleave`` loop, and
``FastSpeech2ConformerRelPositionalEncoding.forward`` and ``shift_relative_position_tensor`` take a
data-dependent length without a guard on it (transformers' modeling_fastspeech2_conformer.py).
"""

from __future__ import annotations

import functools

import torch

from exporters.utils import ActedFlag, data_dependent_size, register_patch


def regulated(encoded_embeddings: torch.Tensor, duration_labels: torch.Tensor, speaking_speed: float = 1.0):
    """``length_regulator`` with static control flow (see the module docstring)."""
    if speaking_speed <= 0:
        raise ValueError("`speaking_speed` must be greater than 0.")
    if speaking_speed != 1.0:
        duration_labels = torch.round(duration_labels.float() * speaking_speed).long()
    duration_labels = torch.where(duration_labels.sum() == 0, torch.ones_like(duration_labels), duration_labels)
    totals = duration_labels.sum(dim=1)
    max_len = totals.max().item()
    torch._check(max_len >= 0)
    frames = torch.arange(max_len, device=encoded_embeddings.device)
    ends = duration_labels.cumsum(dim=1)  # (batch, phonemes)
    index = (ends.unsqueeze(1) <= frames[None, :, None]).sum(-1)  # (batch, frames)
    index = index.clamp(max=encoded_embeddings.size(1) - 1)  # frames past a sample's end are zeroed below
    picked = encoded_embeddings.gather(1, index.unsqueeze(-1).expand(-1, -1, encoded_embeddings.size(2)))
    inside = (frames[None, :] < totals[:, None]).unsqueeze(-1)
    return torch.where(inside, picked, torch.zeros((), dtype=picked.dtype)).to(torch.float)


@register_patch("dynamo", "transformers.models.fastspeech2_conformer.modeling_fastspeech2_conformer.length_regulator")
def _patch_length_regulator_vectorized(original):
    return regulated


def _for_data_dependent_lengths(original, length_of, replacement):
    """``original`` (a method ``(self, x)``), replaced by ``replacement(self, x)`` when ``length_of(x)`` is a
    data-dependent size; marked fired only on such calls."""
    acted = ActedFlag()

    @functools.wraps(original)
    def method(self, x):
        if not data_dependent_size(length_of(x)):
            return original(self, x)
        acted.set()
        return replacement(self, x)

    method.acted = acted
    return method


def _positions_for_length(self, feature_representation):
    pos_emb = self.extend_pos_enc(feature_representation)  # the 2L - 1 positions the slice would give
    return self.dropout(feature_representation * self.input_scale), self.dropout(pos_emb)


@register_patch("dynamo",
                "transformers.models.fastspeech2_conformer.modeling_fastspeech2_conformer."
                "FastSpeech2ConformerRelPositionalEncoding.forward")
def _patch_rel_positions_for_any_length(original):
    return _for_data_dependent_lengths(original, lambda x: x.size(1), _positions_for_length)


def shifted(pos_tensor: torch.Tensor) -> torch.Tensor:
    """The relative shift ``shift_relative_position_tensor`` makes: (..., T, 2T - 1) -> (..., T, T) with
    ``out[..., i, j] = pos_tensor[..., i, j - i + T - 1]``."""
    time = pos_tensor.size(-2)
    steps = torch.arange(time, device=pos_tensor.device)
    index = steps[None, :] - steps[:, None] + (time - 1)
    return pos_tensor.gather(-1, index.expand(*pos_tensor.shape[:-1], time))


@register_patch("dynamo",
                "transformers.models.fastspeech2_conformer.modeling_fastspeech2_conformer."
                "FastSpeech2ConformerAttention.shift_relative_position_tensor")
def _patch_relative_shift_as_gather(original):
    return _for_data_dependent_lengths(original, lambda x: x.size(-2), lambda self, x: shifted(x))
