"""Model patch (Qwen4Exp): the QSA indexer's block selection computed for every query at once, with
static shapes, instead of a Python loop over batch and query positions with ``nonzero``.

Cause. ``Qwen4ExpTextQSAIndexer.forward`` (models/qwen4_exp/modeling_qwen4_exp.py:723-754) loops over
every (batch, query) pair, takes ``torch.nonzero`` of the query's visible keys (a data-dependent
count) and branches on ``if num_complete_blocks > 0``, which torch.export cannot decide ("Could not
guard on data-dependent expression ((u0//2)) > 0").

What this changes (while tracing only). The same selection, as masks over a fixed grid. For each
query, a visible key's rank among the visible keys (a cumulative sum) gives its block
(``rank // compress_ratio``); blocks below ``n_visible // compress_ratio`` are complete, the rest of
the visible keys are the tail, always kept. Each complete block's pooled key is the mean of its keys
(a 0/1 membership matrix times the keys), normalised and rotated at its first key's position, and
scored against the query exactly as the loop does (relu of each head's dot product, summed, over
sqrt(head_dim)). Incomplete blocks score -inf, so the top ``block_topk`` of the fixed grid are the
loop's top ``min(block_topk, n_complete)`` plus blocks that are then dropped. A key is selected
when it is in the tail or in a chosen block: the mask the loop builds from its index list.

    before: for b, q: v = nonzero(visible[b, 0, q]); if len(v) // C > 0: ... topk(min(k, len(v) // C))
    after:  rank = cumsum(visible) - 1; block = rank // C; member[b, q, m, j] = block == m (complete)
            score = relu(q . rope(norm(member @ keys / C))).sum(heads); keep = tail | member[topk(score)]

Exact ties between block scores (several blocks with every head's dot product <= 0 score 0) are
broken by ``topk`` over a different length than the loop's, so the choice among equal scores may
differ; the loop's own choice among them is arbitrary too.

Remove when: ``Qwen4ExpTextQSAIndexer.forward`` selects the blocks for every query at once with
masks, without the loop over (batch, query), ``torch.nonzero`` and the branch on
``num_complete_blocks`` (transformers' modeling_qwen4_exp.py).
"""

from __future__ import annotations

import functools
import math

import torch

from exporters.utils import register_patch


def select_tokens(indexer, q: torch.Tensor, raw_keys: torch.Tensor, visible: torch.Tensor, full_cos: torch.Tensor,
                  full_sin: torch.Tensor, rotate) -> torch.Tensor:
    """The (batch, seq, kv) mask of keys the indexer keeps for each query, for ``q`` (batch, seq, heads,
    dim) after norm and rotary, ``raw_keys`` (batch, kv, dim), ``visible`` (batch, seq, kv) bool."""
    ratio = indexer.compress_ratio
    kv_length = visible.shape[-1]
    n_blocks = kv_length // ratio
    rank = visible.to(torch.int64).cumsum(-1) - 1
    complete_blocks = visible.sum(-1, keepdim=True) // ratio  # (batch, seq, 1)
    block = torch.where(visible, torch.div(rank, ratio, rounding_mode="floor"), n_blocks)
    in_complete = visible & (block < complete_blocks)
    tail = visible & ~in_complete
    if n_blocks == 0 or indexer.block_topk == 0:
        return tail
    grid = torch.arange(n_blocks, device=visible.device)
    member = in_complete.unsqueeze(-2) & (block.unsqueeze(-2) == grid[:, None])  # (batch, seq, blocks, kv)

    pooled = torch.einsum("bsmk,bkd->bsmd", member.float(), raw_keys.float()) / ratio
    pooled = indexer.k_layernorm(pooled.to(raw_keys.dtype))
    first = member & (torch.remainder(rank, ratio) == 0).unsqueeze(-2)
    start = (first.to(torch.int64) * torch.arange(kv_length, device=visible.device)).sum(-1)  # (batch, seq, blocks)
    batch, seq = start.shape[:2]
    flat = start.reshape(batch, seq * n_blocks, 1)
    cos = full_cos.gather(1, flat.expand(-1, -1, full_cos.shape[-1])).view(batch, seq, n_blocks, -1)
    sin = full_sin.gather(1, flat.expand(-1, -1, full_sin.shape[-1])).view(batch, seq, n_blocks, -1)
    block_keys = rotate(pooled.unsqueeze(-2), cos=cos, sin=sin, unsqueeze_dim=-2).squeeze(-2)

    scores = torch.einsum("bshd,bsmd->bsmh", q.float(), block_keys.float())
    scores = torch.relu(scores).sum(dim=-1) / math.sqrt(indexer.index_head_dim)
    valid = grid < complete_blocks  # (batch, seq, blocks)
    scores = scores.masked_fill(~valid, float("-inf"))
    top = scores.topk(min(indexer.block_topk, n_blocks), dim=-1).indices
    top = torch.where(valid.gather(-1, top), top, n_blocks)  # a chosen incomplete block chooses nothing
    chosen = torch.zeros(batch, seq, n_blocks + 1, dtype=torch.bool, device=visible.device)
    chosen = chosen.scatter(-1, top, True)[..., :n_blocks]
    in_chosen = (member & chosen.unsqueeze(-1)).any(-2)
    return tail | in_chosen


@register_patch("dynamo", "transformers.models.qwen4_exp.modeling_qwen4_exp.Qwen4ExpTextQSAIndexer.forward")
def _patch_qwen4exp_indexer_vectorized(original):
    from transformers.models.qwen4_exp import modeling_qwen4_exp as mq

    @functools.wraps(original)
    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_values):
        batch_size, seq_length, _ = hidden_states.shape
        full_cos, full_sin = position_embeddings
        current_cos, current_sin = full_cos[:, -seq_length:, :], full_sin[:, -seq_length:, :]
        qk = self.index_qk_proj(hidden_states)
        q, token_k = torch.split(
            qk, [self.index_n_heads * self.index_head_dim, self.index_kv_heads * self.index_head_dim], dim=-1)
        hidden_shape = (batch_size, seq_length, -1, self.index_head_dim)
        q, raw_keys = q.reshape(*hidden_shape), token_k.reshape(*hidden_shape).squeeze(2)
        if raw_keys.dim() != 3:  # several indexer kv heads: the loop cannot run them either
            return original(self, hidden_states, position_embeddings, attention_mask, past_key_values)
        q = mq.apply_rotary_pos_emb(self.q_layernorm(q), cos=current_cos, sin=current_sin, unsqueeze_dim=2)
        if past_key_values is not None:
            raw_keys = past_key_values.update_indexer(raw_keys, self.layer_idx)
        visible = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
        keep = select_tokens(self, q, raw_keys, visible[:, 0], full_cos, full_sin, mq.apply_rotary_pos_emb)
        return keep.unsqueeze(1)

    return forward
