"""Model patch (Encodec-style causal conv): the extra right padding in integer size arithmetic.

Cause. ``EncodecConv1d``, ``MimiConv1d`` and ``PocketTTSAudioTokenizerConv1d`` pad each input so
the last frame is complete (``_get_extra_padding_for_conv1d``): ``n_frames = (length - kernel_size +
padding_total) / stride + 1``, then ``torch.ceil(n_frames).to(torch.int64) - 1``, with kernel_size,
stride and padding_total 0-d buffers. The exporters bake those buffers (``constant_buffers_baked``),
so a static export passes; with a dynamic length the arithmetic meets a symbolic size and is traced
as tensor ops, the padding becomes an unbacked ``.item()``, every conv output length after it is
data-dependent, and the transformer's ``q_length > 1`` cannot be decided (Mimi, PocketTTS audio
tokenizer, dynamic exports).

What this changes (while tracing only). The same padding as a Python/SymInt expression:
``ceil((length - kernel_size + padding_total) / stride)`` is ``-((kernel_size - padding_total -
length) // stride)``, exact for integers; the buffers are read as the ints they are baked to.

    before: extra = (ceil((L - k + p) / s + 1) - 1) * s + k - p - L      # tensor ops, unbacked
    after:  extra = -((k - p - L) // s) * s + k - p - L                  # a SymInt of L

Remove when: ``_get_extra_padding_for_conv1d`` of ``EncodecConv1d``, ``MimiConv1d`` and
``PocketTTSAudioTokenizerConv1d`` computes the padding from the input length in integer size
arithmetic instead of ``torch.ceil`` over its 0-d buffers (transformers' modeling_encodec.py,
modeling_mimi.py, modeling_pocket_tts_audio_tokenizer.py).
"""

from __future__ import annotations

import functools

import torch

from exporters.utils import register_patch


def extra_padding(length, kernel_size: int, stride: int, padding_total: int):
    """Right padding that completes the last frame of a ``length``-long input (int or SymInt)."""
    n_frames = -((kernel_size - padding_total - length) // stride)
    return n_frames * stride + kernel_size - padding_total - length


def _as_int(value):
    return int(value) if isinstance(value, torch.Tensor) else value


@register_patch("dynamo", "transformers.models.encodec.modeling_encodec.EncodecConv1d._get_extra_padding_for_conv1d",
                "transformers.models.mimi.modeling_mimi.MimiConv1d._get_extra_padding_for_conv1d",
                "transformers.models.pocket_tts_audio_tokenizer.modeling_pocket_tts_audio_tokenizer."
                "PocketTTSAudioTokenizerConv1d._get_extra_padding_for_conv1d")
def _patch_conv_padding_as_size_arithmetic(original):
    @functools.wraps(original)
    def get_extra_padding(self, hidden_states):
        return extra_padding(hidden_states.shape[-1], _as_int(self.kernel_size), _as_int(self.stride),
                             _as_int(self.padding_total))

    return get_extra_padding
