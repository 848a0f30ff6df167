"""Patch (models whose mask has a bidirectional prefix or image blocks, ``block_sequence_ids``: PaliGemma,
HrmText, Gemma 3/4, Molmo2, Git, ...): the padding of the block ids to the key length without a Python
test on a symbolic length.

Cause. ``masking_utils.maybe_pad_block_sequence_ids`` (transformers/masking_utils.py:257) pads the ids
(one per query position) with -1 up to the key length when they are shorter:
``if (padding_length := kv_length + kv_offset - block_sequence_ids.shape[-1]) > 0``. Over a static cache
the key length is max_cache_len and the ids span the call's S tokens, so with S a dynamic dim the test
puts the guard ``max_cache_len - S > 0`` on the export, against S's declared range [1, max_cache_len]
(a constraint violation; the static step then falls back to one token a call, which cannot build the
prompt's bidirectional block: PaliGemma and HrmText static, test_generate dynamo/static at 5cb5c06).

What this changes (while tracing only). When the padding length is symbolic and known to be >= 0 (the
ids never outnumber the keys), the ids are padded by it without the test: a pad of 0 leaves them as they
are, so the result is the original's for every S. Any other call runs the original.

    before: if (kv_length - S) > 0: pad(ids, (0, kv_length - S), -1)   -> guard max_cache_len - S > 0
    after:  pad(ids, (0, kv_length - S), -1)                           (no guard; S in [1, max_cache_len])

Remove when: ``maybe_pad_block_sequence_ids`` pads by ``max(0, length)`` without branching on it.
"""

from __future__ import annotations

import functools

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from exporters.utils import register_patch


@register_patch("dynamo", "transformers.masking_utils.maybe_pad_block_sequence_ids")
def _patch_pad_block_sequence_ids(original):
    @functools.wraps(original)
    def maybe_pad_block_sequence_ids(block_sequence_ids, attention_mask, kv_length, kv_offset):
        padding = kv_length + kv_offset - block_sequence_ids.shape[-1]
        if isinstance(padding, torch.SymInt) and statically_known_true(padding >= 0):
            return torch.nn.functional.pad(block_sequence_ids, pad=(0, padding), value=-1)
        return original(block_sequence_ids, attention_mask, kv_length, kv_offset)

    return maybe_pad_block_sequence_ids
