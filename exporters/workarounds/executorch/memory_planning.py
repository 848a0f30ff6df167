"""ExecuTorch patch: a planned size with no finite interval bound is planned at its true maximum.

Cause. ExecuTorch plans every dynamic tensor at its sizes' upper bounds (executorch/exir/sym_util.py,
``eval_upper_bound``, called by ``ConstraintBasedSymShapeEvalPass`` and ``eval_shape_upper_bound``),
and takes each bound from interval arithmetic (``bound_sympy`` over the shape environment's ranges).
Where that arithmetic loses the bound it either stops or guesses:
- a size computed through float math is bounded by sympy's ``oo``, which it rejects: "Expect upper
  bound to be sympy.Integer or int_oo. but got oo" (SwinForMaskedImageModeling's decoder takes
  ``math.floor(sequence_length ** 0.5)``, modeling_swin.py:963, a float power interval arithmetic
  does not bound);
- a size bounded by ``int_oo`` (a floor division whose divisor's interval reaches 0) is planned at its
  traced value, too small for larger inputs within the exported bounds.

What this changes (while lowering only). When the interval bound is not a finite integer and every
symbol of the size has a finite integer range, the size is bounded by its maximum over those ranges:
a product is bounded factor by factor (a factor that can be negative stops it), each factor by its
interval bounds where they are finite, otherwise by its least and greatest value at every point of
its symbols' ranges when they hold at most ``POINTS`` points (a point where it is undefined, a
division by zero, is no size any input makes), or else at every combination of the distinct values
its one-symbol subexpressions take (a length made of floor divisions of a sample count takes a few
dozen values over thousands of counts). Every input the program accepts lies within those
ranges, so the bound is sound; it is exact for a factor evaluated point by point. Otherwise, and for
every size interval arithmetic bounds, ExecuTorch's own answer stands.

    before: eval_upper_bound(floor(s1 / (s2 // 32)))      -> RuntimeError (oo)
    after:  eval_upper_bound(floor(s1 / (s2 // 32)))      -> max over s1, s2 in their ranges
    before: eval_upper_bound(s0 * ((s1//8) // (s2//32)))  -> the traced value (int_oo bound)
    after:  eval_upper_bound(s0 * ((s1//8) // (s2//32)))  -> max(s0) * max over (s1, s2) of the rest

Measured (``python -m sweeps.repro executorch-dynamic-<class>``, 2026-12-02): LwDetrViTBackbone and
LwDetrModel, whose window count B*(H//8)*((W//8)//(4*(H//32))) interval arithmetic bounds by
``int_oo``, PASS with 3 dynamic shapes compared (31.8 s, 77.0 s); without this patch the backbone's
program, planned for batch 2, fails at batch 3 (native_layer_norm's resize_tensor check).
SEWDForCTC's attention batch, ``s0 * ((4*s0) // ((4*s0*L**2) // (L*4*L)))`` (4*s0, from
``view(-1, L, L)``) over 63 batch sizes and 14,001 audio lengths (882,063 points, past ``POINTS``) is planned at 4 *
64 from 63 and 22 distinct values of its batch and length terms; before, it was planned at the traced 8
and the program failed at batch 6 (XNNPACK "Failed to resize output tensor", 0x10); now PASS with 3
shapes compared (75.6 s). SwinForMaskedImageModeling's float size is now planned; its lowering stops
later, on the float power and floor ExecuTorch's runtime has no prim for (an EXPORT_SKIPS entry).

Under ``exact_planning_bounds()`` (the ExecuTorch exporter enters it when a plan passes its memory
budget and ``exact_share`` says exact bounds would keep less than half of it) every size interval
arithmetic bounds is planned at the least of that bound and its true maximum: Swin2SRModel, whose
window dims such as Hp // (Hp // 2) (always 2) interval arithmetic bounds at 66, planned
19,235,868,927,504 bytes and its load raised std::bad_alloc; planned exactly, 17,416.9 MiB, it
passes with 3 dynamic shapes compared (303.5 s, the exact lowering alone, beside a 2-worker sweep).

Remove it when ExecuTorch bounds planned sizes past interval arithmetic.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import math
from collections.abc import Callable

import sympy

from exporters.utils import ActedFlag, register_patch

POINTS = 1 << 18  # points of a factor's symbol ranges evaluated at most (262,144: under a second compiled)
SYMPY_POINTS = 1 << 12  # ... where torch's printer cannot write the factor and sympy evaluates it (slower)


def _finite_int(value) -> int | None:
    return int(value) if isinstance(value, sympy.Integer) else None  # int_oo and oo are not sympy.Integer


def _compiled(expr: sympy.Expr, symbols: list) -> Callable | None:
    """``expr`` as a Python function of its symbols, printed the way torch prints guards (ints, ``//``,
    ``%``, ``math.floor``); None when torch's printer cannot write it."""
    import torch
    from torch.utils._sympy.printers import PythonPrinter

    try:
        code = PythonPrinter().doprint(expr)
        return eval(f"lambda {', '.join(map(str, symbols))}: {code}", {"math": math, "torch": torch})  # noqa: S307
    except Exception:  # noqa: BLE001 - an expression the printer does not cover: evaluated by sympy
        return None


