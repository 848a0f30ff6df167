"""Data-dependent sizes of a traced program: their values on the traced inputs, and bounds for the ones
memory planning needs (the export loop's bound_unbacked_sizes_by_trace / _by_source retries).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.export.graph_signature import InputKind
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from exporters.executorch.unbacked_bounds import source_bounds
from exporters.tracing import _finite


def _record_unbacked(fake: Any, real: Any, values: dict) -> None:
    """Unify a node's fake value with the real one: each size that is one unbacked symbol gets its value."""
    if isinstance(fake, torch.SymInt) and isinstance(real, int):
        if fake.node.expr.is_Symbol and free_unbacked_symbols(fake.node.expr):
            values[fake.node.expr] = real
    elif isinstance(fake, torch.Tensor) and isinstance(real, torch.Tensor) and fake.dim() == real.dim():
        for size, n in zip(fake.shape, real.shape):
            _record_unbacked(size, int(n), values)
    elif isinstance(fake, (list, tuple)) and isinstance(real, (list, tuple)) and len(fake) == len(real):
        for f, r in zip(fake, real):
            _record_unbacked(f, r, values)


def _has_unbacked(val: Any) -> bool:
    try:
        return bool(free_unbacked_symbols(val))
    except (AssertionError, TypeError):  # a value that holds no sizes (None, an opaque object)
        return False


def traced_unbacked_values(program: torch.export.ExportedProgram, inputs: list[torch.Tensor]) -> dict:
    """Run ``program``'s graph on the real user ``inputs`` (in its user-input order) and return the
    value each unbacked symbol (a size read from data: ``.item()``, ``nonzero``) took: the sizes the
    traced inputs make. Empty when the graph has none."""
    if not any(_has_unbacked(n.meta.get("val")) for n in program.graph.nodes):
        return {}
    user, args = iter(inputs), []
    for spec in program.graph_signature.input_specs:
        if spec.kind.name == "USER_INPUT":
            args.append(next(user))
        elif spec.kind.name in ("PARAMETER", "BUFFER"):
            args.append(program.state_dict[spec.target] if spec.target in program.state_dict else program.constants[spec.target])
        else:
            args.append(program.constants[spec.target])
    values: dict = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node):
            out = super().run_node(node)
            _record_unbacked(node.meta.get("val"), out, values)
            return out

    with torch.no_grad():
        Recorder(program.graph_module).run(*args)
    return values


