"""exporters/workarounds/executorch/memory_planning.py: a planned size with no finite interval bound is planned at its
true maximum over the input ranges.

The maximum must be exact for a factor evaluated point by point, a product must be bounded factor by
factor, a size interval arithmetic bounds must keep ExecuTorch's own bound, sizes that cannot be
bounded must still go to ExecuTorch, and the patch must say it acted only when it bounded a size.
"""

from __future__ import annotations

import itertools
import math
import types

import pytest
import sympy
from torch.utils._sympy.functions import FloorDiv, FloorToInt, IntTrueDiv
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

from exporters.utils import DEFAULT_REGISTRY, FiredLog, Registry, apply_patches, register_patch
from exporters.workarounds.executorch.memory_planning import (
    _patch_unbounded_sizes_planned_at_their_maximum,
    factor_range,
    own_terms,
    size_maximum,
)

PATH = "executorch.exir.sym_util.eval_upper_bound"
b, h, w = sympy.symbols("b h w", integer=True, positive=True)
RANGES = {b: ValueRanges(1, 15), h: ValueRanges(2, 64), w: ValueRanges(2, 64)}
PER_BAND = FloorToInt(IntTrueDiv(w, FloorDiv(h, 32)))  # a size through float math: floor(w / (h // 32))
WINDOWS = b * FloorDiv(FloorDiv(w, 8), FloorDiv(h, 32))  # a divisor whose interval reaches 0


def _brute(fn, *axes):
    values = []
    for point in itertools.product(*axes):
        try:
            values.append(fn(*point))
        except ZeroDivisionError:
            continue
    return max(values)


def _symint(expr, ranges=RANGES):
    """What eval_upper_bound reads of a SymInt: node.expr and node.shape_env.var_to_range."""
    return types.SimpleNamespace(node=types.SimpleNamespace(expr=expr, shape_env=types.SimpleNamespace(var_to_range=ranges)))


def _patched(original=None):
    registry = Registry()
    register_patch("executorch", PATH, registry=registry)(_patch_unbounded_sizes_planned_at_their_maximum)
    return registry.patches("executorch")


def test_registered_on_both_names_executorch_plans_with():
    import exporters.exporter_executorch  # noqa: F401  (registers the ExecuTorch patches)

    names = {e.name for e in DEFAULT_REGISTRY.patches("executorch")}
    assert f"patch:executorch:{PATH}" in names
    assert "patch:executorch:executorch.exir.passes.sym_shape_eval_pass.eval_upper_bound" in names


def test_interval_arithmetic_loses_these_bounds():
    assert bound_sympy(PER_BAND, RANGES).upper == sympy.oo  # ExecuTorch raises on oo
    assert bound_sympy(WINDOWS, RANGES).upper is int_oo  # ExecuTorch plans at the traced value


