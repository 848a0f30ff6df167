"""exporters/workarounds/torch_internals/replacement_bounds.py: an unbacked count set equal to a symbolic size (Voxtral's
placeholder check) no longer trips torch's bounds assertion; the equality is still known after."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.source import ConstantSource
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, statically_known_true

from exporters.utils import DEFAULT_REGISTRY, FiredLog, Registry, apply_patches, register_patch
from exporters.workarounds.torch_internals.replacement_bounds import _patch_replacement_bounds_overflow_skipped

PATH = "torch.fx.experimental.symbolic_shapes.ShapeEnv._set_replacement"


def _patched():
    registry = Registry()
    register_patch("dynamo", PATH, registry=registry)(_patch_replacement_bounds_overflow_skipped)
    return registry.patches("dynamo")


def _placeholder_check():
    """torch_compilable_check(x[mask].numel() == x.numel()) with a dynamic row count, as Voxtral does."""
    env = ShapeEnv()
    rows = env.create_symintnode(env.create_symbol(4, ConstantSource("n"), dynamic_dim=DimDynamic.DYNAMIC), hint=4)
    with FakeTensorMode(shape_env=env):
        x = torch.empty(rows, 2048)
        count = x[torch.ones(rows, 2048, dtype=torch.bool)].numel()
        torch._check(count == x.numel())
        return statically_known_true(count == x.numel()), statically_known_true(count >= 2048)


def test_registered_for_dynamo():
    assert f"patch:dynamo:{PATH}" in {e.name for e in DEFAULT_REGISTRY.patches("dynamo")}


def test_count_equal_to_a_symbolic_size_is_checked_not_fatal():
    with pytest.raises(AssertionError, match="not a subset of src_bound"):
        _placeholder_check()
    fired = FiredLog()
    with apply_patches(_patched(), fired):
        assert _placeholder_check() == (True, True)  # the equality and the refined range are kept
    assert f"patch:dynamo:{PATH}" in fired.names()


def test_other_assertions_still_raise():
    def original(self, a, tgt, msg):
        raise AssertionError("Expected sympy.Symbol, got <class 'int'>")

    with pytest.raises(AssertionError, match="Expected sympy.Symbol"):
        _patch_replacement_bounds_overflow_skipped(original)(None, 1, 2, "")
