"""Patch (decoders that build their own all-ones mask over ``past + S`` positions: Pix2Struct's text decoder):
the padding of a 2D attention mask to the key length without a Python test on a symbolic length.

Cause. ``masking_utils.prepare_padding_mask`` (transformers/masking_utils.py:238) pads the mask with zeros up to
the key length when it is shorter: ``if (padding_length := kv_length + kv_offset - attention_mask.shape[-1]) > 0``.
Pix2Struct's ``Pix2StructTextModel.forward`` (models/pix2struct/modeling_pix2struct.py:1034-1039) makes that mask
itself, ``torch.ones(batch, past_key_values.get_seq_length() + S)``, with no ``is_torchdynamo_compiling()`` check
(Bart's and Udop's have one). Over the static step's cache the key length is max_cache_len and the past length is
read from the cache position (an unbacked int ``u0`` in [0, max_cache_len - 1]), so the test is the
data-dependent guard ``max_cache_len - 1 - u0 > 0``: GuardOnDataDependentSymNode (test_generate dynamo/static
Pix2StructForConditionalGeneration, once its static capture keeps a cache).

What this changes (while tracing only). When the padding length holds an unbacked symbol (where the original's test
cannot be decided: a length read from data) and is known to be >= 0 (the mask never outnumbers the keys), the mask
is padded by it without the test: a pad of 0 leaves it as it is, so the result is the original's for every past
length. Any other call runs the original, a backed symbolic length included (its guard is left to torch, as before).

    before: if (kv_length - (u0 + S)) > 0: pad(mask, (0, kv_length - (u0 + S)))   -> guard on u0
    after:  pad(mask, (0, kv_length - (u0 + S)))                                  (no guard; u0 + S <= kv_length)

Remove when: ``prepare_padding_mask`` pads by ``max(0, length)`` without branching on it, or Pix2Struct's text
decoder leaves the mask to ``create_causal_mask`` while compiling, as Bart's does.
"""

from __future__ import annotations

import functools

import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols, statically_known_true

from exporters.utils import ActedFlag, register_patch


@register_patch("dynamo", "transformers.masking_utils.prepare_padding_mask")
def _patch_prepare_padding_mask(original):
    acted = ActedFlag()  # every masked model calls it: recorded as fired only where it padded without the test

    @functools.wraps(original)
    def prepare_padding_mask(attention_mask, kv_length, kv_offset):
        if attention_mask is not None:
            padding = kv_length + kv_offset - attention_mask.shape[-1]
            if isinstance(padding, torch.SymInt) and free_unbacked_symbols(padding) and statically_known_true(padding >= 0):
                acted.set()
                return torch.nn.functional.pad(attention_mask, (0, padding))
        return original(attention_mask, kv_length, kv_offset)

    prepare_padding_mask.acted = acted
    return prepare_padding_mask
