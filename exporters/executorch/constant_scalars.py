"""Fold the scalars a program reads from tensors (``.item()``) when no input can change them.

torch.export turns every ``tensor.item()`` into an unbacked symbol, even when the tensor is computed
from constants only. Ernie 4.5-VL's vision resampler builds its batch offsets from its traced
``grid_thw`` (a constant of the program: the zoo's image grid) in a ``torch.empty`` tensor written in
place, reads them back with ``.item()`` and takes ``torch.arange(start, end)`` of them: the arange's
length ``-u145 + u146`` is data-dependent for torch, and ExecuTorch's memory planning finds no
upper bound for it ("Cannot evaluate a finite upper bound for symbolic expression -u145 + u146").
Its value is the same for every input the program takes, so it can be folded to an int.

An ``item`` is folded when its tensor does not depend on a user input, a random op, or a higher-order
op (whose body is not inspected), following data edges and in-place writes: a write through a view
(``copy_`` into ``empty[1:]``) makes everything that reads the written base depend on what was
written. The value is the one the program computes on the traced inputs.
"""

from __future__ import annotations

import torch
from torch.export.graph_signature import InputKind

_SCALAR_READS = {torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default}
_RANDOM = ("rand", "bernoulli", "normal", "uniform", "multinomial", "exponential", "geometric", "cauchy",
           "poisson", "dropout")


def _schema(node: torch.fx.Node):
    return getattr(node.target, "_schema", None) if node.op == "call_function" else None


def _written_args(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The node arguments an in-place or out= op writes."""
    schema = _schema(node)
    if schema is None:
        return []
    written = []
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            if isinstance(value, torch.fx.Node):
                written.append(value)
    return written


def _base(node: torch.fx.Node) -> torch.fx.Node:
    """The tensor a view (select, slice, view, ...) aliases, followed to its root."""
    while True:
        schema = _schema(node)
        if (schema is None or not schema.returns or schema.returns[0].alias_info is None or not node.args
                or not isinstance(node.args[0], torch.fx.Node)):
            return node
        node = node.args[0]


def _source(node: torch.fx.Node) -> bool:
    """A node whose value may differ between runs of the program whatever its inputs."""
    if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
        return True
    name = str(node.target).lower()
    return node.op == "call_function" and any(word in name for word in _RANDOM)


def input_dependent_nodes(program: torch.export.ExportedProgram) -> set[torch.fx.Node]:
    """Nodes whose value may change with the user inputs (or from run to run)."""
    user = {spec.arg.name for spec in program.graph_signature.input_specs if spec.kind == InputKind.USER_INPUT}
    nodes = list(program.graph.nodes)
    tainted = {n for n in nodes if (n.op == "placeholder" and n.name in user) or _source(n)}
    written_bases: set[torch.fx.Node] = set()
    changed = True
    while changed:  # a write may come after a read of an earlier view: iterate to a fixed point
        changed = False
        for node in nodes:
            if node.op in ("placeholder", "output"):
                continue
            if node not in tainted and (any(a in tainted for a in node.all_input_nodes) or _base(node) in written_bases):
                tainted.add(node)
                changed = True
            if node in tainted:
                for arg in _written_args(node):
                    base = _base(arg)
                    if base not in written_bases:
                        written_bases.add(base)
                        changed = True
                    if base not in tainted:
                        tainted.add(base)
                        changed = True
    return tainted


def fold_input_independent_scalars(program: torch.export.ExportedProgram, values: dict) -> int:
    """Replace each ``item`` of an input-independent tensor by the int it is on the traced inputs
    (``values``: each unbacked symbol's value there, ``traced_unbacked_values``).

    before: offset = (table + 4).item()               (Sym(u0): no bound for memory planning)
            idx = arange(offset, offset2)             (i64[u1 - u0])
    after:  idx = arange(12, 16)                      (i64[4])
    Returns how many were folded."""
    tainted = input_dependent_nodes(program)
    folded = 0
    for node in list(program.graph.nodes):
        val = node.meta.get("val")
        if (node.op != "call_function" or node.target not in _SCALAR_READS or node in tainted
                or not isinstance(val, torch.SymInt) or val.node.expr not in values
                or any(u.op == "output" for u in node.users)):
            continue
        node.replace_all_uses_with(values[val.node.expr])
        program.graph.erase_node(node)
        folded += 1
    if folded:
        program.graph_module.recompile()
    return folded
