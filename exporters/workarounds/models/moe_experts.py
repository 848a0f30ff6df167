"""Model patches (two): MoE experts traced without their data-dependent loop over the experts hit:

- the experts of four families that loop over the experts hit, with every token's routed experts
  computed at once (``_patch_dense_*``, below: gathered weights, or a dense dispatch);
- the experts decorated with ``@use_experts_implementation`` switched to transformers' own
  ``batched_mm`` implementation (``_patch_experts_batched_mm``, on
  ``ExpertsInterface.get_interface``; see the end of this docstring).

Cause (dense dispatch). Four MoE families run their experts with the classic sparse loop and are not
decorated with ``@use_experts_implementation`` (so the ``batched_mm`` switch cannot reach them):

    expert_mask = one_hot(top_k_index, num_experts).permute(2, 1, 0)
    expert_hit = (expert_mask.sum(dim=(-1, -2)) > 0).nonzero()      # which experts got a token
    for expert_idx in expert_hit:                                     # data-dependent trip count
        top_k_pos, token_idx = torch.where(expert_mask[expert_idx])   # data-dependent size
        out = expert(hidden_states[token_idx]) * top_k_weights[token_idx, top_k_pos, None]
        final.index_add_(0, token_idx, out)

The number of iterations is the number of experts the routing happened to hit, so torch.export
stops with ``GuardOnDataDependentSymNode: Could not guard on data-dependent expression Eq(u0, 0)``
(in the ``unbind`` of ``expert_hit``):

- ``DbrxExperts.forward`` (models/dbrx/modeling_dbrx.py:292-295; experts are slices of flat
  ``w1``/``v1``/``w2`` run through ``DbrxExpertGLU``, input and output ``(batch, seq, hidden)``);
- ``LongcatFlashExperts.forward`` (models/longcat_flash/modeling_longcat_flash.py:187-192; experts
  ``>= n_routed_experts`` are *zero-compute* experts: the identity, scaled by their weight; also
  ``int(expert_idx_tensor.item())``). Those identity experts are combined per top-k slot rather than
  per expert (there are 256 of them in the released config, and in the sweep's tiny one: unrolling
  them all took LongcatFlashModel's export from 8 s to 43 s for nothing);
- ``Step3p7Experts.forward`` (models/step3p7/modeling_step3p7.py:564-565; a sentinel index
  ``num_experts`` means "no expert" and is skipped; clamped SwiGLU in ``_apply_gate``; the shared
  expert and the routed scaling live in ``Step3p7SparseMoeBlock``, outside the patched forward);
- ``SwitchTransformersExperts.forward`` (models/switch_transformers/modeling_switch_transformers.py:174,
  called by ``SwitchTransformersSparseMLP.forward``; the top-1 router hands it a one-hot dispatch
  mask ``(tokens, 1, num_experts)`` in which tokens past an expert's ``expert_capacity`` are
  already zeroed, and the max router probability ``(tokens, 1)``).

What this changes (while tracing only). Each forward is replaced by one with static shapes that
computes every token's routed experts at once.

- LongcatFlash and Step3p7 (hundreds of experts in their released configs: 512 and 288) gather each
  token's top-k experts' weights and run them as one batched matmul per projection, the form of
  transformers' own ``batched_mm``. The graph does not depend on the number of experts, and the
  compute is top_k expert MLPs per token, as in eager:

      before: for e in nonzero(hit): final[tokens_e] += expert_e(x[tokens_e]) * w[tokens_e, slot_e]
      after:  final = sum_k where(routed[:, k], expert(x; W[idx[:, k]]) * w[:, k], 0)

- Dbrx and SwitchTransformers (4 and 8 experts by default; SwitchTransformers' experts are separate
  modules) keep a dense dispatch: every expert runs on every token (a Python loop over
  ``range(num_experts)``, unrolled at trace time), combined through a dense ``(tokens, num_experts)``
  routing-weight matrix built by a one-hot comparison (``top_k_index[..., None] == arange(E)``; for
  SwitchTransformers the router's dispatch mask already is that one-hot):

      after:  W[t, e] = sum_k w[t, k] * (top_k_index[t, k] == e);  routed[t, e] = any_k(...)
              for e in range(E): final += where(routed[:, e], expert_e(x) * W[:, e], 0)

Why the cost matters. The dense dispatch adds about 20 graph nodes per expert per MoE layer: at the
released expert counts LongcatFlashModel's static export took 33.5 s on dynamo and did not finish in
300 s on ONNX, Step3p7Model's 11.1 s and 76.1 s (the sweep's zoo builds 4 experts, which hid it;
measured in results/s31/audit, issue 35). Gathered, both export in about the time they take at 4.
The gathered form's cost moves to memory at run time: it holds tokens x top_k copies of an expert's
weights per layer (as transformers' ``batched_mm`` does), harmless for the sweep's tiny models, large
for a long prompt through a full-size model; the dense form held none but ran every expert.

Why it is exact. The router is untouched, so tokens, weights and capacity drops are the ones eager
computes (a token dropped by SwitchTransformers' capacity has an all-zero dispatch row, so it gets 0
from every expert, as in eager). A routed (token, expert) pair gets eager's product and dtype cast
of that slot's weight; a slot or pair that is not routed adds an exact 0 through ``where`` (never
``0 * expert(x)``, which would be NaN for an infinite expert output eager never computes). Sentinel /
out-of-range indices select nothing (Step3p7 skips its sentinel the same way; for the gather they are
clamped to a valid index and masked). What can differ is the order of addition: eager adds a token's
experts in increasing expert index, the gathered form in top-k slot order, the dense form in expert
order (LongcatFlash's identity experts last, as in eager); and the matmuls' blocking. That is ~1e-7
in fp32 (``tests/test_moe_dense.py`` compares with eager's loop).

The ``batched_mm`` switch. Decorated experts default to ``grouped_mm``, which under export on
CPU/fp32 becomes the opaque custom op ``transformers::grouped_mm_fallback`` (a Python loop over
data-dependent offsets): no ONNX function and no ExecuTorch kernel exist for it. Their ``eager``
implementation loops over the ``nonzero()`` of the routing mask, as above. While tracing,
``ExpertsInterface.get_interface`` hands out ``batched_mm`` (a gather and a batched matmul, which
every backend lowers) for either: the same experts, summed in another order.

    before: experts_implementation="grouped_mm" or "eager"    after: "batched_mm"

Remove when: for the dense dispatch, Dbrx, LongcatFlash, Step3p7 and SwitchTransformers experts use
``@use_experts_implementation`` (or otherwise trace without the ``nonzero()`` loop: transformers'
modeling_dbrx.py, modeling_longcat_flash.py, modeling_step3p7.py, modeling_switch_transformers.py);
check with ``python -m sweeps.recheck workarounds --only
patch:dynamo:transformers.models.dbrx.modeling_dbrx.DbrxExperts.forward`` (and the three other paths
in ``DENSE_EXPERTS_PATHS``). For the switch, when ``grouped_mm`` traces to ops the backends lower
and the ``eager`` experts implementation traces without the ``nonzero()`` loop (transformers'
integrations/moe.py).
"""

