"""Model patch (GPT-Neo): the causal and local-window bias rows taken at the queries' positions.

Cause. ``GPTNeoSelfAttention._attn`` (models/gpt_neo/modeling_gpt_neo.py:115) slices its bias as
``bias[:, :, key_length - query_length : key_length, :key_length]``: the rows of the last ``query_length``
positions of the keys. That holds when the keys are the positions written so far (no cache, a dynamic
cache), not over a static cache, whose keys are ``max_cache_len`` long: the prompt's rows are then the
bias rows of the cache's last positions, and the local layers' window lands elsewhere. The model's own
``generate(cache_implementation='static')`` differs from its default generate by 1.13 at step 0 (eager,
tiny config window_size 4, prompt 7); the exported static step, over the same cache, as much
(test_generate dynamo/static, test_runner executorch).

What this changes (while tracing only, and only over a static cache layer, one with a ``cumulative_length``
tensor and a maximum length). The queries' positions are the ones the cache just wrote,
``cumulative_length - query_length + arange(query_length)``, and the bias rows are taken there; the rest of
the attention is the original's. Without a cache or over a dynamic one the original forward runs.

    before: bias[:, :, K - q : K, :K]                 (K = max_cache_len over a static cache)
    after:  bias[0, 0].index_select(0, positions)[:, :K]

Remove when: GPT-Neo indexes its bias by cache_position (or builds its local mask with masking_utils'
sliding-window mask).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from exporters.utils import register_patch
from exporters.workarounds.models._static_slots import static_self_layer


def _attend(self, query, key, value, attention_mask, positions):
    """``_attn`` with the bias rows at ``positions`` (the original's arithmetic otherwise)."""
    query, key = query.to(torch.float32), key.to(torch.float32)
    weights = torch.matmul(query, key.transpose(-1, -2))
    key_length = key.size(-2)
    causal = self.bias[0, 0].index_select(0, positions)[:, :key_length][None, None]
    weights = torch.where(causal, weights, torch.tensor(torch.finfo(weights.dtype).min, dtype=weights.dtype))
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = nn.functional.softmax(weights, dim=-1).to(value.dtype)
    weights = self.attn_dropout(weights)
    return torch.matmul(weights, value), weights


@register_patch("dynamo", "transformers.models.gpt_neo.modeling_gpt_neo.GPTNeoSelfAttention.forward")
def _patch_gpt_neo_static_bias(original):
    @functools.wraps(original)
    def forward(self, hidden_states, attention_mask=None, layer_past=None, use_cache=False,
                output_attentions=False, **kwargs):
        layer = static_self_layer(layer_past, self.layer_id)
        if layer is None:
            return original(self, hidden_states, attention_mask=attention_mask, layer_past=layer_past,
                            use_cache=use_cache, output_attentions=output_attentions, **kwargs)
        query = self._split_heads(self.q_proj(hidden_states), self.num_heads, self.head_dim)
        key = self._split_heads(self.k_proj(hidden_states), self.num_heads, self.head_dim)
        value = self._split_heads(self.v_proj(hidden_states), self.num_heads, self.head_dim)
        key, value = layer_past.update(key, value, self.layer_id)
        length = query.size(-2)
        positions = layer.cumulative_length - length + torch.arange(length, device=query.device)
        output, weights = _attend(self, query, key, value, attention_mask, positions)
        output = self.resid_dropout(self.out_proj(self._merge_heads(output, self.num_heads, self.head_dim)))
        return output, weights

    return forward
