"""The cache layers the capture gives a model's ``generate`` in place of its sliding-window layers.

A ``DynamicSlidingWindowLayer`` keeps its last ``window - 1`` positions and a Python count of the
positions seen (``cumulative_length``): the count would be a constant of the decode component, baked at
its first value (a decode step whose structure changes every step), and the cut to the window a branch
on it. Each form below keeps every position and carries nothing step-dependent outside its tensors; the
model's own mask (chosen per layer from its config's layer types, over absolute positions) still limits
each query to what eager's layer let it see, so the logits are eager's up to float summation order. The
cost is a cache that grows with the whole sequence instead of stopping at the window.

A subclass of the sliding layer whose behaviour depends on its count beyond the window (a model's own
layer) gets a form of its own here (a reference layer's) or in compressed_forms.py (a layer that feeds a
compressor), or none: left as it is, its count changes the decode step's
structure and the export says so (GenerationError 'changes structure').
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import (
    DynamicLayer,
    DynamicSlidingWindowLayer,
    LinearAttentionAndFullAttentionLayer,
    LinearAttentionAndSlidingWindowAttentionLayer,
)

from exporters.generation.compressed_forms import compressed_form

REFERENCE = "reference_sliding_attention"  # a layer type whose prompt positions stay visible (UnlimitedOcr)


class PlainReferenceLayer(DynamicLayer):
    """A reference sliding-window layer (UnlimitedOcr's ``UnlimitedOcrDynamicReferenceSlidingWindowLayer``,
    R-SWA) as a plain one. Eager's keeps the prompt's keys whole and the decoded ones in a window, and its
    mask (``create_reference_sliding_window_causal_mask``, which finds the layer by its ``_layer_type``)
    shows a query every key before ``prefill_length`` beside its window. This one keeps every position
    (``kv_offset`` 0: a key's index is its absolute position) and ``prefill_length`` as a 0-d tensor, set
    at its first update (the prompt's length, as generate's ``set_prefill_length`` gives eager's), so the
    same mask sees the same prompt and the same window, and the length travels as a cache tensor. Before
    the first update it is None, as eager's mask then reads every key as the prompt's (all are).

    One difference, eager's: in a left-padded row, once the decoded tokens pass the window, eager's
    ``get_mask_sizes`` gives the window's offset, which masking_utils adds to every key's index, the
    prompt's too, so eager reads the prompt keys' padding that many positions late (a pad key shows);
    this form reads each key's padding at its own position, and such a row's logits differ from eager's."""

    def __init__(self) -> None:
        super().__init__()
        self.prefill_length: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        if self.prefill_length is None:
            self.prefill_length = torch.full((), key_states.shape[-2], dtype=torch.long, device=key_states.device)
        return super().update(key_states, value_states, *args, **kwargs)


# set after the class is made: a class defined with a _layer_type registers itself as the layer every
# DynamicCache(config) builds for that type (CacheLayerMixin.__init_subclass__), eager's own included
PlainReferenceLayer._layer_type = REFERENCE


def _plain_form(layer: Any) -> Any | None:
    """The form that replaces ``layer`` (one that holds nothing yet), or None where it stays."""
    if getattr(layer, "is_initialized", True):  # holds state already, or a layer kind without the flag
        return None  # (LinearAttentionLayer: Mamba's, Qwen3-Next's states, never replaced)
    if type(layer) is DynamicSlidingWindowLayer:
        return DynamicLayer()
    if type(layer) is LinearAttentionAndSlidingWindowAttentionLayer:
        # the same beside linear-attention states (Inkling's short convolutions), which stay
        return LinearAttentionAndFullAttentionLayer(number_of_states=layer.number_of_states)
    if isinstance(layer, DynamicSlidingWindowLayer) and getattr(layer, "_layer_type", None) == REFERENCE \
            and _only_reference_state(layer):
        return PlainReferenceLayer()
    return compressed_form(layer)  # one that feeds a compressor (exporters/generation/compressed_forms.py)


def _only_reference_state(layer: Any) -> bool:
    """Whether ``layer`` holds exactly what UnlimitedOcr's reference layer does (a subclass with more state
    than that is not this form's to replace)."""
    return set(vars(layer)) <= {"keys", "values", "is_initialized", "sliding_window", "cumulative_length",
                                "_sliding_window_tensor", "record_past", "prefill_length",
                                "prefill_cumulative_length", "prefill_keys", "prefill_values"}


def plain_sliding_layers(cache: Any) -> int:
    """Replace each sliding-window layer of ``cache`` that holds nothing yet by its form (``_plain_form``);
    returns how many."""
    caches = [cache, *(getattr(cache, k, None) for k in ("self_attention_cache", "cross_attention_cache"))]
    swapped = 0
    for each in caches:
        layers = getattr(each, "layers", None)
        if not isinstance(layers, list):
            continue
        for i, layer in enumerate(layers):
            form = _plain_form(layer)
            if form is not None:
                layers[i] = form
                swapped += 1
    return swapped
