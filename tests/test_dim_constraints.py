"""exporters/workarounds/torch_internals/dim_constraints.py: torch.export's dim-constraint summary no longer stops on an
equality sympy cannot solve (XcodecModel's hop-length guard, reproduced from its dynamic export)."""

from __future__ import annotations

import pytest
import sympy
from torch._dynamo.source import ConstantSource
from torch.fx.experimental.symbolic_shapes import DimConstraints
from torch.utils._sympy.functions import FloorDiv

from exporters.utils import DEFAULT_REGISTRY
from exporters.workarounds.torch_internals.dim_constraints import _patch_dim_constraints_skip_unsolvable_equalities, unsolvable_equalities

NAME = "patch:dynamo:torch.fx.experimental.symbolic_shapes.DimConstraints.solve"
x = sympy.Symbol("s2", integer=True, positive=True)
HOP = 320 * FloorDiv(x / 40, 8)


def _xcodec_constraints(extra=()) -> DimConstraints:
    """The state DimConstraints.solve met on XcodecModel's audio length (traced at 15360)."""
    constraints = DimConstraints({x: [ConstantSource("L")]}, {x: sympy.Integer(15360)}, {x}, {})
    constraints._univariate_inequalities[x] = {x > 632, sympy.Eq(x / 320, 48), x <= HOP, sympy.Eq(HOP, x), *extra}
    constraints._symbols_with_equalities.add(x)
    return constraints


def test_registered_for_dynamo():
    assert NAME in {e.name for e in DEFAULT_REGISTRY.patches("dynamo")}


def test_unsolvable_equality_is_summarized_instead_of_raising():
    with pytest.raises(NotImplementedError, match="solve_univariate_inequality"):
        DimConstraints.solve(_xcodec_constraints())
    constraints = _xcodec_constraints()
    assert unsolvable_equalities(constraints) == [x]
    _patch_dim_constraints_skip_unsolvable_equalities(DimConstraints.solve)(constraints)
    assert not constraints._static_results  # nothing was specialized
    assert "L > 632" in constraints._dynamic_results


def test_solvable_equality_still_specializes():
    y = sympy.Symbol("s3", integer=True, positive=True)
    constraints = DimConstraints({y: [ConstantSource("W")]}, {y: sympy.Integer(32)}, {y}, {})
    constraints.add(sympy.Eq(96 - 48 * FloorDiv(FloorDiv(y, 4), 4), 0))  # rewritten to 96 - 3*W == 0
    assert unsolvable_equalities(constraints) == []
    _patch_dim_constraints_skip_unsolvable_equalities(DimConstraints.solve)(constraints)
    assert constraints._static_results == {"W == 32"}
