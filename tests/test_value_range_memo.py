"""exporters/workarounds/torch_internals/value_range_memo.py: value-range analysis visits each distinct subexpression once.

The bounds must be torch's own for every expression, the walk must dispatch each distinct composite
subexpression once (not once per occurrence in the tree), the patch must say it acted only when a
subexpression repeated, and an export with Swin-style nested window padding must still be dynamic
and match eager.
"""

from __future__ import annotations

import sympy
import torch
import torch.utils._sympy.interp as interp
from torch.utils._sympy.functions import FloorDiv, Mod
from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

from exporters.tracing import SHAPE_ARITHMETIC_PATHS
from exporters.utils import DEFAULT_REGISTRY, FiredLog, Registry, apply_patches, register_patch
from exporters.workarounds.torch_internals.value_range_memo import _patch_value_ranges_once_per_subexpression

PATH = "torch.utils._sympy.value_ranges.sympy_interp"
NAME = f"patch:dynamo:{PATH}"
h, w = sympy.symbols("h w", integer=True, positive=True)


def _patched():
    registry = Registry()
    register_patch("dynamo", PATH, registry=registry)(_patch_value_ranges_once_per_subexpression)
    return registry.patches("dynamo")


def _windowed(size, stages, window=7):
    """Swin's per-stage size: pad to a multiple of the window (naming the size twice), then halve."""
    for _ in range(stages):
        size = size + Mod(window - Mod(size, window), window)
        size = FloorDiv(size + 1, 2)
    return size


def _tree_and_distinct(expr):
    """(composite nodes counted per occurrence, distinct composite nodes)."""
    tree = sum(1 for node in sympy.preorder_traversal(expr) if node.args)
    return tree, len({node for node in sympy.preorder_traversal(expr) if node.args})


CASES = [
    _windowed(h, 3),
    _windowed(h, 2) * _windowed(w, 2) + _windowed(h, 2),
    sympy.Eq(_windowed(h, 2), 4),
    sympy.Ge(_windowed(h, 3) - _windowed(w, 1), 1),
    sympy.Max(1, _windowed(h, 1) - 9),
    FloorDiv(h * w + h, h),
    h + 3,
]
RANGES = [
    {h: ValueRanges(2, 64), w: ValueRanges(2, 64)},
    {h: ValueRanges(30, 30), w: ValueRanges(1, 5)},
    {h: ValueRanges(1, 10**9), w: ValueRanges(8, 9)},
]


def test_registered_for_dynamo_and_installed_for_every_lowering():
    assert NAME in {e.name for e in DEFAULT_REGISTRY.patches("dynamo")}
    assert PATH.startswith(SHAPE_ARITHMETIC_PATHS)  # onnx and executorch re-traces install it too


def test_bounds_are_torchs_own():
    expected = [[bound_sympy(e, r) for r in RANGES] for e in CASES]
    with apply_patches(_patched()):
        got = [[bound_sympy(e, r) for r in RANGES] for e in CASES]
    assert got == expected
    assert expected[0][1].is_singleton()  # a bound that decides a guard is among them


def test_each_distinct_subexpression_is_dispatched_once(monkeypatch):
    expr = _windowed(h, 6)
    tree, distinct = _tree_and_distinct(expr)
    assert tree > 8 * distinct  # the tree doubles per stage (378 nodes), the distinct ones grow by 6 (36)
    calls = []

    def counting(analysis, args, e, **kwargs):
        calls.append(e)
        return original(analysis, args, e, **kwargs)

    original = interp._run_sympy_handler
    monkeypatch.setattr(interp, "_run_sympy_handler", counting)  # read by the patch when installed
    unpatched = bound_sympy(expr, RANGES[0])
    assert len(calls) == tree
    calls.clear()
    with apply_patches(_patched()):
        patched = bound_sympy(expr, RANGES[0])
    assert patched == unpatched
    assert len(calls) == distinct and len(set(calls)) == distinct


def test_fires_only_when_a_subexpression_repeats():
    fired = FiredLog()
    with apply_patches(_patched(), fired):
        bound_sympy(h * w + 3, RANGES[0])  # every subexpression once: nothing to reuse
    assert NAME not in fired.names()
    with apply_patches(_patched(), fired):
        bound_sympy(_windowed(h, 2), RANGES[0])
    assert NAME in fired.names()


class _Windows(torch.nn.Module):
    """Two Swin stages on a sequence: pad to a multiple of the window, pool each window, halve."""

    def forward(self, x):
        window = 3
        for _ in range(2):
            b, n, c = x.shape
            x = torch.nn.functional.pad(x, (0, 0, 0, (window - n % window) % window))
            x = x.view(b, -1, window, c).mean(2).repeat_interleave(window, 1)
            x = torch.nn.functional.pad(x, (0, 0, 0, x.shape[1] % 2))
            x = x.view(b, -1, 2, c).sum(2)
        return x


def test_a_nested_window_export_admits_the_same_sizes_and_matches_eager():
    from test_shape_arithmetic import _export, _outcomes  # torch.export under given patches; per-size outcome

    model = _Windows()
    fired = FiredLog()
    sample = torch.randn(1, 29, 2)
    widths = [29, 7, 30, 41, 64]
    plain = _outcomes(_export(model, [], sample=sample), model, widths)
    patched = _outcomes(_export(model, _patched(), fired, sample=sample), model, widths)
    assert NAME in fired.names()
    assert patched == plain  # the same guards: where a size is refused (7 pools to 1), both refuse it
    assert patched.count("match") >= 4  # dynamic: the traced length and others run and match eager
