"""Bounds for data-dependent sizes, from the values they were read from.

A size read from tensor data (``n = t.item()`` feeding ``torch.arange(n)`` or ``new_zeros((n, ...))``)
is an unbacked symbol whose range torch leaves unbounded, and ExecuTorch's memory planning needs a
finite one. ``bound_unbacked_sizes_by_trace`` falls back to the value the size took on the traced inputs
(or on them grown to the program's largest shapes), which a later input may exceed: LED's
``_sliding_chunks_query_key_matmul`` counts its chunks with ``torch.div(seq_len, window, rounding_mode=
"trunc")``, a tensor made from a symbolic length, and an input longer than the traced one failed to
resize the chunk buffer planned at the traced count (``op_arange.cpp`` / ``resize_tensor``, 0x12).

Often the values are bounded by the program's shapes: a count over a mask of length S is at most S, a
tensor made from a symbolic size lies in that size's range, integer arithmetic on it moves the range
accordingly. ``source_bounds`` walks back from each ``.item()`` whose result is an unbacked symbol
through ops whose output range follows from their inputs' (reductions, comparisons, views and casts,
``+ - *`` and integer division by a positive constant) and returns the range so derived: a bound that
holds for every input the program accepts, not just the traced ones. A chain with any other op yields
nothing, and the caller keeps its trace-based bound.
"""
from __future__ import annotations

import math

import sympy
import torch

# ops whose output values are a subset of their first input's values
_SAME_VALUES = {
    "amax", "amin", "max", "min", "_to_copy", "clone", "view", "view_copy", "reshape", "_unsafe_view",
    "squeeze", "squeeze_copy", "unsqueeze", "unsqueeze_copy", "select", "select_copy", "slice",
    "slice_copy", "expand", "expand_copy", "permute", "permute_copy", "flatten", "contiguous",
    "alias", "alias_copy", "_to_dim_order_copy", "detach", "detach_copy", "t", "t_copy", "transpose",
    "transpose_copy", "scalar_tensor", "lift_fresh_copy",
}
# ops with values in {0, 1}
_BOOLEAN = {"gt", "lt", "ge", "le", "eq", "ne", "logical_and", "logical_or", "logical_not", "logical_xor",
            "isnan", "isinf", "isfinite", "any", "all"}
_SUMS = {"sum", "count_nonzero"}
_DEPTH = 48

Range = tuple[int, int]


def _op_name(target) -> str | None:
    """'sum' for aten.sum.dim_IntList, in the aten ("sum.dim_IntList") and edge ("aten.sum.dim_IntList",
    "dim_order_ops._to_dim_order_copy.default") spellings; None for Python operators."""
    name = getattr(target, "__name__", None)
    if not isinstance(name, str) or "." not in name:
        return name if isinstance(name, str) and name in ("_local_scalar_dense", "item") else None
    parts = name.split(".")
    return parts[1] if len(parts) >= 3 else parts[0]


def _finite_range(low, high) -> Range | None:
    try:
        return (int(low), int(high)) if low.is_finite and high.is_finite else None
    except (AttributeError, TypeError):
        return None


def _size_range(size, ranges) -> Range | None:
    """The range of an int or a symbolic int over the shape environment's ``ranges``."""
    from torch.utils._sympy.value_ranges import bound_sympy

    if isinstance(size, bool):
        return None
    if isinstance(size, int):
        return (size, size)
    if not isinstance(size, torch.SymInt):
        return None
    bound = bound_sympy(size.node.expr, ranges)
    return _finite_range(bound.lower, bound.upper)


def _operand(arg, ranges, depth: int) -> Range | None:
    if isinstance(arg, torch.fx.Node):
        return value_range(arg, ranges, depth + 1)
    return _size_range(arg, ranges)


