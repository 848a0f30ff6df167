"""The grid an output of the quantized reference lies on, where it leaves a quantize.

An output that a ``dequantize_per_tensor`` produces (directly, or through ops that only move or copy
elements: view, permute, slice...) holds ``(q - zero_point) * scale`` for integers q: its values lie on a grid
of spacing ``scale``, and a backend that rounds one value the other way at that quantize is off by exactly
``scale`` there. exporters/parity.py measures errors in steps of ``(max - min) / 255`` of the output's own
range, which is that scale when the observer's range is the output's. It is not always: observers widen their
range to hold zero, and XNNPACK's floor the scale at ``eps = 2**-12``, so a small output far from zero sits on
a grid much coarser than its range. SEW's sequence-classification logits (4 values within 2.4e-4 of each
other near -6e-4) leave the classifier's output quantize with scale 2**-12 = 2.4e-4, 128 times their range
step: ExecuTorch's one-step rounding difference there read as 127.5 "steps" (results/s42, executorch int8).

``reference_and_scales`` returns, per named output (as ``flatten_outputs`` names them), that scale; parity takes the
larger of it and the range step as the output's step.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

import torch
from torch.utils import _pytree as pytree

# ops whose output elements are input elements, moved, copied or converted to float32: the grid passes through them
_MOVES = frozenset({
    "view", "_unsafe_view", "reshape", "permute", "transpose", "t", "squeeze", "unsqueeze", "clone", "contiguous",
    "expand", "slice", "select", "flatten", "alias", "detach", "unflatten", "narrow", "split", "chunk",
    "unbind", "split_with_sizes", "to", "_to_copy", "type_as", "lift_fresh_copy",
})
# ops that write their last tensor argument's elements into their first: the grid is the source's
_WRITES = frozenset({"copy_", "copy"})


def _dequantize_targets() -> set[Any]:
    dequantize = torch.ops.quantized_decomposed.dequantize_per_tensor
    return {getattr(dequantize, name) for name in dequantize.overloads()}


def _constant(module: torch.fx.GraphModule, arg: Any) -> float | None:
    if isinstance(arg, (int, float)):
        return float(arg)
    if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
        value = getattr(module, str(arg.target), None)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            return float(value)
    return None


def node_scale(module: torch.fx.GraphModule, node: Any, dequantizes: set[Any]) -> float | None:
    """The scale of the dequantize ``node`` comes from through element-moving ops; None if it does not."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        if node.target in dequantizes:
            return _constant(module, node.args[1])
        if node.target is operator.getitem:
            node = node.args[0]
            continue
        packet = getattr(node.target, "_opname", None) or getattr(node.target, "__name__", "")
        if packet in _WRITES and len(node.args) > 1:
            node = node.args[1]
            continue
        if packet not in _MOVES or not node.args:
            return None
        if packet in ("to", "_to_copy", "type_as"):  # a float-to-float conversion of fp32 values keeps them
            value = node.meta.get("val")
            if not (isinstance(value, torch.Tensor) and value.dtype == torch.float32):
                return None
        node = node.args[0]
    return None


def reference_and_scales(quantized_model: Any, inputs: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor],
                                                                                 dict[str, float]]:
    """One run of the reference: its outputs (named as ``flatten_outputs`` names them, as ``quantized_model``
    returns them) and, per output that leaves a quantize, the scale of the grid it lies on. The converted
    module's results are matched to its graph's output nodes by identity, so nothing is assumed about the
    outputs' structure (caches, ModelOutputs, exposed selections)."""
    from exporters.pytrees import flatten_outputs

    converted = quantized_model.converted
    output = next(n for n in reversed(converted.graph.nodes) if n.op == "output")
    nodes = pytree.tree_leaves(output.args[0])
    dequantizes = _dequantize_targets()
    with torch.no_grad():
        raw = converted(**{k: inputs[k] for k in quantized_model.tensor_names})
    leaves = pytree.tree_leaves(raw)
    if len(leaves) != len(nodes):
        raise ValueError(f"the converted module returned {len(leaves)} leaves for its graph's {len(nodes)} outputs")
    by_id = {}
    for leaf, node in zip(leaves, nodes, strict=True):
        scale = node_scale(converted, node, dequantizes) if isinstance(leaf, torch.Tensor) else None
        if scale is not None and scale > 0:
            by_id[id(leaf)] = scale
    named = flatten_outputs(quantized_model.merged(raw))
    return named, {name: by_id[id(value)] for name, value in named.items() if id(value) in by_id}

