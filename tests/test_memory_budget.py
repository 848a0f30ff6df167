"""exporters/exporter_executorch.py: a dynamic program planning more memory than
``ExecutorchConfig.memory_budget_mb`` is exported again with halved bounds, and says so.

The plan size must be what ExecuTorch's program records, the bounds must halve only down to the
largest traced size (every traced shape stays valid), static and explicit ``dynamic_shapes``
exports must keep their bounds, and a program that cannot load for memory must name its plan size
and the bound to lower, not only ``std::bad_alloc``.
"""

from __future__ import annotations

import pytest
import torch

import exporters.exporter_executorch as et
from exporters import ExportStageError

HALVED = "fix:executorch:bounds_halved_to_fit_memory"


class Square(torch.nn.Module):
    def forward(self, x):
        return (x @ x.transpose(0, 1)).relu()  # an n x n output: the plan grows with the square of the bound


def _export(**config):
    return et.ExecutorchExporter().export(Square(), {"x": torch.randn(6, 5)}, et.ExecutorchConfig(dynamic=True, **config))


def test_the_plan_is_reported_and_sized_for_the_bounds():
    art = _export()
    assert art.metadata["max_dim"] == 64
    planned = art.metadata["planned_bytes"]
    assert 64 * 64 * 4 <= planned < 2**20  # the 64 x 64 float output at least
    assert HALVED not in art.workarounds_fired


def test_a_plan_past_the_budget_halves_the_bounds_down_to_the_traced_sizes():
    art = _export(memory_budget_mb=0)  # nothing fits: 64 -> 32 -> 16 -> 8 -> 6, the largest traced size
    assert HALVED in art.workarounds_fired
    assert art.metadata["max_dim"] == 6
    assert {d["max"] for d in art.dynamic_dims["x"].values()} == {6}
    x = torch.randn(6, 5)
    torch.testing.assert_close(art(x=x)["output"], Square()(x))
    small = torch.randn(3, 4)
    torch.testing.assert_close(art(x=small)["output"], Square()(small))
    with pytest.raises(ValueError, match=r"x.*dim 0.*7.*6"):  # past the new bound: named, not a runtime code
        art(x=torch.randn(7, 5))


def test_what_halving_leaves_alone():
    config = et.ExecutorchConfig(dynamic=True)
    assert et.halved_max_dim(config, {"x": torch.randn(6, 5)}) == 32
    assert et.halved_max_dim(config, {"x": torch.randn(6, 40)}) == 40  # never below a traced size it bounds
    assert et.halved_max_dim(config, {"x": torch.randn(6, 100)}) == 32  # a dim past max_dim keeps its own bound
    assert et.halved_max_dim(et.ExecutorchConfig(dynamic=True, max_dim=6), {"x": torch.randn(6, 5)}) is None
    assert et.halved_max_dim(et.ExecutorchConfig(), {"x": torch.randn(6, 5)}) is None  # static: planned exactly
    explicit = et.ExecutorchConfig(dynamic_shapes={"x": {0: torch.export.Dim("n", max=64)}})
    assert et.halved_max_dim(explicit, {"x": torch.randn(6, 5)}) is None  # the caller's bounds stand


class Outer(torch.nn.Module):
    def forward(self, x):
        return x.unsqueeze(-1) * x.unsqueeze(-2)  # b x n x n: the plan grows with the square of n


def test_where_halving_stops_at_a_traced_size_the_dims_above_the_bound_are_fixed():
    """Halving stops at 32, x's traced width (every traced shape stays valid); the plan is still over the budget,
    so the width is fixed at 32 and the bound halves on while the batch, traced at 2, stays below it: 16, 8, 4
    (Mllama's generate prefill: 1152 GiB where halving stopped). Not to 2: the loop ends there, not in a static
    export."""
    art = et.ExecutorchExporter().export(Outer(), {"x": torch.randn(2, 32)},
                                         et.ExecutorchConfig(dynamic=True, memory_budget_mb=0))
    assert {HALVED, "fix:executorch:large_dims_fixed_to_fit_memory"} <= set(art.workarounds_fired)
    assert art.metadata["max_dim"] == 4
    assert list(art.dynamic_dims["x"]) == [0] and art.dynamic_dims["x"][0]["max"] == 4
    x = torch.randn(3, 32)
    torch.testing.assert_close(art(x=x)["output"], Outer()(x))
    with pytest.raises(ValueError, match=r"x.*dim 1"):  # the fixed width: named, not a runtime code
        art(x=torch.randn(3, 31))
    config = et.ExecutorchConfig(dynamic=True, max_dim=32)
    halved = et.large_dims_fixed(config, {"x": torch.randn(2, 5)})  # (from its own explicit shapes) halves on
    assert halved.max_dim == 16 and all(d is not None for d in halved.dynamic_shapes["x"].values())
    assert et.large_dims_fixed(config, {"x": torch.randn(20, 32)}) is None  # nothing would stay dynamic


def test_a_program_too_large_to_load_names_its_plan_and_the_bound(monkeypatch):
    def no_memory(buffer):
        raise MemoryError("std::bad_alloc")

    import exporters.executorch.artifact as artifact

    monkeypatch.setattr(artifact, "load_forward", no_memory)  # where ExecutorchArtifact looks it up
    with pytest.raises(ExportStageError, match=r"memory plan, 0\.0 GiB .*max_dim 64.*ExecutorchConfig.max_dim") as info:
        _export()
    assert info.value.stage == "run"


class LooseWindows(torch.nn.Module):
    """Swin2SR's padded windows in small: h // (h // 2) is 2 or 3, and interval arithmetic bounds it at
    64 (h up to 64 over h // 2 down to 1)."""

    def forward(self, x):
        h = x.shape[0]
        return x.new_ones(h // (h // 2), h, 8).sum(0) * x  # a (windows, h, 8) tensor, 2 or 3 windows


def test_loose_interval_bounds_are_planned_exactly_when_the_plan_is_too_large():
    from exporters.workarounds.executorch.memory_planning import exact_share

    inputs = {"x": torch.randn(6, 8)}
    config = et.ExecutorchConfig(dynamic_shapes={"x": {0: torch.export.Dim.AUTO(min=2, max=64)}})
    exporter = et.ExecutorchExporter()
    loose = exporter.export(LooseWindows(), inputs, config)
    assert "fix:executorch:exact_bounds_to_fit_memory" not in loose.workarounds_fired  # within the budget
    config.memory_budget_mb = 0
    tight = exporter.export(LooseWindows(), inputs, config)
    assert "fix:executorch:exact_bounds_to_fit_memory" in tight.workarounds_fired
    assert HALVED not in tight.workarounds_fired  # explicit dynamic_shapes keep their bounds
    assert tight.metadata["planned_bytes"] < loose.metadata["planned_bytes"] / 4  # windows planned at 3, not 64
    for h in (2, 3, 6, 64):
        x = torch.randn(h, 8)
        torch.testing.assert_close(tight(x=x)["output"], LooseWindows()(x))
    assert exact_share(torch.fx.symbolic_trace(torch.nn.Identity())) == 1.0  # nothing planned: nothing to shrink
