"""Model patch (Mamba v1 mixers: Mamba, FalconMamba, Jamba, Zamba): the full-sequence scan starts from the
recurrent state the cache holds.

Cause. Each family's ``mamba_selective_scan`` (models/mamba/modeling_mamba.py:174, and its copies in
modeling_falcon_mamba.py, modeling_jamba.py, modeling_zamba.py) runs the selective scan over a whole
sequence from a zero state ("'Initial hidden state' is not supported by the kernel path, so use the same
zero initialization as the kernel"), and the mixer calls it whenever more than one token comes in, even
when the cache holds a previous state (the convolution before it does start from the cached window). The
model's own ``generate`` never makes such a call (a prompt from nothing, then one token a step), but a
runtime that runs one graph for the prompt and every step (onnxruntime-genai, exporters/generation/
genai.py) does: there the graph's multi-token path must continue from the given state. Unpatched, two
tokens after a first call are 4.84 off the whole-sequence forward in logits (tiny Jamba), 9.94 (Zamba).

What this changes. Only a mixer call over more than one token whose cache holds a previous recurrent state
(``cache_params.get_recurrent_state`` is not None); every other call (a prompt from nothing, a one-token
step, no cache) runs the original code. There the scan computes, for the same discretization
(``a_t = exp(A dt_t)``, ``b_t = dt_t B_t u_t``) and from the given state ``h_0``,

    h_t = (a_1 ... a_t) h_0 + sum_{s <= t} (a_{s+1} ... a_t) b_s,      y_t = C_t . h_t (+ D u_t, * silu(z_t))

in closed form: the products are ``exp`` of segment sums of ``A dt`` over a [t, s] grid (each sum
accumulated along its own segment, as Mamba-2's ``segment_sum`` does, not as a difference of two long
prefix sums), so no loop runs over the sequence and a dynamic length exports. Memory is quadratic in the
new tokens (batch x channels x state x S x S), which is what a prompt of a tiny model, or a short chunk,
can afford; the one-token path is untouched. Zamba's mixer scans each of its heads separately: the heads'
states are handed to its scans in order.

Why it is exact. The same recurrence, summed in another order: with ``h_0 = 0`` it equals the original
loop within float32 rounding; the sweep's runner items compare generated tokens with eager ``generate``
and genai.py checks, before export, that two tokens after a first call match the whole-sequence forward.

Remove when: transformers' Mamba (v1) scan takes the cached state as its initial state (as Mamba-2's
``mamba2_chunk_scan`` takes ``initial_states``).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from exporters.utils import ActedFlag, register_patch

FAMILIES = {"mamba": "MambaMixer", "falcon_mamba": "FalconMambaMixer", "jamba": "JambaMambaMixer",
            "zamba": "ZambaMambaMixer"}
SCAN_PATHS = tuple(f"transformers.models.{m}.modeling_{m}.mamba_selective_scan" for m in FAMILIES)
MIXER_PATHS = tuple(f"transformers.models.{m}.modeling_{m}.{cls}.forward" for m, cls in FAMILIES.items())

# per mixer call under way: the initial states its scans take, in order (one, or one per Zamba head)
_PENDING: list[list[torch.Tensor]] = []


def segment_sums(x: torch.Tensor) -> torch.Tensor:
    """``out[..., t, s] = x[..., s+1] + ... + x[..., t]`` for ``s <= t`` (0 on the diagonal), -inf above it."""
    length = x.shape[-1]
    grid = x[..., None].expand(*x.shape, length)  # [..., t, s] = x[t]
    below = torch.ones(length, length, dtype=torch.bool, device=x.device).tril(-1)
    sums = grid.masked_fill(~below, 0).cumsum(dim=-2)
    return sums.masked_fill(~torch.ones(length, length, dtype=torch.bool, device=x.device).tril(), float("-inf"))


def scan_from(initial: torch.Tensor, hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
              B: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
              delta_bias: torch.Tensor | None = None, delta_softplus: bool = False,
              return_last_state: bool = False):
    """``mamba_selective_scan``'s result (same arguments, same layouts: ``hidden_states`` / ``dt`` / ``z``
    [batch, channels, S], ``B`` / ``C`` [batch, state, S], ``A`` [channels, state]) from ``initial``
    [batch, channels, state] instead of zero (module docstring)."""
    input_dtype = hidden_states.dtype
    if delta_bias is not None:
        dt = dt + delta_bias.to(dt.dtype)[..., None]
    if delta_softplus:
        dt = F.softplus(dt)
    log_a = (A[None, :, None, :] * dt[:, :, :, None]).permute(0, 1, 3, 2)  # [batch, channels, state, S]
    inflow = (dt[:, :, None, :] * B[:, None, :, :].float() * hidden_states[:, :, None, :].float())  # same layout
    decay = torch.exp(segment_sums(log_a))  # [batch, channels, state, t, s]
    states = torch.einsum("bcnts,bcns->bcnt", decay, inflow)
    states = states + torch.exp(torch.cumsum(log_a, dim=-1)) * initial.float()[..., None]
    scan_output = torch.einsum("bcnt,bnt->bct", states.to(input_dtype), C)
    if D is not None:
        scan_output = scan_output + hidden_states * D[None, :, None]
    if z is not None:
        scan_output = scan_output * F.silu(z)
    if return_last_state:
        return scan_output, states[..., -1]
    return scan_output


@register_patch("dynamo", *SCAN_PATHS)
def _patch_scan_from_given_state(original):
    acted = ActedFlag()

    @functools.wraps(original)
    def mamba_selective_scan(hidden_states, dt, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                             return_last_state=False, **kwargs):
        pending = _PENDING[-1] if _PENDING else None
        if not pending:
            return original(hidden_states, dt, A, B, C, D=D, z=z, delta_bias=delta_bias, delta_softplus=delta_softplus,
                            return_last_state=return_last_state, **kwargs)
        acted.set()
        return scan_from(pending.pop(0), hidden_states, dt, A, B, C, D=D, z=z, delta_bias=delta_bias,
                         delta_softplus=delta_softplus, return_last_state=return_last_state)

    mamba_selective_scan.acted = acted
    return mamba_selective_scan


@register_patch("dynamo", *MIXER_PATHS)
def _patch_mixer_hands_its_state(original):
    acted = ActedFlag()

    @functools.wraps(original)
    def forward(self, hidden_states, cache_params=None, attention_mask=None, **kwargs):
        state = None
        if cache_params is not None and hidden_states.shape[1] > 1:
            state = cache_params.get_recurrent_state(self.layer_idx, state_idx=0)
        if state is None:
            return original(self, hidden_states, cache_params=cache_params, attention_mask=attention_mask, **kwargs)
        acted.set()
        # Zamba's mixer scans each head separately (its state: [batch, heads, channels, state])
        _PENDING.append(list(state.unbind(1)) if getattr(self, "n_mamba_heads", None) else [state])
        try:
            result = original(self, hidden_states, cache_params=cache_params, attention_mask=attention_mask, **kwargs)
            left = len(_PENDING[-1])
        finally:
            _PENDING.pop()
        if left:  # a mixer whose scans did not take every state it was given: its code changed
            raise RuntimeError(f"{type(self).__name__}: {left} of the recurrent states it was given were not scanned "
                               "(exporters/workarounds/models/mamba_scan.py expects one scan per state)")
        return result

    forward.acted = acted
    return forward
