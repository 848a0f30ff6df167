"""A transformers Cache of StaticLayers each of a given length with its first positions written, for the tests of
what the static form reads off generate's cache (``from _written_cache import written_cache``; tests/ is on
sys.path)."""

from __future__ import annotations

import torch


def written_cache(written, value_size: int = 4):
    """Layers of (length, positions written), in order: heads 2, key size 4, values ``value_size``, batch 1."""
    from transformers.cache_utils import Cache, StaticLayer

    layers = []
    for length, count in written:
        layer = StaticLayer(max_cache_len=length)
        layer.update(torch.ones(1, 2, count, 4), torch.ones(1, 2, count, value_size))
        layers.append(layer)
    cache = Cache.__new__(Cache)
    cache.layers = layers
    return cache
