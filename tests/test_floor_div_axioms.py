"""exporters/workarounds/torch_internals/floor_div_axioms.py: after a new divisibility fact, only the axioms it reaches are
re-simplified, to the same axiom table torch's own re-simplification gives; an export with
Swin-style window padding admits the same sizes and matches eager with and without the patch."""

from __future__ import annotations

import sympy
import torch
from torch._dynamo.source import ConstantSource
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
from torch.utils._sympy.functions import CleanDiv

from exporters.utils import DEFAULT_REGISTRY, FiredLog, Registry, apply_patches, register_patch
from exporters.workarounds.torch_internals.floor_div_axioms import _patch_floor_div_axioms_resimplified_by_need, resimplify_touched_axioms

PATH = "torch.fx.experimental.symbolic_shapes.ShapeEnv._maybe_evaluate_static"
NAME = f"patch:dynamo:{PATH}"


def _patched():
    registry = Registry()
    register_patch("dynamo", PATH, registry=registry)(_patch_floor_div_axioms_resimplified_by_need)
    return registry.patches("dynamo")


def test_registered_for_dynamo_so_every_backend_traces_with_it():
    assert NAME in {e.name for e in DEFAULT_REGISTRY.patches("dynamo")}


def _env_with_floor_div_axioms() -> ShapeEnv:
    """Axioms on a // 7 and b // 5, then the fact that 7 divides a."""
    env = ShapeEnv()

    def size(name, hint):
        return env.create_symintnode(env.create_symbol(hint, ConstantSource(name), dynamic_dim=DimDynamic.DYNAMIC), hint=hint)

    a, b = size("a", 14), size("b", 10)
    torch._check(a // 7 >= 1)
    torch._check(b // 5 >= 1)
    torch._check(a % 7 == 0)
    return env


def test_only_the_axioms_a_new_fact_reaches_are_resimplified_to_torchs_table():
    patched, upstream = _env_with_floor_div_axioms(), _env_with_floor_div_axioms()
    assert patched._resimplify_floor_div_axioms and upstream._resimplify_floor_div_axioms
    assert resimplify_touched_axioms(patched) == 2  # 1 <= a // 7 and a // 7 < 1; not the two on b // 5
    assert not patched._resimplify_floor_div_axioms
    assert resimplify_touched_axioms(patched) == 0  # nothing new since
    upstream._maybe_evaluate_static(sympy.Integer(1))  # torch re-simplifies every axiom with a //
    assert set(patched.axioms) == set(upstream.axioms)
    assert sum(key.has(CleanDiv) for key in patched.axioms) == 2  # a // 7 is now an exact division


class _TwoStageWindows(torch.nn.Module):
    """Two Swin stages: pad the width to a multiple of the window, pool each window, merge pairs."""

    def forward(self, x):
        for window in (3, 2):
            b, w, c = x.shape
            x = torch.nn.functional.pad(x, (0, 0, 0, (window - w % window) % window))
            x = x.view(b, x.shape[1] // window, window, c).sum(dim=2)
            x = torch.nn.functional.pad(x, (0, 0, 0, x.shape[1] % 2))
            x = x.view(b, x.shape[1] // 2, 2, c).mean(dim=2)
        return x


def _export(patches, fired=None):
    sympy.core.cache.clear_cache()
    with apply_patches(patches, fired):
        return torch.export.export(_TwoStageWindows(), (torch.randn(1, 25, 2),),
                                   dynamic_shapes={"x": {1: torch.export.Dim.AUTO(min=2, max=256)}})


def _outcomes(program, widths):
    model, run, seen = _TwoStageWindows(), program.module(), []
    for w in widths:
        sample = torch.randn(1, w, 2)
        try:
            torch.testing.assert_close(run(sample), model(sample))
            seen.append("match")
        except Exception as exc:  # a guard refusing the width is an outcome to compare
            seen.append(type(exc).__name__)
    return seen


def test_window_padding_export_is_the_same_with_the_patch():
    widths = [25, 2, 11, 49, 97, 121, 256]
    fired = FiredLog()
    plain, patched = _export([]), _export(_patched(), fired)
    assert str(patched.range_constraints) == str(plain.range_constraints)
    assert _outcomes(patched, widths) == _outcomes(plain, widths)
    assert _outcomes(patched, widths).count("match") >= 4  # dynamic: widths other than the traced one run
    assert NAME in fired.names()  # this export re-simplified after a divisibility fact
