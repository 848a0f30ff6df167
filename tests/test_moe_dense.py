"""exporters/workarounds/models/moe_experts.py: MoE experts looping over ``nonzero()`` of the routing, run densely.

For each family the experts module alone is built from a tiny config and fed random hidden states
with the routing of the model's own router. The patched forward must compute what eager's sparse
loop computes (zero/identity experts, a "no expert" sentinel, clamped SwiGLU, tokens dropped by
expert capacity), and ``torch.export`` must trace the patched module while the original stops.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from exporters.utils import DEFAULT_REGISTRY, Registry, apply_patches, register_patch
from exporters.workarounds.models.moe_experts import (
    DBRX,
    DENSE_EXPERTS_PATHS,
    LONGCAT_FLASH,
    STEP3P7,
    SWITCH_TRANSFORMERS,
    _patch_dense_experts,
    _patch_dense_longcat_flash_experts,
    _patch_dense_step3p7_experts,
    _patch_dense_switch_transformers_experts,
)


@dataclasses.dataclass
class Case:
    experts: nn.Module
    args: tuple
    path: str
    factory: object


def _init(module: nn.Module) -> nn.Module:
    for p in module.parameters():
        nn.init.normal_(p, std=0.5)
    return module.eval()


def _dbrx() -> Case:
    from transformers.models.dbrx.configuration_dbrx import DbrxConfig
    from transformers.models.dbrx.modeling_dbrx import DbrxFFN

    config = DbrxConfig(d_model=16, ffn_config={"ffn_hidden_size": 24, "moe_num_experts": 4, "moe_top_k": 2})
    ffn = _init(DbrxFFN(config))
    hidden = torch.randn(2, 7, 16)  # DbrxExperts takes and returns (batch, seq, hidden)
    top_k_weights, top_k_index = ffn.route_tokens_to_experts(ffn.router(hidden))
    return Case(ffn.experts, (hidden, top_k_index, top_k_weights), DBRX, _patch_dense_experts)


def _longcat_flash(n_routed_experts: int = 4, zero_expert_num: int = 2, check_zero_experts: bool = True) -> Case:
    from transformers.models.longcat_flash.configuration_longcat_flash import LongcatFlashConfig
    from transformers.models.longcat_flash.modeling_longcat_flash import LongcatFlashMoE

    config = LongcatFlashConfig(hidden_size=16, expert_ffn_hidden_size=24, n_routed_experts=n_routed_experts,
                                zero_expert_num=zero_expert_num, moe_topk=3, routed_scaling_factor=2.0)
    moe = _init(LongcatFlashMoE(config))
    hidden = torch.randn(14, 16)
    _, top_k_weights, top_k_index = moe.router(hidden)
    # the zero-compute (identity) experts must be in play, some token on two of them (their order of addition
    # is the one thing the dense form may change), for the test to mean something
    assert not check_zero_experts or ((top_k_index >= n_routed_experts).sum(dim=-1) >= 2).any()
    return Case(moe.experts, (hidden, top_k_index, top_k_weights), LONGCAT_FLASH, _patch_dense_longcat_flash_experts)


def _longcat_flash_identity_only() -> Case:
    case = _longcat_flash(n_routed_experts=0, zero_expert_num=3)  # no gate_up_proj: every expert is the identity
    assert case.experts.gate_up_proj is None
    return case


def _step3p7(n_routed_experts: int = 4) -> Case:
    from transformers.models.step3p7.configuration_step3p7 import Step3p7TextConfig
    from transformers.models.step3p7.modeling_step3p7 import Step3p7Experts, Step3p7TopKRouter

    # n_routed_experts, not num_local_experts: the latter is an attribute_map alias of the former
    config = Step3p7TextConfig(hidden_size=16, moe_intermediate_size=24, n_routed_experts=n_routed_experts,
                               num_experts_per_tok=2)
    assert config.num_local_experts == n_routed_experts
    router = _init(Step3p7TopKRouter(config))
    experts = _init(Step3p7Experts(config, swiglu_limit=1.0))  # the clamp is active at this scale
    hidden = torch.randn(14, 16)
    _, top_k_weights, top_k_index = router(hidden)
    top_k_index = top_k_index.clone()
    top_k_index[3, 1] = config.num_local_experts  # the "no expert" sentinel eager skips
    return Case(experts, (hidden, top_k_index, top_k_weights), STEP3P7, _patch_dense_step3p7_experts)


def _switch_transformers() -> Case:
    from transformers.models.switch_transformers.configuration_switch_transformers import SwitchTransformersConfig
    from transformers.models.switch_transformers.modeling_switch_transformers import SwitchTransformersSparseMLP

    config = SwitchTransformersConfig(d_model=16, d_ff=24, num_experts=4, expert_capacity=3)
    mlp = _init(SwitchTransformersSparseMLP(config))
    hidden = torch.randn(2, 9, 16)
    # what SwitchTransformersSparseMLP.forward hands its experts
    selected_experts, routing_weights, _ = mlp.router(hidden)
    selected_experts = selected_experts.view(-1, 1, config.num_experts)
    # 18 tokens, 4 experts of capacity 3 per sequence: some tokens must be dropped (no expert at all)
    assert (selected_experts.sum(dim=(1, 2)) == 0).any()
    return Case(mlp.experts, (hidden.view(-1, 16), selected_experts, routing_weights.view(-1, 1)),
                SWITCH_TRANSFORMERS, _patch_dense_switch_transformers_experts)


BUILDERS = [_dbrx, _longcat_flash, _longcat_flash_identity_only, _step3p7, _switch_transformers]
IDS = ["dbrx", "longcat_flash-zero-experts", "longcat_flash-identity-only", "step3p7-sentinel-clamp",
       "switch_transformers-capacity"]


def _patched(case: Case):
    registry = Registry()
    register_patch("dynamo", case.path, registry=registry)(case.factory)
    return apply_patches(registry.patches("dynamo"))


def test_registered_for_every_family():
    names = {e.name for e in DEFAULT_REGISTRY.patches("dynamo")}
    assert {f"patch:dynamo:{p}" for p in DENSE_EXPERTS_PATHS} <= names


@pytest.mark.parametrize("build", BUILDERS, ids=IDS)
def test_dense_forward_equals_sparse_loop(build):
    torch.manual_seed(0)
    case = build()
    with torch.no_grad():
        expected = case.experts(*case.args)
        with _patched(case) as fired:
            got = case.experts(*case.args)
    assert fired.names() == [f"patch:dynamo:{case.path}"]
    torch.testing.assert_close(got, expected)
    assert expected.abs().max() > 0.1  # not trivially zero


def test_switch_transformers_dropped_tokens_get_zero():
    torch.manual_seed(0)
    case = _switch_transformers()
    dropped = case.args[1].sum(dim=(1, 2)) == 0
    with torch.no_grad(), _patched(case):
        got = case.experts(*case.args)
    assert (got[dropped] == 0).all() and (got[~dropped] != 0).any(dim=-1).all()


@pytest.mark.parametrize("build", BUILDERS, ids=IDS)
def test_patched_experts_export(build):
    torch.manual_seed(0)
    case = build()
    with pytest.raises(Exception, match="data-dependent|Could not guard|GuardOnDataDependent"):
        torch.export.export(case.experts, case.args, strict=False)
    with _patched(case):
        program = torch.export.export(case.experts, case.args, strict=False)
    assert not any(n.target == torch.ops.aten.nonzero.default for n in program.graph.nodes)
    with torch.no_grad():
        expected = case.experts(*case.args)
    torch.testing.assert_close(program.module()(*case.args), expected)


@pytest.mark.parametrize("build", [lambda n: _longcat_flash(n, check_zero_experts=False), _step3p7],
                         ids=["longcat_flash", "step3p7"])
def test_gathered_experts_graph_does_not_grow_with_the_expert_count(build):
    """LongcatFlash (512 experts released) and Step3p7 (288) gather each token's experts: the exported
    graph has as many nodes at 64 experts as at 4 (the dense loop added ~20 per expert), and still
    computes eager's loop."""
    sizes = []
    for experts in (4, 64):
        torch.manual_seed(0)
        case = build(experts)
        with _patched(case):
            program = torch.export.export(case.experts, case.args, strict=False)
        sizes.append(sum(1 for n in program.graph.nodes if n.op == "call_function"))
        with torch.no_grad():
            torch.testing.assert_close(program.module()(*case.args), case.experts(*case.args))
    assert sizes[0] == sizes[1], sizes
