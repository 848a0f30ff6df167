"""Selections (top-k, sort, argmax...) in a quantized model: checked with the artifact's own choices.

On int8-grid values exact ties are common, and a one-step rounding difference upstream (which the parity
rule allows) flips a choice where two candidates lie within a step: the artifact then routes a token to
another expert or keeps another query, and every value after the choice differs from the reference by
whole rows. Comparing outputs alone cannot tell such a tie from a broken kernel. The generate sweep meets
the same problem with teacher forcing; this is its analogue for one forward call:

- ``expose``: the converted module also returns, for every selection ``i``, its float input
  (``selection.<i>.input``) and the indices it chose (``selection.<i>.indices``). These are taps on nodes
  the model computes anyway; the backend exports them as extra outputs (recorded in the metadata,
  ``selection_outputs``). Only with ``int8(..., expose_selections=True)``: the sweep asks for it.
- ``forced``: a copy of the reference whose selections return the indices given to it (values gathered
  from its own input at those indices) instead of choosing.

The check (sweeps/quantized.py) runs the reference with the artifact's indices and compares every output,
the selection inputs among them, by the quantized rule. Each selection input within its bound means the
artifact chose on values the reference also computes, so a choice that differs from the reference's
own is a tie within the bound; the outputs then check everything computed after the choices. Ops not
forced (``kthvalue``, ``mode``: values used, no index to give) keep choosing for themselves.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

FORCE = "_selection_force"  # the submodule a forced copy calls after each selection
# ops whose result is a choice (an index, an order), not a value: on int8-grid inputs, exact ties are common
# and a one-step difference elsewhere flips the choice, moving whole rows of the output at once
# (max.dim / min.dim are left out: models use their values, which are continuous in the input)
SELECTION_OPS = ("topk", "sort", "argsort", "argmax", "argmin", "kthvalue", "mode")
# the SELECTION_OPS a forced copy can take given indices for: op name -> (position of ``dim`` in the args, its
# default, whether the op returns (values, indices))
FORCEABLE = {"topk": (2, -1, True), "sort": (1, -1, True), "argsort": (1, -1, False),
             "argmax": (1, None, False), "argmin": (1, None, False)}


def is_selection(node: torch.fx.Node) -> bool:
    """Whether ``node`` calls one of SELECTION_OPS (any overload: ``aten.topk.default``, ``aten.sort.stable``)."""
    parts = str(node.target).split(".")
    return node.op == "call_function" and len(parts) >= 2 and parts[0] == "aten" and parts[1] in SELECTION_OPS


def _op_name(node: torch.fx.Node) -> str | None:
    if node.op != "call_function":
        return None
    name = str(node.target)  # aten.topk.default
    parts = name.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] == "aten" and parts[1] in FORCEABLE else None


def _floating(node: torch.fx.Node) -> bool:
    """Whether a selection chooses over floating values (unknown: assumed so). One over integers (the last
    non-padding token, from ``input_ids == pad``) has no rounding to flip it and is left as it is."""
    source = node.args[0]
    val = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    return not isinstance(val, torch.Tensor) or val.dtype.is_floating_point


def selection_nodes(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """The forceable selection nodes over floating values of a graph, in graph order."""
    return [n for n in graph.nodes if _op_name(n) and _floating(n)]


def _dim(node: torch.fx.Node) -> int | None:
    position, default, _ = FORCEABLE[_op_name(node)]
    if len(node.args) > position:
        return node.args[position]
    return node.kwargs.get("dim", default)


def _indices(graph: torch.fx.Graph, node: torch.fx.Node) -> torch.fx.Node:
    """The node holding ``node``'s chosen indices (its second result, or itself)."""
    if not FORCEABLE[_op_name(node)][2]:
        return node
    for user in node.users:
        if user.op == "call_function" and user.target is operator.getitem and user.args[1] == 1:
            return user
    with graph.inserting_after(node):
        return graph.call_function(operator.getitem, (node, 1))


def expose(converted: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, list[str]]:
    """A copy of ``converted`` that returns ``(outputs, {selection.<i>.input, selection.<i>.indices})``, and the
    tap names; ``converted`` itself and no names where it has no forceable selection."""
    nodes = selection_nodes(converted.graph)
    if not nodes:
        return converted, []
    exposed = copy.deepcopy(converted)
    graph = exposed.graph
    taps: dict[str, torch.fx.Node] = {}
    for i, node in enumerate(selection_nodes(graph)):
        taps[f"selection.{i}.input"] = node.args[0]
        taps[f"selection.{i}.indices"] = _indices(graph, node)
    output = next(n for n in graph.nodes if n.op == "output")
    flat = output.args[0]
    output.args = (tuple(flat) + tuple(taps.values()),)
    info = graph._codegen.pytree_info
    taps_spec = pytree.tree_structure(dict.fromkeys(taps, 0))
    out_spec = pytree.treespec_tuple([info.out_spec, taps_spec])
    graph._codegen.pytree_info = info._replace(out_spec=out_spec)
    exposed.recompile()
    return exposed, list(taps)


class _Force(torch.nn.Module):
    """Returns the given indices in place of a selection's own (None: the selection's own result)."""

    def __init__(self):
        super().__init__()
        self.indices: list[torch.Tensor] | None = None

    def forward(self, x: torch.Tensor, result: Any, i: int, dim: int | None, pair: bool):
        if self.indices is None:
            return result
        given = self.indices[i].to(torch.int64)
        own = result[1] if pair else result
        if tuple(given.shape) != tuple(own.shape):
            raise ValueError(f"selection {i}: given indices of shape {tuple(given.shape)}, the selection "
                             f"chooses {tuple(own.shape)}")
        if not pair:
            return given.to(own.dtype)
        values = x.gather(dim if dim is not None else -1, given)
        return values, given.to(own.dtype)


def forced(exposed: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of an ``expose``d module whose selections take their indices from ``set_choices``."""
    copied = copy.deepcopy(exposed)
    copied.add_module(FORCE, _Force())
    for i, node in enumerate(selection_nodes(copied.graph)):
        pair = FORCEABLE[_op_name(node)][2]
        with copied.graph.inserting_after(node):
            replaced = copied.graph.call_module(FORCE, (node.args[0], node, i, _dim(node), pair))
        node.replace_all_uses_with(replaced, delete_user_cb=lambda user: user is not replaced)
    copied.recompile()
    return copied


def set_choices(module: torch.fx.GraphModule, indices: list[torch.Tensor] | None) -> None:
    """The indices each selection of a ``forced`` module returns, in selection order; None: its own."""
    module.get_submodule(FORCE).indices = indices


def choices(outputs: Mapping[str, Any], taps: Sequence[str]) -> list[torch.Tensor]:
    """The indices the ``selection.<i>.indices`` outputs hold, in selection order."""
    return [torch.as_tensor(outputs[name]) for name in taps if name.endswith(".indices")]
