"""Torch patch: the ``sympy.simplify`` calls of torch's shape arithmetic, as ``sympy.expand``.

Cause. When torch's symbolic ``FloorDiv(base, divisor)`` (and ``ModularIndexing``) finds a common
factor ``g`` of ``base`` and ``divisor``, it rebuilds itself as
``FloorDiv(sympy.simplify(base / g), sympy.simplify(divisor / g))``
(torch/utils/_sympy/functions.py, ``FloorDiv.eval``). ``sympy.simplify`` is sympy's general
heuristic simplifier: it tries ``together``, ``factor_terms``, ``gcd_terms``, trigonometric and
power rewrites over the whole expression tree, recursing into every nested ``FloorDiv``. Shifted
window attention pads each stage to a multiple of the window (``(w - W % w) % w``) and halves the
padded size per stage, so with a dynamic image size these expressions nest one level per stage and
``simplify`` is called on ever larger ones. SwinModel's dynamic export sat in it for minutes
(py-spy: ``FloorDiv.eval -> simplify -> together -> gcd_terms``), past the sweep's item timeout;
every Swin-backbone family (Swin, DonutSwin, MaskFormer(Swin), Mask2Former, OneFormer, Grounding
DINO) timed out the same way.

What this changes (while tracing only). When ``g`` is a monomial (an integer, a symbol, a product of
them) it divides every term of ``base`` by construction, so distributing the division
(``sympy.expand``) gives an equal polynomial with integer coefficients, which is all the rebuilt
``FloorDiv`` needs. When the expansion is not such a polynomial (a non-integer coefficient or a
negative power: ``g`` was a sum such as ``s + 5``, whose quotient only sympy can cancel), the call
goes to sympy's simplify as before; plain expansion there never reaches a fixed point
(``FloorDiv.eval`` rebuilt itself until RecursionError on a two-stage window toy). A call with
options also goes to sympy.

    before: FloorDiv(simplify((4*s*x + 4*s) / (2*s)), simplify(2*s*y / (2*s)))  # heuristics, slow
    after:  FloorDiv(expand((4*s*x + 4*s) / (2*s)), expand(2*s*y / (2*s)))      # = (2*x + 2) // y

The value of every expression is unchanged (an equal expression, not an approximation); only its
written form can differ, which decides how torch words a guard, never whether it holds. The
other caller during an export, fake tensors' unbacked ``view`` check
(torch/_subclasses/fake_impls.py, ``diff = sympy.simplify(numel_a - numel_b); if diff != 0``),
compares a polynomial difference with zero, which expansion decides as well.

Measured (``python -m sweeps.repro dynamo-dynamic-SwinModel``, OMP_NUM_THREADS=1, two sweep workers
sharing the 2 cores): with the patch PASS in 161.5 s, every simplify call took the expansion path;
without it the same command was killed by ``timeout 900`` before it finished, the stack in
``FloorDiv.eval -> simplify -> together -> gcd_terms`` (py-spy). The remaining time is torch's
ShapeEnv evaluating guards on the nested expressions, which this does not change.

Remove when: ``FloorDiv.eval`` and ``ModularIndexing.eval`` (torch/utils/_sympy/functions.py) divide
out a common monomial factor without calling ``sympy.simplify`` on the quotients.
"""

from __future__ import annotations

import sympy

from exporters.utils import register_patch


@register_patch("dynamo", "sympy.simplify")
def _patch_shape_simplify_by_expansion(original):
    def simplify(expr, *args, **kwargs):
        if args or kwargs or not isinstance(expr, sympy.Expr):
            return original(expr, *args, **kwargs)
        expanded = sympy.expand(expr)
        if any(not r.is_integer for r in expanded.atoms(sympy.Rational)) or any(
            p.exp.is_negative is not False for p in expanded.atoms(sympy.Pow)
        ):
            return original(expr)  # not an exact polynomial quotient: only sympy can cancel it
        return expanded

    return simplify
