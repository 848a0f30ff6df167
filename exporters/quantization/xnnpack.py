"""XNNPACK's PT2E quantizer, with one workaround: integer scalars stay integers.

Cause. ``XNNPACKQuantizer.transform_for_annotation`` (``_convert_scalars_to_attrs``) turns every scalar
argument of ``aten.add.Tensor`` / ``aten.mul.Tensor`` into a float32 tensor constant, integer
arithmetic included. transformers builds its attention masks from integer index arithmetic
(``arange(kv_length) + kv_offset``), which then yields float indices: the first calibration call of
prepared BERT or Llama raised ``IndexError: tensors used as indices must be long, int, byte or bool
tensors`` inside the in-graph mask construction.

What this changes. The same conversion, for nodes whose output is floating point only; an integer
node keeps its scalar (nothing there is quantized: observers annotate floating tensors). BERT and
Llama then calibrate and convert; their quantized references stay at 38 and 23 dB SQNR against fp32
eager (zoo tiny models). Remove when the quantizer skips non-floating nodes (executorch's
backends/xnnpack/quantizer/xnnpack_quantizer_utils.py, ``_convert_scalars_to_attrs``).
"""

from __future__ import annotations

import torch
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer

_SCALAR_OPS = (torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor)


def floating_scalars_to_attrs(model: torch.fx.GraphModule) -> torch.fx.GraphModule:
    count = 0
    for node in list(model.graph.nodes):
        value = node.meta.get("val")
        if node.op != "call_function" or node.target not in _SCALAR_OPS:
            continue
        if isinstance(value, torch.Tensor) and not value.is_floating_point():
            continue  # index arithmetic: keep the integer scalar
        args = []
        for arg in node.args:
            if isinstance(arg, torch.fx.Node):
                args.append(arg)
                continue
            name = f"_scalar_constant_{count}"
            count += 1
            constant = torch.tensor(float(arg))
            model.register_buffer(name, constant)
            with model.graph.inserting_before(node):
                attr = model.graph.create_node("get_attr", name, (), {})
            attr.meta["val"] = value.fake_mode.from_tensor(constant, static_shapes=True)
            args.append(attr)
        node.args = tuple(args)
    model.recompile()
    return model


def _tensor_dtypes(node: torch.fx.Node) -> set[torch.dtype]:
    values = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    return {v.dtype for v in values if isinstance(v, torch.Tensor)}


def float32_annotations_only(model: torch.fx.GraphModule) -> int:
    """Drop the annotations of nodes that compute in another floating type than float32, and return
    how many. PT2E's quantize ops take float32 (or half) only: DEIMv2's anchor arithmetic runs in float64,
    XNNPACK's quantizer annotated its adds, and the converted model failed ("Expecting input to have dtype
    torch.float32, but got dtype: torch.float64"). Those nodes stay in their own precision, unquantized,
    as an int8 kernel could not run them anyway."""
    from torchao.quantization.pt2e.quantizer.quantizer import Q_ANNOTATION_KEY

    dropped = 0
    for node in model.graph.nodes:
        if Q_ANNOTATION_KEY in node.meta and _tensor_dtypes(node) & {torch.float64}:
            del node.meta[Q_ANNOTATION_KEY]
            dropped += 1
    return dropped


class IntegerSafeXNNPACKQuantizer(XNNPACKQuantizer):
    """XNNPACKQuantizer whose scalar conversion leaves integer nodes alone (see the module docstring),
    and which leaves float64 nodes unannotated (``float32_annotations_only``)."""

    def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        return floating_scalars_to_attrs(model)

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        model = super().annotate(model)
        float32_annotations_only(model)
        return model