def _arith(name: str, node, ranges, depth: int) -> Range | None:
    if name in ("add", "sub", "mul") and node.kwargs.get("alpha", 1) != 1:
        return None
    if len(node.args) < 2:
        return None
    a, b = _operand(node.args[0], ranges, depth), _operand(node.args[1], ranges, depth)
    if a is None or b is None:
        return None
    if name == "add":
        return (a[0] + b[0], a[1] + b[1])
    if name == "sub":
        return (a[0] - b[1], a[1] - b[0])
    if name == "mul":
        corners = [x * y for x in a for y in b]
        return (min(corners), max(corners))
    if name in ("minimum", "maximum"):
        pick = min if name == "minimum" else max
        return (pick(a[0], b[0]), pick(a[1], b[1]))
    # integer division by a positive constant: floor is monotone, trunc too (it rounds toward zero)
    mode = node.kwargs.get("rounding_mode")
    if name != "div" or b[0] != b[1] or b[0] <= 0 or mode not in ("floor", "trunc"):
        return None
    c = b[0]

    def rounded(x: int) -> int:
        return x // c if mode == "floor" or x >= 0 else -((-x) // c)

    return (rounded(a[0]), rounded(a[1]))


def value_range(node, ranges, depth: int = 0) -> Range | None:
    """(low, high) every element of ``node``'s value lies in, from the op chain that made it; None if unknown."""
    if not isinstance(node, torch.fx.Node) or depth > _DEPTH:
        return None
    val = node.meta.get("val")
    if isinstance(val, (int, torch.SymInt)) and not isinstance(val, bool):
        return _size_range(val, ranges)
    if isinstance(val, torch.Tensor) and val.dtype == torch.bool:
        return (0, 1)
    if node.op != "call_function":
        return None
    name = _op_name(node.target)
    if name in _BOOLEAN:
        return (0, 1)
    if name in ("max", "min") and len(node.args) > 1 and isinstance(node.args[1], torch.fx.Node):
        return _arith("maximum" if name == "max" else "minimum", node, ranges, depth)  # max.other: elementwise
    if name in _SAME_VALUES:
        return _operand(node.args[0], ranges, depth) if node.args else None
    if name in ("add", "sub", "mul", "div", "minimum", "maximum"):
        return _arith(name, node, ranges, depth)
    if name in ("clamp", "clamp_min", "clamp_max"):
        inner = _operand(node.args[0], ranges, depth)
        if inner is None:
            return None
        rest = list(node.args[1:]) + [None] * 2
        low, high = (rest[0], rest[1]) if name == "clamp" else ((rest[0], None) if name == "clamp_min" else (None, rest[0]))
        low, high = node.kwargs.get("min", low), node.kwargs.get("max", high)
        lo, hi = inner
        if isinstance(low, int) and not isinstance(low, bool):
            lo, hi = max(lo, low), max(hi, low)
        if isinstance(high, int) and not isinstance(high, bool):
            lo, hi = min(lo, high), min(hi, high)
        return (lo, hi)
    if name in _SUMS:
        source = node.args[0]
        inner = _operand(source, ranges, depth)
        shape = getattr(source.meta.get("val"), "shape", None) if isinstance(source, torch.fx.Node) else None
        if inner is None or shape is None:
            return None
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        if dims is None or (isinstance(dims, (list, tuple)) and not dims):
            dims = range(len(shape))
        elif isinstance(dims, int):
            dims = [dims]
        counts = [_size_range(shape[d], ranges) for d in dims]
        if any(c is None for c in counts):
            return None
        n = math.prod(c[1] for c in counts)  # at most n elements summed
        low, high = inner
        return (min(low * n, 0), max(high * n, 0))
    return None


def source_bounds(graph_module) -> dict:
    """{symbol: (low, high)} for each unbacked symbol read by ``.item()`` whose value range follows from
    the chain that made the tensor read (``value_range``) and is finite."""
    bounds: dict = {}
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or _op_name(node.target) not in ("_local_scalar_dense", "item"):
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.SymInt) or not isinstance(val.node.expr, sympy.Symbol):
            continue
        symbol = val.node.expr
        if symbol in bounds:
            continue
        bound = value_range(node.args[0], val.node.shape_env.var_to_range) if node.args else None
        if bound is not None:
            bounds[symbol] = bound
    return bounds
