"""exporters/workarounds/torch_internals/_finite_range_guards.py: a size condition with one value over its symbols'
whole bounded ranges is decided without a guard; one that changes inside the range, or a range too large or
unbounded, stays undecided. An export whose chunk count is one for every allowed sequence length passes."""

from __future__ import annotations

import pytest
import sympy
import torch
from torch._dynamo.source import ConstantSource
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
from torch.utils._sympy.functions import FloorDiv, Mod
from torch.utils._sympy.value_ranges import ValueRanges

from exporters.workarounds.torch_internals._finite_range_guards import MAX_POINTS, decide_over_range


def _symbol(env: ShapeEnv, name: str, hint: int, lower: int, upper):
    symbol = env.create_symbol(hint, ConstantSource(name), dynamic_dim=DimDynamic.DYNAMIC)
    env.var_to_range[symbol] = ValueRanges(lower, upper)
    return symbol


def test_a_chunk_count_of_one_over_the_whole_range_is_decided():
    env = ShapeEnv()
    s = _symbol(env, "seq", 5, 1, 64)
    chunks = FloorDiv(s + Mod(64 - Mod(s, 64), 64), 64)
    assert decide_over_range(env, sympy.Eq(chunks, 1)) is sympy.true
    assert decide_over_range(env, sympy.Ne(sympy.Min(s, 64 * chunks), 0)) is sympy.true
    assert decide_over_range(env, chunks) == 1


def test_a_condition_that_changes_inside_the_range_stays_undecided():
    env = ShapeEnv()
    s = _symbol(env, "seq", 5, 1, 65)
    assert decide_over_range(env, sympy.Eq(s, 1)) is None
    assert decide_over_range(env, sympy.Eq(FloorDiv(s + Mod(64 - Mod(s, 64), 64), 64), 1)) is None  # 65: 2 chunks


@pytest.mark.parametrize("upper", [sympy.oo, MAX_POINTS + 1])
def test_unbounded_or_large_ranges_stay_undecided(upper):
    env = ShapeEnv()
    s = _symbol(env, "seq", 5, 1, upper)
    assert decide_over_range(env, sympy.Ge(s, 1) & sympy.Eq(Mod(s, 1), 0) & sympy.Lt(s, 10**9)) is None


class _Chunked(torch.nn.Module):
    """Pads the sequence to a multiple of 8 and loops over the chunks, as a chunked recurrence does."""

    def forward(self, x):
        size = x.shape[1]
        pad = (8 - size % 8) % 8
        x = torch.nn.functional.pad(x, (0, 0, 0, pad))
        out = [x[:, i * 8:(i + 1) * 8].cumsum(1) for i in range(x.shape[1] // 8)]
        return torch.cat(out, 1)[:, :size]


def test_an_export_with_a_chunk_loop_bounded_to_one_chunk_passes():
    from torch.export import Dim

    from exporters import get_exporter

    exporter = get_exporter("dynamo")
    x = torch.randn(1, 5, 4)
    config = exporter.config_class(dynamic_shapes={"x": {1: Dim("seq", min=1, max=8)}})
    artifact = exporter.export(_Chunked(), {"x": x}, config)
    for n in (1, 3, 8):
        y = torch.randn(1, n, 4)
        (got,) = artifact(x=y).values()
        torch.testing.assert_close(got, _Chunked()(y))


def test_a_point_where_torch_refuses_the_arguments_leaves_the_condition_undecided():
    """torch's Mod raises AssertionError for a negative dividend (SeamlessM4T's speech encoder lengths, where a
    size minus a kernel goes below zero at the low end of the range): undecided, torch guards as before, instead
    of the export failing with 'AssertionError: -32'."""
    env = ShapeEnv()
    s = _symbol(env, "frames", 40, 1, 64)
    assert decide_over_range(env, sympy.Eq(Mod(s - 33, 8), 0)) is None
