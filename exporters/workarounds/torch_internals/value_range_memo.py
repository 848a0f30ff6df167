"""Torch patch: value-range analysis of a size expression visits each distinct subexpression once.

Cause. Before torch's ShapeEnv asks sympy anything about a guard, ``_maybe_evaluate_static`` bounds
the expression with value-range analysis (``bound_sympy`` in torch/utils/_sympy/value_ranges.py),
which walks it with ``sympy_interp`` (torch/utils/_sympy/interp.py). That walk recurses into every
argument with no memo, so it costs the size of the expression *tree*, while a sympy expression is a
DAG: a repeated subexpression is one object that the tree counts once per occurrence. Shifted-window
attention (Swin and every model on a Swin backbone) pads each stage to a multiple of its window,
``h + (w - h % w) % w``, which names the stage's size twice, and the next stage nests that whole
expression again, so the tree doubles per stage while the distinct subexpressions grow by a few.
Measured on ``python -m sweeps.repro dynamo-dynamic-SwinModel`` (commit e7871ae, beside a 2-worker
sweep): 1,270 ``bound_sympy`` calls took 31.4 s of the 103 s item; the slowest bounded a tree of
21,070 nodes with 58 distinct subexpressions (1.1 s).

What this changes (while tracing only). ``bound_sympy``'s ``sympy_interp`` evaluates every distinct
composite subexpression once per call and reuses the value where it appears again; atoms (symbols,
numbers, booleans) still go to torch's own ``sympy_interp``, and each composite goes to torch's own
handler dispatch (``_run_sympy_handler``) with its arguments' values, as upstream would. The memo
lives for one top-level call and is keyed on sympy's structural equality, under which equal
expressions are equal objects for the analysis (``Float(2.0)`` and ``Integer(2)`` stay distinct
keys). Only the value-range analysis is patched (the name ``sympy_interp`` in
``torch.utils._sympy.value_ranges``): its handlers are pure functions of their arguments' ranges,
so reuse gives the same range, not an approximation. Other analyses (inductor's code generation,
runtime-assert graph building) call ``sympy_interp`` from their own modules and are untouched.

    before: bound(h + (7 - h % 7) % 7) -> bound(h), bound(7 - h % 7) -> bound(h % 7) -> bound(h), ...
    after:  bound(h) once; each distinct subexpression once per call

Remove when: the ``sympy_interp`` walk of ``bound_sympy`` (torch/utils/_sympy/interp.py,
value_ranges.py) evaluates each distinct subexpression once, so its cost is the size of the
expression DAG, not of its tree.
"""

from __future__ import annotations

from exporters.utils import ActedFlag, register_patch


@register_patch("dynamo", "torch.utils._sympy.value_ranges.sympy_interp")
def _patch_value_ranges_once_per_subexpression(original):
    from torch.utils._sympy.interp import _run_sympy_handler  # torch's per-node dispatch

    acted = ActedFlag()

    def sympy_interp(analysis, env, expr, *, index_dtype=None, missing_handler=None):
        dtype_kw = {} if index_dtype is None else {"index_dtype": index_dtype}
        memo: dict = {}
        reused = False

        def value(e):
            nonlocal reused
            if not e.args:  # a symbol, number or boolean atom: torch's own base cases
                return original(analysis, env, e, missing_handler=missing_handler, **dtype_kw)
            hit = memo.get(e, memo)
            if hit is not memo:
                reused = True
                return hit
            out = _run_sympy_handler(analysis, [value(a) for a in e.args], e, **dtype_kw)
            memo[e] = out
            return out

        out = value(expr)
        if reused:
            acted.set()
        return out

    sympy_interp.acted = acted
    return sympy_interp