def _by_sympy(expr: sympy.Expr, symbols: list) -> Callable:
    def value(*point):
        result = expr.xreplace({s: sympy.Integer(v) for s, v in zip(symbols, point)})
        if isinstance(result, sympy.Integer):
            return int(result)
        return float(result) if isinstance(result, sympy.Float) else None

    return value


class _DoesNotRun(Exception):
    """The printed code raised something no size value explains (a name torch's printer assumes)."""


def _scan(value: Callable, axes: list) -> tuple[int, int] | None:
    least = greatest = None
    for point in itertools.product(*axes):
        try:
            v = value(*point)
        except (ZeroDivisionError, ValueError, OverflowError):  # undefined there: no input makes this size
            continue
        except Exception as exc:  # noqa: BLE001
            raise _DoesNotRun from exc
        if isinstance(v, float):
            if not math.isfinite(v):
                continue
            v = math.ceil(v)  # rounded up: still an upper bound
        if not isinstance(v, int):
            continue
        least = v if least is None else min(least, v)
        greatest = v if greatest is None else max(greatest, v)
    return None if greatest is None else (least, greatest)


def own_terms(expr: sympy.Expr) -> dict:
    """The largest subexpressions of ``expr`` that hold one symbol each, by symbol: ``expr`` is a
    function of them, and each takes a value per value of its symbol. In
    ``s0 * ((4*s0) // ((4*s0*L**2) // (L*(4*L + 4))))`` with ``L = (s1 // 80 - 3) // 2 + 1``:
    ``{s0: [s0, 4*s0], s1: [L**2, L*(4*L + 4)]}``."""
    terms: dict = {}
    seen: set = set()

    def walk(e):
        if e in seen:
            return
        seen.add(e)
        symbols = e.free_symbols
        if len(symbols) == 1:
            own = terms.setdefault(next(iter(symbols)), [])
            if e not in own:
                own.append(e)
            return
        for arg in e.args:
            walk(arg)

    walk(expr)
    return terms


def _distinct_values(terms: list, symbol, axis: range) -> list[tuple] | None:
    """The distinct tuples ``terms`` take over ``axis`` (values where one is undefined are no input's);
    None when torch's printer cannot write one of them."""
    compiled = [_compiled(t, [symbol]) for t in terms]
    if any(c is None for c in compiled):
        return None
    values: dict = {}
    for v in axis:
        try:
            values[tuple(c(v) for c in compiled)] = None
        except (ZeroDivisionError, ValueError, OverflowError):
            continue
        except Exception:  # noqa: BLE001 - a name torch's printer assumes: not evaluated here
            return None
    return list(values)


def _range_by_terms(expr: sympy.Expr, symbols: list, axes: list, points: int) -> tuple[int, int] | None:
    """``factor_range`` where the symbols' ranges hold too many points: ``expr`` evaluated at every
    combination of the distinct values its one-symbol terms take (``own_terms``). Exact, as the
    ranges are independent; a size made of floor divisions of a length takes few distinct values
    (SEW-D's encoder length: 23 over an audio length of 1,360 to 15,360 samples)."""
    terms = own_terms(expr)
    if set(terms) != set(symbols) or any(len(a) > points for a in axes):
        return None
    replaced, groups, names = {}, [], []
    for symbol, axis in zip(symbols, axes):
        values = _distinct_values(terms[symbol], symbol, axis)
        if not values:
            return None
        groups.append(values)
        for i, term in enumerate(terms[symbol]):
            integral = all(isinstance(v[i], int) for v in values)
            name = sympy.Symbol(f"_term_{len(names)}", integer=True if integral else None)
            replaced[term] = name
            names.append(name)
    if math.prod(len(g) for g in groups) > points:
        return None
    compiled = _compiled(expr.xreplace(replaced), names)
    if compiled is None:
        return None
    try:
        return _scan(lambda *point: compiled(*itertools.chain.from_iterable(point)), groups)
    except _DoesNotRun:
        return None


def factor_range(expr: sympy.Expr, ranges: dict, points: int = POINTS) -> tuple[int, int] | None:
    """The least and greatest value of ``expr`` over the integer ranges of its symbols, by evaluation
    at every point, or at every combination of its one-symbol terms' distinct values where the ranges
    hold more than ``points`` points; None when a range is not finite, still more than ``points``
    points remain (``SYMPY_POINTS`` where torch's printer cannot write ``expr`` and sympy evaluates
    it), or no point has a value."""
    symbols = sorted(expr.free_symbols, key=str)
    axes = []
    for symbol in symbols:
        vr = ranges.get(symbol)
        lower, upper = (None, None) if vr is None else (_finite_int(vr.lower), _finite_int(vr.upper))
        if lower is None or upper is None:
            return None
        axes.append(range(lower, upper + 1))
    count = math.prod(len(a) for a in axes)
    if count > points:
        return _range_by_terms(expr, symbols, axes, points)
    compiled = _compiled(expr, symbols)
    if compiled is not None:
        try:
            return _scan(compiled, axes)
        except _DoesNotRun:
            pass
    if count > min(points, SYMPY_POINTS):
        return None
    try:
        return _scan(_by_sympy(expr, symbols), axes)
    except _DoesNotRun:
        return None


