"""Model patch (Qwen3-ASR, Qwen3-Omni audio): the attention windows' ``cu_seqlens`` with static shapes.

Cause. The audio encoder packs every sample's post-CNN frames into one sequence and attends within
windows of ``window = max(chunk lengths after CNN) * (n_window_infer // (2 * n_window))`` frames.
``get_audio_cu_seqlens`` (models/qwen3_asr/modeling_qwen3_asr.py:281, and its copy in
models/qwen3_omni_moe/modeling_qwen3_omni_moe.py:706) builds the boundaries in Python:

    window = feature_lens_after_cnn.max().item() * ratio
    for cnn_len in aftercnn_lens:
        cu += [window] * (cnn_len // window)          # a list repeated a data-dependent number of times
        if cnn_len % window != 0: cu += [cnn_len % window]

so torch.export stops at ``cnn_len // window`` ("Could not extract specialized integer from
data-dependent expression u1").

What this changes (while tracing only). The same boundaries come out of a fixed grid of
``max_windows`` windows per sample, an upper bound known from the shapes alone (a sample has at
most ``num_chunks * frames_per_full_chunk`` frames, and a window at least ``ratio`` frames): window
k of sample b holds ``clamp(aftercnn_len[b] - k * window, 0, window)`` frames, and the boundaries
are the cumulative sum of that grid, row by row. The windows the original emits come out in the
same order with the same lengths; the rest are empty (repeated boundaries), which the packed
attention (exporters/workarounds/models/packed_attention.py: a position's segment is the number of
boundaries at or below it) gives no position, so every frame attends to exactly the frames it did.

    before: cu = [0] + [window] * (len // window) + [len % window] ... per sample (Python list)
    after:  cu = pad(cumsum(clamp(len[:, None] - arange(max_windows) * window, 0, window).flatten()))

Remove when: ``get_audio_cu_seqlens`` computes the windows with tensor operations instead of a
Python loop over ``.item()`` lengths (transformers' modeling_qwen3_asr.py,
modeling_qwen3_omni_moe.py): check with
``python -m sweeps.recheck workarounds --only
patch:dynamo:transformers.models.qwen3_asr.modeling_qwen3_asr.get_audio_cu_seqlens``.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from exporters.utils import WorkaroundError, register_patch

AUDIO_WINDOW_PATHS: tuple[str, ...] = (
    "transformers.models.qwen3_asr.modeling_qwen3_asr.get_audio_cu_seqlens",
    "transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe.get_audio_cu_seqlens",
)


def windowed_cu_seqlens(aftercnn_lens: torch.Tensor, chunk_lens_after_cnn: torch.Tensor, ratio: int,
                        max_windows) -> torch.Tensor:
    """int32 boundaries of the attention windows: per sample, ``aftercnn_lens[b]`` frames cut into windows of
    ``max(chunk_lens_after_cnn) * ratio`` frames, last one partial, with empty windows up to ``max_windows``
    per sample (repeated boundaries)."""
    window = chunk_lens_after_cnn.max() * ratio
    starts = torch.arange(max_windows, device=aftercnn_lens.device, dtype=aftercnn_lens.dtype) * window
    lengths = (aftercnn_lens[:, None] - starts[None, :]).clamp(min=0)
    lengths = torch.minimum(lengths, window)
    return F.pad(lengths.flatten().cumsum(0), (1, 0), value=0).to(torch.int32)


def max_windows_per_sample(num_chunks, frames_per_full_chunk: int, ratio: int):
    """How many windows a sample can need: all its chunks full, windows as short as they get (``ratio``)."""
    return (num_chunks * frames_per_full_chunk + ratio - 1) // ratio


@register_patch("dynamo", *AUDIO_WINDOW_PATHS)
def _patch_audio_windows_static(original):
    """Qwen3 audio encoders build their attention windows in a Python loop over ``.item()`` lengths
    (data-dependent): the same windows from a fixed per-sample grid, padded with empty windows.

    before: cu_seqlens from [window] * (cnn_len // window) + [remainder] per sample
    after:  cu_seqlens = cumsum of clamp(len - k * window, 0, window) for k < max_windows
    """
    output_lengths = original.__globals__.get("_get_feat_extract_output_lengths")
    if output_lengths is None:
        raise WorkaroundError(
            f"{original.__module__}.get_audio_cu_seqlens no longer sits beside _get_feat_extract_output_lengths: "
            "the audio-window patch (exporters/workarounds/models/qwen3_audio_windows.py) computes lengths with it; re-check the "
            "window code and update the patch or drop the path from AUDIO_WINDOW_PATHS")

    @functools.wraps(original)
    def get_audio_cu_seqlens(chunk_lengths, feature_lens, n_window_infer, n_window, kwargs=None):
        if kwargs is not None and (cu_seqlens := kwargs.pop("cu_seqlens", None)) is not None:
            return cu_seqlens
        ratio = n_window_infer // (n_window * 2)
        if ratio < 1:
            raise WorkaroundError(
                f"audio windows: n_window_infer={n_window_infer} is shorter than a chunk (2 * n_window = "
                f"{2 * n_window}), so the window is 0 frames and the original divides by zero")
        num_chunks = chunk_lengths.shape[0] // feature_lens.shape[0]
        frames_per_full_chunk = int(output_lengths(2 * n_window, n_window))
        return windowed_cu_seqlens(
            output_lengths(feature_lens, n_window), output_lengths(chunk_lengths, n_window), ratio,
            max_windows_per_sample(num_chunks, frames_per_full_chunk, ratio))

    return get_audio_cu_seqlens