def inputs_at_upper_bounds(program: torch.export.ExportedProgram, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The user ``inputs`` grown to the largest sizes ``program`` accepts: every input dim's expression
    evaluated with each dynamic symbol at its upper bound (so dims tied by the program stay tied), the
    tensor tiled along the dim to reach it (its values repeat: token ids stay valid ids, masks stay
    masks). A dim whose bound is not finite keeps its traced size."""
    bounds = {symbol: int(r.upper) for symbol, r in program.range_constraints.items() if _finite(r.upper)}
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    names = [s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    grown = []
    for name, tensor in zip(names, inputs):
        val = placeholders[name].meta.get("val")
        if not isinstance(tensor, torch.Tensor) or not isinstance(val, torch.Tensor):
            grown.append(tensor)
            continue
        for dim, size in enumerate(val.shape):
            if not isinstance(size, torch.SymInt):
                continue
            expr = size.node.expr
            if not expr.free_symbols <= bounds.keys():
                continue
            target = int(expr.subs(bounds))
            if target > tensor.shape[dim] > 0:
                reps = [1] * tensor.dim()
                reps[dim] = -(-target // tensor.shape[dim])
                tensor = tensor.repeat(reps).narrow(dim, 0, target)
        grown.append(tensor)
    return grown


def _symbolic_sizes(node: torch.fx.Node) -> list[tuple[int | None, torch.SymInt]]:
    """(dim, size) for each symbolic size of a node's value: its dims for a tensor, (None, it) for a SymInt."""
    val = node.meta.get("val")
    sizes = [(None, val)] if isinstance(val, torch.SymInt) else (
        list(enumerate(val.shape)) if isinstance(val, torch.Tensor) else [])
    return [(dim, size) for dim, size in sizes if isinstance(size, torch.SymInt)]


def bound_unbacked_sizes_by_trace(program: torch.export.ExportedProgram, inputs: list[torch.Tensor]) -> set[str]:
    """ExecuTorch plans each tensor's memory for its size's upper bound, and a size read from data
    (Siglip2's per-image patch grid from ``spatial_shapes.tolist()``, Lfm2-VL's and Ernie 4.5-VL's image
    token counts) has none: "Cannot evaluate a finite upper bound for symbolic expression u64 (int_oo)
    and no trace hint is available". The lowering re-traces the program, so the symbols it plans with
    are new ones; only a constraint written in the graph reaches them. When a lowering fails so (and
    only then: a size the graph bounds already, like a slice of a known length, keeps its wider
    range), bound each unbacked size by the value it took when the program ran on the traced inputs
    (``traced_unbacked_values``), or at the traced inputs grown to the program's largest sizes if that is
    more (``inputs_at_upper_bounds``: Longformer's padded length and JetMoE's per-expert token counts grow
    with the sequence; bounded at the traced 7 tokens, 9 failed): the program then runs for inputs whose
    data-dependent sizes are no larger; a larger one fails in the runtime's resize check
    ("op_slice_copy.cpp: Check failed (resize_tensor(out, ...))").
    A size whose lower bound is unknown too (a difference of two read values, ``-u145 + u146``) stays
    unbounded; ``fold_input_independent_scalars`` first turns those no input can change into ints
    (Ernie 4.5-VL's offsets).

    Where the values read follow from the program's shapes (``unbacked_bounds.source_bounds``: a count
    over a mask is at most its length; LED's chunk count, ``torch.div(seq_len, w, rounding_mode="trunc")``
    of the symbolic length), that bound holds for every input and replaces the traced value: LED's
    chunk buffers were planned for the traced length's 4 chunks and a longer input failed to resize them.

    before: n = x.item()                        (u0 in [0, int_oo])
    after:  n = x.item(); sym_constrain_range(n, min=lower(u0), max=u0 at the traced inputs, or the bound
            n's source allows)
    Returns the names of the fixes applied: ``fix:executorch:bound_unbacked_sizes_by_trace`` and/or
    ``fix:executorch:bound_unbacked_sizes_by_source``; empty when no bound was added.
    """
    sources = source_bounds(program.graph_module)
    values = traced_unbacked_values(program, inputs)
    if not values and not sources:
        return set()
    try:  # the sizes the data makes at the largest inputs the program accepts, where they grow with them
        larger = traced_unbacked_values(program, inputs_at_upper_bounds(program, inputs)) if values else {}
    except Exception:  # noqa: BLE001  (an input the model refuses at that size: the traced values only)
        larger = {}
    values = {symbol: max(value, larger.get(symbol, value)) for symbol, value in values.items()}
    values.update({symbol: high for symbol, (_, high) in sources.items()})  # sound for every input
    graph, done = program.graph, set()
    for node in list(graph.nodes):
        for dim, size in _symbolic_sizes(node):
            if size.node.expr not in values or size.node.expr in done:
                continue
            symbol = size.node.expr
            done.add(symbol)
            lower = size.node.shape_env.var_to_range[symbol].lower
            if symbol in sources:
                lower = max(lower, sources[symbol][0]) if _finite(lower) else sources[symbol][0]
            with graph.inserting_after(node):
                read = node if dim is None else graph.call_function(torch.ops.aten.sym_size.int, (node, dim))
                if dim is not None:
                    read.meta["val"] = size
                with graph.inserting_after(read):
                    graph.call_function(torch.ops.aten.sym_constrain_range.default, (read,),
                                        {"min": int(lower) if _finite(lower) else None, "max": values[symbol]})
    program.graph_module.recompile()
    return {"fix:executorch:bound_unbacked_sizes_by_source" if symbol in sources
            else "fix:executorch:bound_unbacked_sizes_by_trace" for symbol in done}