def size_maximum(expr: sympy.Expr, ranges: dict, points: int = POINTS) -> int | None:
    """An upper bound of the size ``expr`` over its symbols' ranges (see the module docstring), or None.
    A factor keeps its interval bounds where they are finite (and, in a product, non-negative);
    otherwise its values are enumerated."""
    from torch.utils._sympy.value_ranges import bound_sympy

    factors = expr.args if isinstance(expr, sympy.Mul) else (expr,)
    product = len(factors) > 1
    bound = 1
    for factor in factors:
        interval = bound_sympy(factor, ranges)
        lower, upper = _finite_int(interval.lower), _finite_int(interval.upper)
        if upper is None or (product and (lower is None or lower < 0)):
            exact = factor_range(factor, ranges, points)
            if exact is None:
                return None
            lower, upper = exact
        if product and lower < 0:
            return None  # a factor that can be negative: the product of maxima bounds nothing
        bound *= upper
    return bound


def true_maximum(expr: sympy.Expr, ranges: dict) -> int | None:
    """The greatest value the size ``expr`` takes over its symbols' ranges (``factor_range`` over the
    whole size, at least 0), or None where it cannot be computed."""
    exact = factor_range(expr, ranges)
    return None if exact is None else max(exact[1], 0)


def exact_share(graph_module) -> float:
    """The share of a lowered program's planned tensor memory that exact bounds would keep: each
    planned tensor's bytes scaled, dim by dim, by its true maximum over the planned bound (1.0 where
    interval arithmetic was exact or the maximum cannot be computed). Cheap next to a lowering: it
    tells whether lowering again under ``exact_planning_bounds`` can shrink the plan."""
    planned = kept = 0.0
    maxima: dict = {}
    for node in graph_module.graph.nodes:
        spec, val = node.meta.get("spec"), node.meta.get("val")
        if (getattr(spec, "mem_id", None) is None or not getattr(spec, "allocated_memory", 0)
                or getattr(val, "shape", None) is None or len(val.shape) != len(spec.shape)):
            continue
        share = 1.0
        for size, bound in zip(val.shape, spec.shape):
            if isinstance(size, int) or not bound:
                continue
            expr, ranges = size.node.expr, size.node.shape_env.var_to_range
            if expr not in maxima:
                maxima[expr] = true_maximum(expr, ranges)
            if maxima[expr] is not None and maxima[expr] < bound:
                share *= maxima[expr] / bound
        planned += spec.allocated_memory
        kept += spec.allocated_memory * share
    return kept / planned if planned else 1.0


EXACT_BOUNDS = contextvars.ContextVar("exact_planning_bounds", default=False)


@contextlib.contextmanager
def exact_planning_bounds():
    """While lowering inside this block, every planned size interval arithmetic bounds is planned at
    the least of that bound and its true maximum (``factor_range`` over the whole size), where that
    can be computed: exact, and slower. For a program whose plan is too large to load
    (``ExecutorchConfig.memory_budget_mb``)."""
    token = EXACT_BOUNDS.set(True)
    try:
        yield
    finally:
        EXACT_BOUNDS.reset(token)


@register_patch("executorch", "executorch.exir.sym_util.eval_upper_bound",
                "executorch.exir.passes.sym_shape_eval_pass.eval_upper_bound")
def _patch_unbounded_sizes_planned_at_their_maximum(original):
    from torch.utils._sympy.value_ranges import bound_sympy

    acted = ActedFlag()
    found: dict = {}  # expression -> bound, for this installation (one lowering)
    exact_found: dict = {}  # expression -> true maximum, under exact_planning_bounds

    def eval_upper_bound(maybe_symint):
        if isinstance(maybe_symint, int):
            return maybe_symint
        node = maybe_symint.node
        expr, ranges = node.expr, node.shape_env.var_to_range
        upper = _finite_int(bound_sympy(expr, ranges).upper)
        if upper is not None and EXACT_BOUNDS.get():
            if expr not in exact_found:
                exact_found[expr] = true_maximum(expr, ranges)
            if exact_found[expr] is not None and exact_found[expr] < upper:
                acted.set()
                return exact_found[expr]
        if upper is not None:
            return upper  # what ExecuTorch returns for a finite bound, without computing it again
        if expr not in found:
            found[expr] = size_maximum(expr, ranges)
        if found[expr] is not None:
            acted.set()
            return found[expr]
        return original(maybe_symint)  # ExecuTorch's own refusal or trace-hint fallback

    eval_upper_bound.acted = acted
    return eval_upper_bound
