"""Model patches (Reformer): LSH bucket hashing without a Python branch on the mask's values, with
seeded rotations made once at trace time; and the padding to a multiple of the chunk length done
before the model, without a branch on the sequence length.

Cause 1. ``LSHSelfAttention._hash_vectors`` (models/reformer/modeling_reformer.py) gives padding
tokens an extra bucket under ``if attention_mask.sum().item() < batch_size * seq_len``: a Python
branch on mask values, which torch.export cannot take ("Could not guard on data-dependent expression
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

Cause 2. ``ReformerModel.forward`` pads the sequence to a multiple of the chunk length under
``if input_shape[-1] % least_common_mult_chunk_length != 0`` (lines 2022-2046): with a dynamic
length the export keeps the traced length's remainder as a guard (``4 - L % 4 == 1`` when traced at
7) and refuses lengths eager takes.

What this changes (while tracing only). The same padding, done before ``forward`` for any length
longer than the shortest chunk: ``(-L) % chunk`` pad tokens (zero of them for a multiple), with the
mask eager builds for them (zeros; ones for the real tokens when no mask was given), then the
output sliced back to L. ``forward`` then sees a multiple of the chunk length and takes no branch.
An all-ones mask where eager had none changes no value: no bucket moves, every position is kept.
A cache the call fills is cut back to L as well (eager caches the unpadded length). Calls with
position_ids, with a cache to continue, or in training go to ``forward`` unchanged.

    before: forward(ids[B, L])          -> if L % 4: pad; ...; out[:, :L]     (guard on L % 4)
    after:  forward(pad(ids, (-L) % 4)) -> no pad needed; ...; out[:, :L]     (no guard)

Remove when: ``LSHSelfAttention._hash_vectors`` picks the padding bucket with tensor operations
instead of the ``.item()`` branch and draws its rotations from a generator seeded with ``hash_seed``
instead of re-seeding the global one inside forward, and ``ReformerModel.forward`` pads to a
multiple of the chunk length without a branch on the sequence length (transformers'
modeling_reformer.py).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from exporters.specialize import untraced
from exporters.utils import register_patch


def seeded_rotations(shape: tuple[int, ...], seed: int, dtype: torch.dtype) -> torch.Tensor:
    """``torch.randn(shape)`` right after ``torch.manual_seed(seed)``, made outside any trace."""
    with untraced():
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


def _chunk_lengths(config) -> tuple[int, int]:
    """(least common multiple, minimum) of the chunk lengths of the attention layers used."""
    lengths = {"lsh": config.lsh_attn_chunk_length, "local": config.local_attn_chunk_length}
    used = [lengths[kind] for kind in set(config.attn_layers)]
    return math.lcm(*used), min(used)


def pad_to_chunk_multiple(model, length, input_ids, inputs_embeds, attention_mask):
    """The inputs padded with ``(-length) % chunk`` tokens, as ReformerModel pads them itself. Padded
    with ``F.pad`` rather than concatenated: a (batch, pad) piece would make torch ask whether pad
    is 1 (a contiguity check) and pin the length's remainder, the guard this patch removes."""
    multiple, _ = _chunk_lengths(model.config)
    pad = (-length) % multiple
    reference = input_ids if input_ids is not None else inputs_embeds
    if attention_mask is None:
        attention_mask = torch.ones(reference.shape[0], length, dtype=torch.bool, device=reference.device)
    attention_mask = F.pad(attention_mask, (0, pad), value=0)
    if input_ids is not None:
        input_ids = F.pad(input_ids, (0, pad), value=model.config.pad_token_id)
    if inputs_embeds is not None:
        pad_token = torch.tensor(model.config.pad_token_id, dtype=torch.long, device=reference.device)
        real = torch.arange(length + pad, device=reference.device)[None, :, None] < length
        inputs_embeds = torch.where(real, F.pad(inputs_embeds, (0, 0, 0, pad)), model.get_input_embeddings()(pad_token))
    return input_ids, inputs_embeds, attention_mask


@register_patch("dynamo", "transformers.models.reformer.modeling_reformer.ReformerModel.forward")
def _patch_pad_before_the_model(original):
    from transformers.models.reformer.modeling_reformer import ReformerDynamicCache

    @functools.wraps(original)
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, num_hashes=None,
                past_buckets_states=None, use_cache=None, output_hidden_states=None, output_attentions=None,
                return_dict=None, **kwargs):
        call = dict(position_ids=position_ids, num_hashes=num_hashes,
                    past_buckets_states=past_buckets_states, use_cache=use_cache,
                    output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                    return_dict=return_dict, **kwargs)
        length = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        if (position_ids is not None or past_buckets_states is not None or self.training
                or (input_ids is not None and inputs_embeds is not None)
                or not length > _chunk_lengths(self.config)[1]):
            return original(self, input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **call)
        input_ids, inputs_embeds, attention_mask = pad_to_chunk_multiple(self, length, input_ids, inputs_embeds,
                                                                         attention_mask)
        out = original(self, input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **call)
        cache = out[1] if isinstance(out, tuple) and len(out) > 1 else getattr(out, "past_buckets_states", None)
        # back to the first `length` positions by index_select, not a slice: slicing [:, :length] asks
        # whether length is the whole padded size, a guard on the pad being 0 or not
        keep = torch.arange(length, device=attention_mask.device)
        if isinstance(cache, ReformerDynamicCache):
            # the layers cached the padded length, which eager (padding inside forward) leaves out
            cache._seen_tokens -= attention_mask.shape[-1] - length
            cache.states_cache = [states.index_select(1, keep) for states in cache.states_cache]
            cache.buckets_cache = [b.index_select(-1, keep) if b.dim() > 1 else b for b in cache.buckets_cache]
        if isinstance(out, tuple):
            return (out[0].index_select(1, keep), *out[1:])
        out.last_hidden_state = out.last_hidden_state.index_select(1, keep)
        return out

    return forward
