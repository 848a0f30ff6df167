"""Model patch (MiniMax): lightning attention over several tokens from a given state, in closed form.

Cause. ``MiniMaxLightningAttention.forward`` (models/minimax/modeling_minimax.py:175-270) takes one of two
paths: with no state in the cache, blocks of ``block_size`` tokens from a zero state; with a state, a
Python loop over the new tokens (``for i in range(seq_len)``). The model's own generate only ever gives a
state with one token, but onnxruntime-genai runs one graph for the prompt and every step
(exporters/generation/genai.py), whose linear layers are handed their state at every call: there the loop
runs over a dynamic sequence, which torch.export cannot hold (it needs the trip count).

What this changes. Only a call over more than one token whose cache holds this layer's state; every other
call (the prompt from no state, a one-token step, no cache) runs the original code. There, with the state
``S_0`` (``K^T V`` so far), ``r = exp(-slope_rate)`` per head and the new tokens' ``q_i, k_i, v_i``,

    out_i = r^(i+1) q_i S_0 + sum_{j <= i} r^(i-j) (q_i . k_j) v_j
    S_T   = r^T S_0 + sum_j r^(T-1-j) k_j^T v_j

which is the loop's recurrence (``S_i = r S_(i-1) + k_i^T v_i``, ``out_i = q_i S_i``) summed in closed form:
one [T, T] decay mask per head, no loop. The projections, the padding mask, the norm, the output gate and the
cache update are the original's.

Why it is exact. The same sums in another order (within float32 rounding); genai.py's eager check compares
two tokens after a first call with the model's forward over the whole sequence before export.

Remove when: transformers' lightning attention computes its cached multi-token path without a loop over the
sequence.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from exporters.utils import ActedFlag, register_patch

PATH = "transformers.models.minimax.modeling_minimax"


def lightning_from_state(slope: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, new_state)`` for ``query`` / ``key`` / ``value`` [batch, heads, T, dim] from ``state`` [batch,
    heads, dim, dim], ``slope`` [heads, 1, 1] (module docstring)."""
    length = query.shape[2]
    steps = torch.arange(length, device=query.device, dtype=query.dtype)
    gaps = steps[:, None] - steps[None, :]  # i - j
    decay = torch.exp(-slope * gaps.clamp(min=0)).masked_fill(gaps < 0, 0.0)  # [heads, T, T]
    intra = torch.matmul(torch.matmul(query, key.transpose(-1, -2)) * decay, value)
    inter = torch.matmul(query * torch.exp(-slope * (steps[:, None] + 1)), state)
    kept = torch.exp(-slope * length) * state + torch.matmul(
        (key * torch.exp(-slope * (length - 1 - steps)[:, None])).transpose(-1, -2), value)
    return intra + inter, kept


@register_patch("dynamo", f"{PATH}.MiniMaxLightningAttention.forward")
def _patch_lightning_from_state(original):
    acted = ActedFlag()

    @functools.wraps(original)
    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None, **kwargs):
        state = past_key_values.get_linear_cache(self.layer_idx) if past_key_values is not None else None
        if state is None or hidden_states.shape[1] == 1:
            return original(self, hidden_states, position_embeddings, attention_mask, past_key_values=past_key_values,
                            **kwargs)
        import importlib

        module = importlib.import_module(PATH)
        acted.set()
        batch, length, _ = hidden_states.shape
        qkv = module.apply_mask_to_padding_states(self.act_fn(self.qkv_proj(hidden_states)), attention_mask)
        qkv = qkv.reshape(batch, length, self.num_attention_heads, 3 * self.head_dim)
        query, key, value = (t.transpose(1, 2) for t in torch.split(qkv, self.head_dim, dim=3))
        out, kept = lightning_from_state(self.slope_rate, query, key, value, state)
        out = out.transpose(1, 2).reshape(batch, length, self.num_attention_heads * self.head_dim)
        out = self.out_proj(F.sigmoid(self.output_gate(hidden_states)) * self.norm(out))
        past_key_values.set_linear_cache(self.layer_idx, kept)
        return out, kept

    forward.acted = acted
    return forward