from __future__ import annotations

import functools

import torch

from exporters.utils import register_patch

DBRX = "transformers.models.dbrx.modeling_dbrx.DbrxExperts.forward"
LONGCAT_FLASH = "transformers.models.longcat_flash.modeling_longcat_flash.LongcatFlashExperts.forward"
STEP3P7 = "transformers.models.step3p7.modeling_step3p7.Step3p7Experts.forward"
SWITCH_TRANSFORMERS = ("transformers.models.switch_transformers.modeling_switch_transformers."
                       "SwitchTransformersExperts.forward")
DENSE_EXPERTS_PATHS: tuple[str, ...] = (DBRX, LONGCAT_FLASH, STEP3P7, SWITCH_TRANSFORMERS)


def dense_routing(hit: torch.Tensor, top_k_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights, routed)``, both ``(tokens, num_experts)``, from a ``(tokens, top_k, num_experts)`` hit mask.

    ``weights[t, e]`` sums the weights of the top-k slots of token t that chose expert e (0 when none
    did; selected with ``where``, so another slot's weight never leaks in, even a non-finite one) and
    ``routed[t, e]`` says whether any slot did.
    """
    weights = torch.where(hit, top_k_weights.unsqueeze(-1), top_k_weights.new_zeros(()))
    return weights.sum(dim=1), hit.any(dim=1)


def one_hot_hit(top_k_index: torch.Tensor, num_experts: int) -> torch.Tensor:
    """``(tokens, top_k, num_experts)`` bool: ``top_k_index[t, k] == e``. Indices outside
    ``[0, num_experts)`` (a "no expert" sentinel) select nothing."""
    experts = torch.arange(num_experts, device=top_k_index.device, dtype=top_k_index.dtype)
    return top_k_index.unsqueeze(-1) == experts


def combine(final: torch.Tensor, expert_out: torch.Tensor, weights: torch.Tensor, routed: torch.Tensor,
            column: int) -> torch.Tensor:
    """``final + where(routed[:, c], (expert_out * weights[:, c]).to(final.dtype), 0)``: eager's
    ``index_add_`` of one expert's weighted output (column c of the dense routing matrix; a top-k
    slot for LongcatFlash's identity experts), for every token at once."""
    contribution = (expert_out * weights[:, column, None]).to(final.dtype)
    return final + torch.where(routed[:, column, None], contribution, contribution.new_zeros(()))


def slot_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x`` (tokens, in), or (tokens, top_k, in), through each top-k slot's own expert weight
    ``weight`` (tokens, top_k, out, in): (tokens, top_k, out). ``F.linear`` per slot, as one einsum."""
    if x.dim() == 2:
        return torch.einsum("ti,tkoi->tko", x, weight)
    return torch.einsum("tki,tkoi->tko", x, weight)


def slot_sum(out: torch.Tensor, top_k_weights: torch.Tensor, routed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``sum_k where(routed[:, k], (out[:, k] * w[:, k]).to(dtype), 0)``: each slot's weighted expert
    output, the slots that chose no expert of this kind adding an exact 0."""
    contribution = (out * top_k_weights.unsqueeze(-1)).to(dtype)
    return torch.where(routed.unsqueeze(-1), contribution, contribution.new_zeros(())).sum(dim=1)


@register_patch("dynamo", DBRX)
def _patch_dense_experts(original):
    """``DbrxExperts.forward`` with every expert run on every token, weighted by a dense routing matrix.

    before: for e in nonzero(hit): next[tok_e] += mlp(x[tok_e], w1[e], v1[e], w2[e]) * w[tok_e, k_e]
    after:  for e in range(E): next += where(routed[:, e], mlp(x, w1[e], v1[e], w2[e]) * W[:, e], 0)
    """

    @functools.wraps(original)
    def forward(self, hidden_states, top_k_index, top_k_weights):
        batch_size = hidden_states.shape[0]
        hidden_states = hidden_states.reshape(-1, self.hidden_size)
        weights, routed = dense_routing(one_hot_hit(top_k_index, self.num_experts), top_k_weights)
        split_expert_shape = (-1, self.ffn_hidden_size, self.hidden_size)
        w1 = self.mlp.w1.view(split_expert_shape)
        v1 = self.mlp.v1.view(split_expert_shape)
        w2 = self.mlp.w2.view(split_expert_shape)
        next_states = torch.zeros_like(hidden_states)
        for expert_idx in range(self.num_experts):
            states = self.mlp(hidden_states, w1[expert_idx], v1[expert_idx], w2[expert_idx])
            next_states = combine(next_states, states.view(-1, self.hidden_size), weights, routed, expert_idx)
        return next_states.view(batch_size, -1, self.hidden_size)

    return forward


@register_patch("dynamo", LONGCAT_FLASH)
def _patch_dense_longcat_flash_experts(original):
    """``LongcatFlashExperts.forward`` without the loop: each token's top-k routed experts' weights are
    gathered (``gate_up_proj[idx]``, ``down_proj[idx]``) and run as one batched SwiGLU per slot. The
    zero-compute experts (index ``>= n_routed_experts``, or all of them without ``gate_up_proj``) are
    all the identity, so a slot that chose one adds ``x * w[:, k]``. A slot adds only the kind of
    expert it chose (``where``, never ``0 * expert(x)``), and its weight multiplies as in eager.

    before: for e in nonzero(hit): final[tok_e] += expert_e(x[tok_e]) * w[tok_e, k_e]
    after:  final = sum_k where(idx[:, k] routed, swiglu(x; W[idx[:, k]]) * w[:, k], 0)
                  + sum_k where(idx[:, k] is a zero expert, x * w[:, k], 0)
    """

    @functools.wraps(original)
    def forward(self, hidden_states, top_k_index, top_k_weights):
        final_hidden_states = torch.zeros_like(hidden_states)
        if top_k_index.numel() == 0:
            return final_hidden_states
        num_computing = self.num_routed_experts if self.gate_up_proj is not None else 0
        if num_computing:
            routed = (top_k_index >= 0) & (top_k_index < num_computing)
            idx = top_k_index.clamp(0, num_computing - 1)  # a slot that chose no routed expert: masked below
            gate, up = slot_linear(hidden_states, self.gate_up_proj[idx]).chunk(2, dim=-1)
            out = slot_linear(self.act_fn(gate) * up, self.down_proj[idx])
            final_hidden_states = final_hidden_states + slot_sum(out, top_k_weights, routed, hidden_states.dtype)
        if self.total_experts > num_computing:
            zero_expert = (top_k_index >= num_computing) & (top_k_index < self.total_experts)
            identity = self.identity_expert(hidden_states).unsqueeze(1).expand(-1, top_k_index.shape[-1], -1)
            final_hidden_states = final_hidden_states + slot_sum(identity, top_k_weights, zero_expert,
                                                                 hidden_states.dtype)
        return final_hidden_states

    return forward


@register_patch("dynamo", STEP3P7)
def _patch_dense_step3p7_experts(original):
    """``Step3p7Experts.forward`` without the loop: each token's top-k experts' weights are gathered and
    run as one batched clamped SwiGLU per slot (the sentinel index ``num_experts`` selects no expert,
    as in eager: that slot adds an exact 0).

    before: for e in nonzero(hit) if e != E: final[tok_e] += down_e(gate(gate_up_e(x[tok_e]))) * w[tok_e, k_e]
    after:  final = sum_k where(idx[:, k] < E, down(gate(gate_up(x; W[idx[:, k]]))) * w[:, k], 0)
    """

    @functools.wraps(original)
    def forward(self, hidden_states, top_k_index, top_k_weights):
        routed = (top_k_index >= 0) & (top_k_index < self.num_experts)
        idx = top_k_index.clamp(0, self.num_experts - 1)  # the sentinel: masked below
        current = self._apply_gate(slot_linear(hidden_states, self.gate_up_proj[idx]))
        current = slot_linear(current, self.down_proj[idx])
        return slot_sum(current, top_k_weights, routed, hidden_states.dtype)

    return forward


@register_patch("dynamo", SWITCH_TRANSFORMERS)
def _patch_dense_switch_transformers_experts(original):
    """``SwitchTransformersExperts.forward`` densely. ``selected_experts`` is the router's
    ``(tokens, 1, num_experts)`` dispatch mask, capacity overflow already zeroed, so it is the hit mask
    itself: a dropped token has no expert and gets 0, as in eager.

    before: for e in nonzero(hit): final[tok_e] += expert_e(x[tok_e]) * w[tok_e, 0]
    after:  for e in range(E): final += where(routed[:, e], expert_e(x) * W[:, e], 0)
    """

    @functools.wraps(original)
    def forward(self, hidden_states, selected_experts, routing_weights):
        final_hidden_states = torch.zeros_like(hidden_states)
        weights, routed = dense_routing(selected_experts[..., : self.num_experts] != 0, routing_weights)
        for expert_idx in range(self.num_experts):
            current_hidden_states = self[f"expert_{expert_idx}"](hidden_states)
            final_hidden_states = combine(final_hidden_states, current_hidden_states, weights, routed, expert_idx)
        return final_hidden_states

    return forward


@register_patch("dynamo", "transformers.integrations.moe.ExpertsInterface.get_interface")
def _patch_experts_batched_mm(original):
    """MoE experts default to ``grouped_mm``, which under export on CPU/fp32 becomes the opaque custom
    op ``transformers::grouped_mm_fallback`` (a Python loop over data-dependent offsets): no ONNX
    function and no ExecuTorch kernel exist for it. transformers' own ``batched_mm`` implementation
    computes the same experts with a gather and a batched matmul, which every backend lowers.

    The decorated class's own ``eager`` forward loops ``for expert_idx in expert_hit`` over the
    ``nonzero()`` of the routing mask, a data-dependent iteration count torch.export cannot trace;
    a model that asks for it (OpenAI Privacy Filter defaults to ``eager`` for accumulation order)
    gets ``batched_mm`` too: the same experts, summed in another order.

    before: experts_implementation="grouped_mm" or "eager"    after: "batched_mm" (while tracing only)
    """
    from transformers.integrations import moe

    def get_interface(self, experts_implementation, default):
        fn = original(self, experts_implementation, default)
        return moe.batched_mm_experts_forward if fn in (moe.grouped_mm_experts_forward, default) else fn

    return get_interface
