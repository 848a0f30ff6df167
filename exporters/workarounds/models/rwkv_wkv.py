"""Model patch (Rwkv): the WKV recurrence over several tokens in closed form, so a graph with a dynamic
sequence exports.

Cause. On CPU (and for one token anywhere) transformers' Rwkv computes its attention with
``rwkv_linear_attention_cpu`` (models/rwkv/modeling_rwkv.py:162), a Python loop over the sequence. A graph
whose sequence length is dynamic cannot hold that loop: torch.export needs the trip count. onnxruntime-genai
runs one graph for the prompt and every step (exporters/generation/genai_state.py), so its graph needs a
dynamic sequence that starts from the given state.

What this changes. Only while ``_one_graph.one_graph_export()`` is entered (the onnxruntime-genai export of a model
with a state of its own) and the export's patches are installed, and only for a call over more than one
token; every other call (the forward sweep's exports, a one-token call) runs the loop.
With ``w = -exp(time_decay)``, ``u = time_first`` and the state kept as ``(num, den, m)`` standing for
``num * exp(m)`` and ``den * exp(m)``, token ``t`` of the call sees

    out_t = (e^(t w + m) num + sum_{i<t} e^((t-1-i) w + k_i) v_i + e^(u + k_t) v_t)
          / (e^(t w + m) den + sum_{i<t} e^((t-1-i) w + k_i)     + e^(u + k_t))

and the state after ``T`` tokens is the same sums at ``t = T`` without the ``u`` term. Each is computed
over a [t, i] grid of exponents with the row's maximum subtracted (the loop subtracts a running maximum for
the same reason), so nothing overflows; memory is batch x S x S x channels, which a prompt of a tiny model
affords.

Why it is exact. The same sums in another order: within float32 rounding of the loop (tests/
test_static_state.py compares them from a given state); genai.py's eager check compares two tokens after a
first call with the whole-sequence forward before export.

Remove when: transformers' Rwkv computes its CPU attention without a loop over the sequence.
"""

from __future__ import annotations

import functools

import torch

from exporters.utils import ActedFlag, register_patch
from exporters.workarounds.models._one_graph import exporting_one_graph

PATH = "transformers.models.rwkv.modeling_rwkv"


def wkv_closed_form(time_decay: torch.Tensor, time_first: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    state: list[torch.Tensor] | None = None, return_state: bool = False):
    """``rwkv_linear_attention_cpu``'s outputs (module docstring): ``(output, state)``."""
    length = key.shape[1]
    k = key.float()
    w = -torch.exp(time_decay.float())  # [C]
    u = time_first.float()
    if state is None:
        num = torch.zeros_like(k[:, 0])
        den = torch.zeros_like(k[:, 0])
        start = torch.zeros_like(k[:, 0]) - 1e38
    else:
        num, den, start = state
    steps = torch.arange(length, device=key.device, dtype=torch.float32)
    gaps = steps[:, None] - 1 - steps[None, :]  # [t, i] = t - 1 - i
    before = torch.ones(length, length, dtype=torch.bool, device=key.device).tril(-1)
    # exponents of every earlier token i at t, the token itself at t, and the state at t: [B, t, i, C] / [B, t, C]
    earlier = (gaps[None, :, :, None] * w + k[:, None, :, :]).masked_fill(~before[None, :, :, None], float("-inf"))
    own = u + k
    held = steps[None, :, None] * w + start[:, None, :]
    top = torch.maximum(torch.maximum(earlier.amax(dim=2), own), held)
    weights = torch.exp(earlier - top[:, :, None, :])
    v = value.float()
    numerator = torch.exp(held - top) * num[:, None] + (weights * v[:, None, :, :]).sum(dim=2) + torch.exp(own - top) * v
    denominator = torch.exp(held - top) * den[:, None] + weights.sum(dim=2) + torch.exp(own - top)
    output = (numerator / denominator).to(key.dtype)
    if not (return_state or state is not None):
        return output, None
    # the state after the last token: every token i with exponent (T - 1 - i) w + k_i, the old one T w + m
    last = (length - 1 - steps)[:, None] * w + k  # [B, i, C]
    carried = length * w + start
    new_top = torch.maximum(last.amax(dim=1), carried)
    spread = torch.exp(last - new_top[:, None])
    kept = torch.exp(carried - new_top)
    return output, [kept * num + (spread * v).sum(dim=1), kept * den + spread.sum(dim=1), new_top]


@register_patch("dynamo", f"{PATH}.rwkv_linear_attention_cpu")
def _patch_wkv_closed_form(original):
    acted = ActedFlag()

    @functools.wraps(original)
    def rwkv_linear_attention_cpu(time_decay, time_first, key, value, state=None, return_state=False):
        if not exporting_one_graph() or key.shape[1] == 1:
            return original(time_decay, time_first, key, value, state=state, return_state=return_state)
        acted.set()
        return wkv_closed_form(time_decay, time_first, key, value, state=state, return_state=return_state)

    rwkv_linear_attention_cpu.acted = acted
    return rwkv_linear_attention_cpu