def test_factor_range_is_exact():
    axes = (range(2, 65), range(2, 65))  # h < 32 divides by 0: no input makes that size, skipped
    assert factor_range(PER_BAND, RANGES) == (1, 64)
    assert _brute(lambda y, x: math.floor(x / (y // 32)), *axes) == 64
    assert factor_range(FloorDiv(FloorDiv(w, 8), FloorDiv(h, 32)), RANGES) == (0, 8)
    assert _brute(lambda y, x: (x // 8) // (y // 32), *axes) == 8


def test_factor_range_refuses_what_it_cannot_enumerate():
    assert factor_range(h * w, RANGES, points=100) is None  # 63 * 63 points
    assert factor_range(h + 1, {h: ValueRanges(0, int_oo)}) is None  # unbounded range
    assert factor_range(FloorDiv(w, FloorDiv(h, 65)), RANGES) is None  # no point has a value


def test_a_product_is_bounded_factor_by_factor():
    assert size_maximum(WINDOWS, RANGES) == 15 * 8
    assert size_maximum(2 * b * PER_BAND, RANGES) == 2 * 15 * 64
    assert size_maximum((h - 40) * PER_BAND, RANGES) is None  # a factor that may be negative


def test_eval_upper_bound_plans_unbounded_sizes_at_their_maximum_and_fires():
    import executorch.exir.sym_util as sym_util

    fired = FiredLog()
    with apply_patches(_patched(), fired):
        assert sym_util.eval_upper_bound(_symint(PER_BAND)) == 64
        assert sym_util.eval_upper_bound(_symint(WINDOWS)) == 120
    assert f"patch:executorch:{PATH}" in fired.names()
    with pytest.raises(RuntimeError, match="got oo"):  # restored: ExecuTorch's own refusal
        sym_util.eval_upper_bound(_symint(PER_BAND))


def test_bounded_and_unboundable_sizes_keep_executorchs_answer():
    import executorch.exir.sym_util as sym_util

    fired = FiredLog()
    with apply_patches(_patched(), fired):
        assert sym_util.eval_upper_bound(_symint(FloorDiv(h + 1, 2) * w)) == 32 * 64  # interval bound stands
        assert sym_util.eval_upper_bound(7) == 7
        unbounded = {h: ValueRanges(2, int_oo), w: ValueRanges(2, 64)}
        with pytest.raises(RuntimeError, match="got oo"):  # an unbounded range: nothing to enumerate
            sym_util.eval_upper_bound(_symint(PER_BAND, unbounded))
    assert f"patch:executorch:{PATH}" not in fired.names()


def test_compiled_and_sympy_evaluation_agree(monkeypatch):
    import exporters.workarounds.executorch.memory_planning as pb

    small = {h: ValueRanges(20, 64), w: ValueRanges(28, 64)}
    cases = [PER_BAND, FloorDiv(FloorDiv(w, 8), FloorDiv(h, 32)), FloorToInt(sympy.sqrt(h * w)), sympy.Max(1, h - w)]
    compiled = [factor_range(e, small) for e in cases]
    monkeypatch.setattr(pb, "_compiled", lambda expr, symbols: None)  # as if torch's printer could not write them
    assert [factor_range(e, small) for e in cases] == compiled
    assert factor_range(b * h * w, RANGES) is None  # 59,535 points: within the compiled limit, past sympy's


def test_a_three_symbol_factor_like_swins_is_bounded_exactly():
    padded = FloorDiv(FloorDiv(w, 4) + 1, 2)  # SwinForMaskedImageModeling's shape: b in both terms
    expr = FloorDiv(b * padded, sympy.Max(1, b * FloorDiv(FloorDiv(h, 4) + 1, 2)))
    assert factor_range(expr, RANGES) == (0, 120)  # 59,535 points; the greatest where h // 4 == 0
    assert _brute(lambda bb, y, x: (bb * ((x // 4 + 1) // 2)) // max(1, bb * ((y // 4 + 1) // 2)),
                  range(1, 16), range(2, 65), range(2, 65)) == 120


L = FloorDiv(FloorDiv(h, 4) - 1, 2) + 1  # a length through floor divisions: few distinct values
SEWD_HEADS = FloorDiv(4 * b, FloorDiv(4 * b * L**2, L * (4 * L)))  # SEW-D's view(-1, L, L) batch: 4 for any b, h
LONG = {b: ValueRanges(1, 15), h: ValueRanges(8, 640)}  # 9,495 points


def test_own_terms_are_the_largest_one_symbol_subexpressions():
    terms = own_terms(b * SEWD_HEADS)
    assert set(terms) == {b, h}
    assert set(terms[b]) == {b, 4 * b}
    assert set(terms[h]) == {L**2, L * (4 * L)}
    assert all(t.free_symbols == {s} for s, ts in terms.items() for t in ts)


def test_too_many_points_are_enumerated_by_their_terms_distinct_values():
    assert bound_sympy(SEWD_HEADS, LONG).upper is int_oo
    brute = _brute(lambda bb, y: (4 * bb) // ((4 * bb * ((y // 4 - 1) // 2 + 1) ** 2) // (4 * ((y // 4 - 1) // 2 + 1) ** 2)),
                   range(1, 16), range(8, 641))
    assert brute == 4
    # 9,495 points; b's terms take 15 distinct values, h's 80: 1,200 combinations
    assert factor_range(SEWD_HEADS, LONG, points=2000) == (4, 4)
    assert size_maximum(b * SEWD_HEADS, LONG, points=2000) == 15 * 4
    assert factor_range(SEWD_HEADS, LONG, points=1000) is None  # 1,200 combinations: still too many
    assert factor_range(SEWD_HEADS, LONG, points=500) is None  # h's own range (633) past the limit


def test_terms_keep_the_exact_range_where_values_differ():
    expr = FloorDiv(b * L + w, FloorDiv(h, 32) + 1)
    ranges = {b: ValueRanges(1, 15), h: ValueRanges(8, 640), w: ValueRanges(2, 64)}
    brute = [(bb * ((y // 4 - 1) // 2 + 1) + x) // (y // 32 + 1)
             for bb in range(1, 16) for y in range(8, 641) for x in range(2, 65)]
    assert factor_range(expr, ranges, points=100_000) == (min(brute), max(brute))  # 598,185 points
