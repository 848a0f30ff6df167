"""Torch patch: torch.export's dim-constraint summary skips an equality it cannot solve for its symbol.

Cause. After tracing, non-strict torch.export summarizes the guards on input sizes
(``DimConstraints.solve``, called from torch/_export/non_strict_utils.py only to word suggested
fixes and forced specializations). It treats every equality on one symbol as a specialization
``x == value`` and solves it with sympy's ``reduce_inequalities``. A model that pads or pools by a
fixed stride leaves a congruence written as an equality with floor divisions instead: the Hiera
backbone's window unrolling ``Eq(96 - 48*((x/4)//4), 0)``, Xcodec's hop length
``Eq(-x + 320*((x/40)//8), 0)``, EfficientLoFTR's ``Eq(-x/8 + 4*((x/8)//4), 0)``. sympy raises
``NotImplementedError: The inequality ... cannot be solved using solve_univariate_inequality`` and
the export fails, although no dimension was asked to be anything (``Dim.AUTO``).

What this changes (while tracing only). Each time the summary looks for a symbol with an equality
to solve, a symbol whose equalities sympy cannot solve loses its "has an equality" mark, so the
summary lists its constraints as they are among the dynamic results, as it does for inequalities
it cannot reduce. The guard
itself is untouched: torch keeps it in the program, and the artifact refuses a size that breaks it
(``Artifact.check_inputs``) as it does any other guard.

    before: solve(): reduce_inequalities([Eq(-x + 320*((x/40)//8), 0)], x) -> NotImplementedError
    after:  solve(): x has no equality to solve; "Eq(-x + 320*((x/40)//8), 0)" in the dynamic results

Remove when: ``DimConstraints.solve`` (torch/fx/experimental/symbolic_shapes.py) leaves an equality
that sympy's ``reduce_inequalities`` cannot solve among the dynamic results instead of letting its
``NotImplementedError`` fail the export.
"""

from __future__ import annotations

import functools

import sympy

from exporters.utils import ActedFlag, register_patch


def _solvable(exprs, symbol) -> bool:
    try:
        sympy.solvers.inequalities.reduce_inequalities(exprs, symbol)
    except NotImplementedError:
        return False
    return True


def unsolvable_equalities(constraints) -> list:
    """The symbols with an equality ``DimConstraints.solve`` would hand to sympy and sympy cannot solve."""
    return [symbol for symbol in list(constraints._symbols_with_equalities)
            if not _solvable(constraints._univariate_inequalities.get(symbol, set()), symbol)]


class _SolvableEqualities(set):
    """``DimConstraints._symbols_with_equalities`` that drops a symbol sympy cannot solve for each time
    ``solve`` asks whether any is left: solving one symbol substitutes it into the others'
    constraints, which can give another symbol such an equality midway (Sam2's Hiera backbone:
    ``Eq(96*((x/4)//8) - 96, 0)``)."""

    def __init__(self, symbols, constraints):
        super().__init__(symbols)
        self._constraints = constraints
        self.skipped: set = set()

    def __bool__(self) -> bool:
        constraints = self._constraints
        for symbol in unsolvable_equalities(constraints):
            self.discard(symbol)
            self.skipped.add(symbol)
            for expr in constraints._univariate_inequalities.pop(symbol, ()):
                constraints._dynamic_results.add(_printed(constraints, expr))
        return len(self) > 0


def _printed(constraints, expr) -> str:
    """``expr`` as the summary words constraints (sources for symbols); sympy's own form when torch's
    printer refuses it (it raises on a negative power: "exponent must be non-negative, got -1",
    Sam2's Hiera backbone)."""
    try:
        return constraints._dcp.doprint(expr)
    except AssertionError:
        return str(expr)


@register_patch("dynamo", "torch.fx.experimental.symbolic_shapes.DimConstraints.solve")
def _patch_dim_constraints_skip_unsolvable_equalities(original):
    acted = ActedFlag()  # set when a call skips an equality

    @functools.wraps(original)
    def solve(self):
        self._symbols_with_equalities = equalities = _SolvableEqualities(self._symbols_with_equalities, self)
        try:
            return original(self)
        finally:
            if equalities.skipped:
                acted.set()
            self._symbols_with_equalities = set(self._symbols_with_equalities)

    solve.acted = acted  # fired only when it skipped an equality
    return solve
