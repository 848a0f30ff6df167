"""Model patch (xLSTM): the mLSTM cell over several tokens from a given state in closed form, so a graph with a
dynamic sequence exports.

Cause. In inference mode ``xLSTMBackend.forward`` (models/xlstm/modeling_xlstm.py:734-850) runs
``wrap_chunkwise_arbitrary_sequence_length``, which splits the sequence into chunks in Python
(``sequence_length // chunk_size``, a loop over the remainder, ``mlstm_chunkwise_fw`` requiring the length to
divide by the chunk size): torch.export specializes the length to the traced one ('Constraints violated (seq)
... specialized it to be a constant (7)'). onnxruntime-genai runs one graph for the prompt and every step
(exporters/generation/genai_state.py), whose sequence must stay dynamic.

What this changes. Only while ``_one_graph.one_graph_export()`` is entered (that export) and the export's patches are
installed, and only for an inference call over more than one token; every other call runs the original. With the
state ``(C_0, n_0, m_0)`` (the cell, the normalizer, the log-scale they are kept at), ``L_t`` the running sum of
``logsigmoid(f)``, and ``q_t`` scaled by ``dhqk^-1/2``, each token ``t`` weighs every earlier-or-same token ``s``
by ``exp(L_t - L_s + i_s - m_t)`` and the state by ``exp(L_t + m_0 - m_t)``, with ``m_t`` the largest of those
exponents (what the recurrent step's running maximum unrolls to):

    h_t = (sum_s w_ts (q_t . k_s) v_s + w_t0 q_t C_0) / (max(|sum_s w_ts (q_t . k_s) + w_t0 q_t . n_0|, exp(-m_t)) + eps)

and the state after ``T`` tokens is the same sums at ``t = T``: ``C_T = w_T0 C_0 + sum_s w_Ts k_s v_s^T``,
``n_T = w_T0 n_0 + sum_s w_Ts k_s``, ``m_T``. That is ``mlstm_recurrent_step_native`` applied token by token,
summed in closed form over a [t, s] grid (no loop over the sequence).

Why it is exact. The same recurrence in another order (within float32 rounding of the step kernel; tests/
test_static_state.py compares them from a given state); genai.py's eager check compares two tokens after a
first call with the whole-sequence forward before export.

Remove when: xLSTM's inference kernel takes a symbolic sequence length (no Python chunk arithmetic on it).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from exporters.utils import ActedFlag, register_patch
from exporters.workarounds.models._one_graph import exporting_one_graph

PATH = "transformers.models.xlstm.modeling_xlstm"

def mlstm_closed_form(query, key, value, igate, fgate, c_initial=None, n_initial=None, m_initial=None, eps=1e-6,
                      dtype_state=torch.float32):
    """``(h, (C_T, n_T, m_T))`` for ``query`` / ``key`` [batch, heads, T, dhqk], ``value`` [batch, heads, T,
    dhv], ``igate`` / ``fgate`` [batch, heads, T] from the given state (zeros where None): module docstring."""
    batch, heads, length, dhqk = query.shape
    dhv = value.shape[-1]
    q = query.to(dtype_state) * dhqk ** -0.5
    k, v = key.to(dtype_state), value.to(dtype_state)
    c0 = c_initial.to(dtype_state) if c_initial is not None else q.new_zeros(batch, heads, dhqk, dhv)
    n0 = n_initial.to(dtype_state) if n_initial is not None else q.new_zeros(batch, heads, dhqk)
    m0 = m_initial.to(dtype_state)[..., 0] if m_initial is not None else q.new_zeros(batch, heads)
    cumulative = F.logsigmoid(fgate.to(dtype_state)).cumsum(-1)  # L_t, [B, H, T]
    earlier = torch.ones(length, length, dtype=torch.bool, device=query.device).tril()
    exponents = (cumulative[..., :, None] - cumulative[..., None, :] + igate.to(dtype_state)[..., None, :])
    exponents = exponents.masked_fill(~earlier, float("-inf"))  # [B, H, t, s]
    held = cumulative + m0[..., None]  # the state's exponent at t, [B, H, T]
    top = torch.maximum(exponents.amax(-1), held)
    weights = torch.exp(exponents - top[..., None])
    kept = torch.exp(held - top)
    scores = (q @ k.transpose(-1, -2)) * weights  # [B, H, t, s]
    numerator = scores @ v + kept[..., None] * (q @ c0)
    normalizer = scores.sum(-1) + kept * (q @ n0[..., None])[..., 0]
    h = numerator / (torch.maximum(normalizer.abs(), torch.exp(-top))[..., None] + eps)
    # the state after the last token
    last_w, last_kept, last_top = weights[..., -1, :], kept[..., -1], top[..., -1]
    c_t = last_kept[..., None, None] * c0 + (k * last_w[..., None]).transpose(-1, -2) @ v
    n_t = last_kept[..., None] * n0 + (k * last_w[..., None]).sum(-2)
    return h.to(query.dtype), (c_t, n_t, last_top[..., None])


@register_patch("dynamo", f"{PATH}.xLSTMBackend.forward")
def _patch_mlstm_closed_form(original):
    acted = ActedFlag()

    @functools.wraps(original)
    def forward(self, query, key, value, igate, fgate, c_initial=None, n_initial=None, m_initial=None,
                return_last_states=None, mode=None):
        if not exporting_one_graph() or "inference" not in (mode or self.config.mode) or query.shape[2] == 1:
            return original(self, query, key, value, igate, fgate, c_initial=c_initial, n_initial=n_initial,
                            m_initial=m_initial, return_last_states=return_last_states, mode=mode)
        acted.set()
        return mlstm_closed_form(query, key, value, igate, fgate, c_initial, n_initial, m_initial, eps=self.config.eps,
                                 dtype_state=getattr(torch, self.config.inference_state_dtype))

    forward.acted = acted
    return forward
