"""ONNX IR fixes: rewrites of the finished ONNX program around ONNX Runtime bugs.
"""

from __future__ import annotations

# ── Stage 5: ONNX IR fixes ───────────────────────────────────────────────────
# Rewrite the finished ONNX program around ONNX Runtime bugs: add a ``_fix_ir_*(model) -> bool``
# to _IR_FIXES. Each returns whether it changed the model.


def _all_nodes(model):
    yield from model.graph.all_nodes() if hasattr(model.graph, "all_nodes") else model.graph
    for function in model.functions.values():
        yield from function


def _fix_ir_topk_sorted(model) -> bool:
    """ORT's TopK(sorted=0) returns a different order than torch.topk on CPU; force sorted=1.

    before: TopK(x, k, sorted=0)    after: TopK(x, k, sorted=1)
    """
    import onnx_ir as ir

    changed = False
    for node in _all_nodes(model):
        attr = node.attributes.get("sorted") if node.op_type == "TopK" else None
        if attr is not None and attr.as_int() == 0:
            node.attributes["sorted"] = ir.AttrInt64("sorted", 1)
            changed = True
    return changed


def _fix_ir_register_orphan_constants(model) -> bool:
    """Register as an initializer every node input that nothing defines but that carries its constant.

    onnxscript's rewriter registers a rule's new initializers by name, overwriting an earlier one of
    the same name (``RewriteRuleSet._apply_to_graph_or_function``: the duplicate check is a dead
    ``continue``; microsoft/onnxscript#2945, #2079). ``FuseMaxMinToClip`` names its bounds
    ``f"{x.name}_min"`` / ``_max``, so two ``Min(Max(x, lo), hi)`` clamps of one tensor (Gemma 4's
    audio ``clamp``s of one normed input) each create ``x_min``: the first Clip's bound is dropped
    from ``graph.initializers``, ``NameFixPass`` renames it ``x_min_1`` without re-registering it
    (onnx/ir-py#448), and ONNX Runtime refuses the model ("Node input 'x_min_1' is not a graph input,
    initializer, or output of a previous node"). The value still holds its own bound: register it.

    before: Clip(x, x_min_1 <unregistered const>, x_max_1 <unregistered const>)
    after:  Clip(x, x_min_1, x_max_1) with both in graph.initializers
    """
    graphs = list(model.graphs())
    inputs = {id(v) for g in graphs for v in g.inputs}
    registered = {id(v) for g in graphs for v in g.initializers.values()}
    taken = {v.name for g in graphs for v in (*g.inputs, *g.initializers.values())}
    taken |= {v.name for node in _all_nodes(model) for v in node.outputs}
    changed = False
    for node in _all_nodes(model):
        for value in node.inputs:
            if (value is None or value.producer() is not None or id(value) in inputs or id(value) in registered
                    or value.const_value is None):
                continue
            base = name = value.name or "orphan_constant"
            i = 0
            while name in taken:
                i += 1
                name = f"{base}_{i}"
            value.name = name
            model.graph.register_initializer(value)
            registered.add(id(value))
            taken.add(name)
            changed = True
    return changed


_IR_FIXES = (_fix_ir_topk_sorted, _fix_ir_register_orphan_constants)
