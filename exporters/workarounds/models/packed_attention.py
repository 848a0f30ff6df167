"""Model patch: packed (``cu_seqlens``) vision/audio attention as one masked attention call.

Cause. Qwen2-VL-style encoders pack several images (or audio chunks) into one flat sequence and
mark the boundaries with ``cu_seqlens``. Without flash attention, their ``*Attention.forward`` does

    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    torch.split(q / k / v, lengths.tolist(), dim=2)   # one attention call per segment, then torch.cat

``lengths.tolist()`` turns tensor values into split sizes, so torch.export stops with
``GuardOnDataDependentSymNode: Could not guard on data-dependent expression Eq(u0, 0)``.

What this changes (while tracing only). Each of these forwards already has a second branch, the
flash-attention one, that makes ONE attention-interface call over the whole packed sequence and
hands it ``cu_seq_lens_q/k``; every layout difference between the models (combined ``qkv`` or
separate projections, rotary convention, ``proj`` / ``out_proj`` / ``o_proj``, tuple or single
return) lives outside that call. The patched forward runs the model's own code with three of its
module globals rebound, in a copy of the function (the module itself is not touched):

- ``is_flash_attention_requested`` -> True, so the forward takes the single-call branch;
- ``get_max_seqlen`` -> pops a precomputed ``max_seqlen`` like the original, but never computes
  ``(cu_seqlens[1:] - cu_seqlens[:-1]).max().item()`` (a data-dependent scalar nobody needs here);
- ``ALL_ATTENTION_FUNCTIONS`` -> hands out the attention function the config really selects
  (``sdpa`` or the module's ``eager_attention_forward``), wrapped so that ``cu_seq_lens_q/k`` become
  a block-diagonal additive mask: position i attends to j iff both lie in the same segment. The
  segment of a position is the number of boundaries ``cu_seqlens[1:]`` at or below it, a
  comparison and a sum with static shapes (variable-length segments, empty segments allowed).

    before: split(q, lengths.tolist()) -> [attn(q_s, k_s, v_s) for each segment] -> cat
    after:  attn(q, k, v, attention_mask=0 where seg[i] == seg[j] else finfo.min)

Masked scores underflow to exactly 0 after the softmax, so each row sees the same keys and
weights as the per-segment call; only the summation order differs (~1e-7). When the config really
requests flash attention the original forward runs unchanged.

Remove when: transformers' non-flash vision attention traces without the per-segment split
(a varlen attention op, or a block-diagonal mask in the model itself): check with
``python -m sweeps.recheck workarounds --only
patch:dynamo:transformers.models.glm4v.modeling_glm4v.Glm4vVisionAttention.forward``.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch

from exporters.utils import WorkaroundError, register_patch

# (model module, attention class) for every forward with the ``lengths.tolist()`` split in transformers 5.23
# (grep "cu_seqlens\[1:\] - cu_seqlens\[:-1\]" in transformers/models/*/modeling_*.py). Classes that inherit
# one of these forwards (Glm46V reuses Glm4v's vision tower) are covered through it.
SEGMENTED_ATTENTION_CLASSES: tuple[tuple[str, str], ...] = (
    ("cohere_compass", "CohereCompassVisionAttention"),
    ("cosmos3_edge", "Cosmos3EdgeVisionAttention"),
    ("dots3_note", "Dots3NoteVisionAttention"),
    ("ernie4_5_vl_moe", "Ernie4_5_VLMoeVisionAttention"),
    ("exaone4_5", "Exaone4_5_VisionAttention"),
    ("glm4v", "Glm4vVisionAttention"),
    ("glm4v_moe", "Glm4vMoeVisionAttention"),
    ("glm5_next", "Glm5NextVisionAttention"),
    ("glm_image", "GlmImageVisionAttention"),
    ("glm_ocr", "GlmOcrVisionAttention"),
    ("hunyuan_vl", "HunYuanVLVisionAttention"),
    ("inkling2", "Inkling2VisionAttention"),
    ("kimi_k25", "Kimi_K25VisionAttention"),
    ("lfm3_vl", "Lfm3VlVisionAttention"),
    ("minicpm_ocr", "MiniCPMOcrVisionAttention"),
    ("minicpmv4_6", "MiniCPMV4_6VisionAttention"),
    ("minicpmv4_7", "MiniCPMV4_7VisionAttention"),
    ("minimax_m3_vl", "MiniMaxM3VLVisionAttention"),
    ("muse_glimmer", "MuseGlimmerVisionAttention"),
    ("muse_spark", "MuseSparkVisionAttention"),
    ("paddleocr_vl", "PaddleOCRVisionAttention"),
    ("qwen2_5_omni", "Qwen2_5OmniAudioAttention"),
    ("qwen2_5_omni", "Qwen2_5OmniVisionAttention"),
    ("qwen2_5_vl", "Qwen2_5_VLVisionAttention"),
    ("qwen2_vl", "VisionAttention"),
    ("qwen3_5", "Qwen3_5VisionAttention"),
    ("qwen3_5_moe", "Qwen3_5MoeVisionAttention"),
    ("qwen3_asr", "Qwen3ASRAudioAttention"),
    ("qwen3_omni_moe", "Qwen3OmniMoeAudioAttention"),
    ("qwen3_omni_moe", "Qwen3OmniMoeVisionAttention"),
    ("qwen3_vl", "Qwen3VLVisionAttention"),
    ("qwen3_vl_moe", "Qwen3VLMoeVisionAttention"),
    ("qwen4_exp", "Qwen4ExpVisionAttention"),
    ("radio", "RadioAttention"),
    ("video_llama_3", "VideoLlama3VisionAttention"),
)

SEGMENTED_ATTENTION_PATHS: tuple[str, ...] = tuple(
    f"transformers.models.{model}.modeling_{model}.{cls}.forward" for model, cls in SEGMENTED_ATTENTION_CLASSES
)

# the module globals the forward must use for its single-call (flash) branch; rebound in the copy
_REBOUND = ("is_flash_attention_requested", "get_max_seqlen", "ALL_ATTENTION_FUNCTIONS")


def segment_ids(cu_seqlens: torch.Tensor, length: int | torch.SymInt) -> torch.Tensor:
    """Segment index of each of ``length`` packed positions: how many ends ``cu_seqlens[1:]`` are <= it.

    Static shapes only (a ``(length, num_segments)`` comparison), so it traces for any boundaries;
    empty segments (repeated boundaries) get no position.
    """
    positions = torch.arange(length, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    return (positions[:, None] >= cu_seqlens[None, 1:]).sum(dim=-1)


def block_diagonal_mask(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, q_len, k_len,
                        dtype: torch.dtype) -> torch.Tensor:
    """Additive ``(1, 1, q_len, k_len)`` mask: 0 within a segment, ``finfo(dtype).min`` across segments."""
    same = segment_ids(cu_seqlens_q, q_len)[:, None] == segment_ids(cu_seqlens_k, k_len)[None, :]
    mask = torch.zeros(same.shape, dtype=dtype, device=cu_seqlens_q.device).masked_fill(~same, torch.finfo(dtype).min)
    return mask[None, None]


def masked_segment_attention(attention_fn):
    """Wrap an attention-interface function so that a ``cu_seq_lens_q/k`` call becomes one call with a
    block-diagonal ``attention_mask`` (calls without ``cu_seq_lens_q`` pass through unchanged)."""

    @functools.wraps(attention_fn)
    def attend(module, query, key, value, attention_mask=None, *args, cu_seq_lens_q=None, cu_seq_lens_k=None,
               max_length_q=None, max_length_k=None, **kwargs):
        if cu_seq_lens_q is None:
            return attention_fn(module, query, key, value, attention_mask, *args, **kwargs)
        if attention_mask is not None:
            raise WorkaroundError("packed segment attention got both cu_seq_lens_q and an attention_mask; "
                                  "exporters/workarounds/models/packed_attention.py does not combine the two")
        cu_seq_lens_k = cu_seq_lens_q if cu_seq_lens_k is None else cu_seq_lens_k
        mask = block_diagonal_mask(cu_seq_lens_q, cu_seq_lens_k, query.shape[2], key.shape[2], query.dtype)
        return attention_fn(module, query, key, value, mask, *args, **kwargs)

    return attend


class _MaskedAttentionFunctions:
    """Stands in for ``ALL_ATTENTION_FUNCTIONS`` inside the patched forward: same lookups, each result
    wrapped by ``masked_segment_attention``."""

    def __init__(self, functions: Any) -> None:
        self._functions = functions

    def get_interface(self, attn_implementation, default):
        return masked_segment_attention(self._functions.get_interface(attn_implementation, default))

    def __getitem__(self, key):
        return masked_segment_attention(self._functions[key])

    def __getattr__(self, name):
        return getattr(self._functions, name)


def _pop_max_seqlen(cu_seqlens, config=None, kwargs=None, kwarg_name: str = "max_seqlen"):
    """``get_max_seqlen`` without its ``.max().item()``: the masked call does not use the maximum."""
    return kwargs.pop(kwarg_name, None) if kwargs is not None else None


def single_call_forward(original):
    """A copy of ``original`` (a packed ``*Attention.forward``) whose flash branch runs with a masked
    sdpa/eager call; raises WorkaroundError when the forward no longer has that branch."""
    code = getattr(original, "__code__", None)
    missing = [name for name in _REBOUND
               if code is None or name not in code.co_names or name not in original.__globals__]
    if missing:
        raise WorkaroundError(
            f"{getattr(original, '__qualname__', original)} no longer uses {missing}: the segmented-attention "
            "patch (exporters/workarounds/models/packed_attention.py) needs its single-call flash branch; re-check "
            "whether the per-segment split is still there and drop the class from SEGMENTED_ATTENTION_CLASSES"
        )
    module_globals = dict(original.__globals__)
    really_flash = module_globals["is_flash_attention_requested"]
    module_globals.update(
        is_flash_attention_requested=lambda *args, **kwargs: True,
        get_max_seqlen=_pop_max_seqlen,
        ALL_ATTENTION_FUNCTIONS=_MaskedAttentionFunctions(module_globals["ALL_ATTENTION_FUNCTIONS"]),
    )
    packed = types.FunctionType(original.__code__, module_globals, original.__name__, original.__defaults__,
                                original.__closure__)
    packed.__kwdefaults__ = original.__kwdefaults__

    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        if really_flash(self.config):  # a real varlen kernel: the original traces as it is
            return original(self, *args, **kwargs)
        return packed(self, *args, **kwargs)

    return forward


@register_patch("dynamo", *SEGMENTED_ATTENTION_PATHS)
def _patch_segmented_attention(original):
    """Packed vision/audio attention split per ``cu_seqlens`` segment with ``lengths.tolist()`` (data-dependent,
    torch.export cannot guard it): run it as one attention call under a block-diagonal mask.

    before: split(q, (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()) -> attn per segment -> cat
    after:  attn(q, k, v, attention_mask=block_diagonal(cu_seqlens))
    """
    return single_call_forward(original)
