"""Model patch (Reformer): LSH bucket hashing without a Python branch on the mask's values, and with
seeded rotations made once at trace time.

Cause. ``LSHSelfAttention._hash_vectors`` (models/reformer/modeling_reformer.py) gives padding tokens
an extra bucket under ``if attention_mask.sum().item() < batch_size * seq_len``: a Python branch on
mask values, which torch.export cannot take ("Could not guard on data-dependent expression
u1 < 16"). It also re-seeds the global generator with ``config.hash_seed`` and draws the random
rotations with ``torch.randn`` on every call: traced, the seeding happens once while tracing and
the artifact draws fresh rotations at each run, so it cannot match eager.

What this changes (while tracing only). The same buckets, computed without the branch: the padding
bucket's index and the per-round offset multiplier are selected with tensors (``where``) from
"the mask has padding", so both cases are in the graph and the values decide at run time. With
``hash_seed`` set, the rotations are drawn outside the trace from a generator seeded with it (the
values eager draws after ``torch.manual_seed(hash_seed)``) and enter the graph as a constant; with
no seed they stay a ``randn`` in the graph, as random as eager.

    before: if mask.sum().item() < B * L: n = n + 1; buckets = where(mask, buckets, n - 1)
    after:  padded = mask.sum() < B * L; buckets = where(mask, buckets, n); n = where(padded, n + 1, n)
"""

from __future__ import annotations

import functools
import math

import torch
from torch.utils._python_dispatch import _disable_current_modes

from .utils import register_patch


def seeded_rotations(shape: tuple[int, ...], seed: int, dtype: torch.dtype) -> torch.Tensor:
    """``torch.randn(shape)`` right after ``torch.manual_seed(seed)``, made outside any trace."""
    with _disable_current_modes(), torch._C.DisableTorchFunction():
        return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def lsh_buckets(self, vectors, num_hashes, attention_mask, increase_num_buckets=False):
    """Bucket ids per (batch, head, hash round x position), equal to ``_hash_vectors``'s."""
    factors = [self.num_buckets] if isinstance(self.num_buckets, int) else list(self.num_buckets)
    if any(f % 2 for f in factors):
        raise ValueError(f"LSH bucket counts must be even, got num_buckets={self.num_buckets}")
    vectors = vectors.detach()
    shape = (self.num_attention_heads, vectors.shape[-1], num_hashes, sum(factors) // 2)
    if self.hash_seed is not None:
        rotations = seeded_rotations(shape, self.hash_seed, vectors.dtype).to(vectors.device)
    else:
        rotations = torch.randn(shape, device=vectors.device, dtype=vectors.dtype)
    rotated = torch.einsum("bmtd,mdhr->bmhtr", vectors, rotations)

    buckets, start, scale = 0, 0, 1
    for factor in factors:
        half = rotated[..., start:start + factor // 2]
        buckets = buckets + scale * torch.argmax(torch.cat([half, -half], dim=-1), dim=-1)
        start, scale = start + factor // 2, scale * factor

    total = math.prod(factors)
    per_round = total + int(increase_num_buckets)
    if attention_mask is not None:
        # padding tokens get bucket `total`; a mask without padding leaves every bucket as it is
        keep = attention_mask.to(torch.bool)[:, None, None, :].expand(buckets.shape)
        buckets = torch.where(keep, buckets, total)
        padded = attention_mask.sum() < vectors.shape[0] * attention_mask.shape[-1]
        per_round = torch.where(padded, total + 1, per_round)
    offsets = (torch.arange(num_hashes, device=vectors.device) * per_round).view(1, 1, -1, 1)
    offsets = offsets.expand((vectors.shape[0], self.num_attention_heads) + offsets.shape[-2:])
    return (buckets + offsets).flatten(start_dim=2, end_dim=3)


@register_patch("dynamo", "transformers.models.reformer.modeling_reformer.LSHSelfAttention._hash_vectors")
def _patch_lsh_hashing(original):
    @functools.wraps(original)
    def hash_vectors(self, vectors, num_hashes, attention_mask, increase_num_buckets=False):
        return lsh_buckets(self, vectors, num_hashes, attention_mask, increase_num_buckets)

    return hash_vectors
