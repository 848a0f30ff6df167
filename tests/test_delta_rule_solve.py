"""exporters/workarounds/models/gated_delta_rule.py: the gated delta rule's unit lower triangular solve traced as
log2(n) matmul factors, and the modeling files' export branch pointed at it."""

from __future__ import annotations

import pytest
import torch

from exporters.workarounds.models.gated_delta_rule import (
    EXPORTING_FLAG_PATHS,
    _patch_delta_rule_takes_eager_solve,
    _patch_unit_lower_solve_as_products,
    unit_lower_solve,
)

SOLVE = "patch:dynamo:torch.linalg.solve_triangular"


@pytest.mark.parametrize("n", [1, 2, 5, 64])
def test_products_equal_the_triangular_solve(n):
    torch.manual_seed(n)
    a = torch.randn(2, 3, n, n, dtype=torch.float64) * 0.3
    b = torch.randn(2, 3, n, 4, dtype=torch.float64)
    expected = torch.linalg.solve_triangular(a, b, upper=False, unitriangular=True)
    torch.testing.assert_close(unit_lower_solve(a, b), expected, rtol=1e-9, atol=1e-9)


def test_other_solves_run_torchs():
    calls = []
    patched = _patch_unit_lower_solve_as_products(lambda *a, **k: calls.append(k) or "torch")
    a, b = torch.eye(3), torch.ones(3, 1)
    assert patched(a, b, upper=True, unitriangular=True) == "torch"
    assert patched(a, b, upper=False) == "torch"  # not unitriangular: the diagonal matters
    assert patched(a, b, upper=False, left=False, unitriangular=True) == "torch"
    assert len(calls) == 3 and not patched.acted()
    torch.testing.assert_close(patched(a, b, upper=False, unitriangular=True), b)
    assert patched.acted()


def test_exporting_flag_follows_the_solve_patch(monkeypatch):
    flag = _patch_delta_rule_takes_eager_solve(lambda: True)
    assert flag() is True and not flag.acted()  # torch's solver in place: the loop branch, as before
    monkeypatch.setattr(torch.linalg, "solve_triangular", _patch_unit_lower_solve_as_products(torch.linalg.solve_triangular))
    assert flag() is False and flag.acted()


def test_each_family_flag_path_resolves():
    from exporters.utils import resolve_path

    for path in EXPORTING_FLAG_PATHS:
        owner, name = resolve_path(path)
        assert callable(getattr(owner, name)), path


class _DeltaRule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        # imported before the export: patches reach only model modules already loaded
        from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

        self.delta_rule = torch_chunk_gated_delta_rule

    def forward(self, query, key, value, g, beta):
        out, state = self.delta_rule(query, key, value, g, beta, output_final_state=True,
                                                  use_qk_l2norm_in_kernel=True)
        return out, state


def _delta_inputs(t, b=2, h=2, d=8):
    return {"query": torch.randn(b, t, h, d), "key": torch.randn(b, t, h, d), "value": torch.randn(b, t, h, d),
            "g": -torch.rand(b, t, h), "beta": torch.rand(b, t, h)}


def test_delta_rule_exports_without_the_substitution_loop():
    import exporters.exporter_dynamo as dyn
    from exporters.utils import DEFAULT_REGISTRY

    torch.manual_seed(0)
    inputs = _delta_inputs(7)
    model = _DeltaRule()
    flags = [f"patch:dynamo:{p}" for p in EXPORTING_FLAG_PATHS]
    art = dyn.DynamoExporter().export(model, inputs)
    bare = dyn.DynamoExporter(registry=DEFAULT_REGISTRY.without(SOLVE, *flags)).export(model, inputs)
    assert SOLVE in art.workarounds_fired and SOLVE not in bare.workarounds_fired

    def clones(artifact):
        return sum(n.target == torch.ops.aten.clone.default for n in artifact.program.graph.nodes)

    assert clones(bare) >= 2 * 63 and clones(art) < 10  # the loop's two clones per step are gone
    assert len(art.program.graph.nodes) < len(bare.program.graph.nodes) / 4
    expected = model(**inputs)
    for actual, want in zip(art(**inputs).values(), expected):
        torch.testing.assert_close(actual, want, rtol=1e-4, atol=1e-5)


def test_delta_rule_keeps_a_dynamic_length():
    """A dynamic export carries the chunk size as a size expression; the solve specializes that
    expression (always 64), not the sequence length."""
    import exporters.exporter_dynamo as dyn

    torch.manual_seed(0)
    model = _DeltaRule()
    art = dyn.DynamoExporter().export(model, _delta_inputs(7), dyn.DynamoConfig(dynamic=True))
    assert SOLVE in art.workarounds_fired
    for t in (3, 20, 63):
        inputs = _delta_inputs(t)
        for actual, want in zip(art(**inputs).values(), model(**inputs)):
            torch.testing.assert_close(actual, want, rtol=1e-4, atol=1e-5)
