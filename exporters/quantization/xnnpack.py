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

from exporters.quantization.selections import is_selection

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


def separate_shared_conv_weights(model: torch.fx.GraphModule) -> int:
    """Give every convolution after the first that reads a weight or bias another convolution reads (a module
    called twice) a ``get_attr`` node of its own, and return how many were made.

    Cause. XNNPACK's quantizer annotates a convolution together with its weight and bias nodes and skips one whose
    partition is already annotated (``_do_annotate_conv``: ``if _is_annotated(partition)``), so a second call of
    the same module keeps float weights while its input, quantized for another consumer, reaches it dequantized.
    XNNPACK's partitioner takes that dequantize-convolution pair as a quantized convolution, which its runtime
    refuses at load: HunYuanVLVisionTransformer's patch merger, called twice ("Failed to create convolution node
    ... xnn_status_invalid_parameter", then "Failed to load method forward"). With a node of its own each call is
    annotated as the first is (the attribute is the same; convert_pt2e folds each use's int8 copy). Linear layers
    share the annotator's skip and are left as they are, not measured: the classes that call a linear module twice
    were not scanned (PatchTSTForClassification's executorch failure, "Weight and Input should both be quantized",
    is not one: its tiny model calls each linear once); extending this to linears changes each such program."""
    count = 0
    for node in list(model.graph.nodes):
        if node.op != "get_attr":
            continue
        convs = [u for u in node.users if u.op == "call_function" and str(u.target).startswith("aten.conv")]
        for user in convs[1:]:
            with model.graph.inserting_before(user):
                own = model.graph.get_attr(node.target)
            own.meta = dict(node.meta)
            user.replace_input_with(node, own)
            count += 1
    if count:
        model.recompile()
    return count


_SAME_TYPE_CONVERSIONS = (torch.ops.aten.to.dtype, torch.ops.aten.to.dtype_layout)


def fold_same_type_conversions(model: torch.fx.GraphModule) -> list[str]:
    """Take out every ``Tensor.to`` that converts a tensor to the dtype, device and layout it already has,
    and return their names: eager returns the tensor itself there, so the graph computes the same.

    Cause. XNNPACK's quantizer annotates view-like ops (slice, reshape) to keep their input's grid but not
    ``aten.to``, so the op after a ``.to(torch.float32)`` of a float32 tensor (transformers' norms and
    Mamba2's scan cast every input) has its input observed afresh: the reference requantizes there, from the
    producer's grid to one its own histogram observer chose (Mamba2Model: scale 0.004213, zero point -62 then
    0.004278, -63 before the scan's mul). The ONNX export drops the cast, and ONNX Runtime's
    DoubleQDQPairsRemover (graph optimization level basic and up, on by default) merges the two
    quantize-dequantize pairs into one on a recomputed grid, one rounding where the reference does two:
    Mamba2's scan carried that to 29 steps on its conv state and 43 on last_hidden_state, while the same
    artifact with that one optimizer disabled equals its reference exactly (results of
    ``disabled_optimizers=["DoubleQDQPairsRemover"]`` on Mamba2Model, 2026-12-06). With the conversion
    gone the op's input shares its producer's observer (PT2E's implicit sharing of equal specs), so there
    is one grid and nothing to merge. ``copy=True`` or a memory format keeps the node (a real copy)."""
    folded: list[str] = []
    for node in list(model.graph.nodes):
        if node.op != "call_function" or node.target not in _SAME_TYPE_CONVERSIONS or not node.args:
            continue
        source = node.args[0]
        out = node.meta.get("val")
        given = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
        # to.dtype(self, dtype, non_blocking, copy, memory_format); to.dtype_layout takes them by keyword
        positional = dict(zip(("copy", "memory_format"), node.args[3:5])) if node.target == torch.ops.aten.to.dtype else {}
        options = {**positional, **node.kwargs}
        if options.get("copy") or options.get("memory_format") is not None:
            continue
        if not (isinstance(out, torch.Tensor) and isinstance(given, torch.Tensor)):
            continue
        if (out.dtype, out.device, out.layout, out.shape) != (given.dtype, given.device, given.layout, given.shape):
            continue
        node.replace_all_uses_with(source)
        model.graph.erase_node(node)
        folded.append(node.name)
    if folded:
        model.recompile()
    return folded


def _tensor_dtypes(node: torch.fx.Node) -> set[torch.dtype]:
    values = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    return {v.dtype for v in values if isinstance(v, torch.Tensor)}


def _observed_dtypes(node: torch.fx.Node, annotation) -> set[torch.dtype]:
    """The dtypes of the tensors an annotation would observe: its annotated inputs and, with an output
    spec, the node's output."""
    observed = list(getattr(annotation, "input_qspec_map", {}) or {})
    if getattr(annotation, "output_qspec", None) is not None:
        observed.append(node)
    values = [n.meta.get("val") for n in observed if isinstance(n, torch.fx.Node)]
    return {v.dtype for v in values if isinstance(v, torch.Tensor)}


def float32_annotations_only(model: torch.fx.GraphModule) -> int:
    """Drop the annotations of nodes that compute in another floating type than float32, or that would
    observe a tensor that is not float32, and return how many. PT2E's quantize ops take float32 (or half)
    only: DEIMv2's anchor arithmetic runs in float64, XNNPACK's quantizer annotated its adds, and the
    converted model failed ("Expecting input to have dtype torch.float32, but got dtype: torch.float64").
    A cat of boolean masks (OneFormer, Nemotron3_5Transcribe) was annotated too, and the
    histogram observer on it failed at the first calibration call ("linspace_cpu" not implemented for
    'Bool'). Those nodes stay in their own precision, unquantized, as an int8 kernel could not run them
    anyway."""
    from torchao.quantization.pt2e.quantizer.quantizer import Q_ANNOTATION_KEY

    dropped = 0
    for node in model.graph.nodes:
        annotation = node.meta.get(Q_ANNOTATION_KEY)
        if annotation is None:
            continue
        if _tensor_dtypes(node) & {torch.float64} or _observed_dtypes(node, annotation) - {torch.float32}:
            del node.meta[Q_ANNOTATION_KEY]
            dropped += 1
    return dropped


def per_channel_needs_a_channel_axis(model: torch.fx.GraphModule) -> list[str]:
    """Drop the annotation of a node that would observe a tensor of fewer than two dimensions per channel, and
    return their names.

    Cause. XNNPACK's quantizer gives every linear weight a per-channel observer, which flattens the weight from
    dimension 1 on. D-FINE and DEIMv2 project a distribution onto a fixed vector, ``F.linear(probs, project)``
    with a 1-D ``project``: the first calibration call failed there ("IndexError: Dimension out of range
    (expected to be in range of [-1, 0], but got 1)", PerChannelMinMaxObserver). A vector has no channels to
    scale apart and XNNPACK's int8 linear takes 2-D weights: such a node stays float."""
    from torchao.quantization.pt2e.quantizer.quantizer import Q_ANNOTATION_KEY

    per_channel = (torch.per_channel_symmetric, torch.per_channel_affine)
    dropped: list[str] = []
    for node in model.graph.nodes:
        annotation = node.meta.get(Q_ANNOTATION_KEY)
        if annotation is None:
            continue
        for arg, spec in (getattr(annotation, "input_qspec_map", None) or {}).items():
            value = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
            if getattr(spec, "qscheme", None) in per_channel and isinstance(value, torch.Tensor) and value.dim() < 2:
                del node.meta[Q_ANNOTATION_KEY]
                dropped.append(node.name)
                break
    return dropped


_SELECTION_DEPTH = 8  # producers walked back from a selection's input, through unannotated ops


def float_selection_inputs(model: torch.fx.GraphModule) -> list[str]:
    """Drop the annotation of the first quantized producer on every path into a selection op (top-k, sort,
    argmax...), walking back through unannotated ops (softmax, sigmoid, views...); return their names.

    Cause. Quantized values lie on a grid: exact ties are common, and a one-step difference between the
    backend's integer kernel and the reference's float arithmetic flips the choice, which then moves whole
    rows of the output (an expert routed elsewhere, another query selected). Measured before this rule:
    GlmMoeDsa's ONNX logits 10 steps off, all at one token, already at ONNX Runtime's basic optimization
    level; DEIMv2's query selection 172 steps off on 60 of 512 elements. MoE quantization recipes keep the
    router in float for the same reason. Choices then come from float scores, as in the fp32 model."""
    from torchao.quantization.pt2e.quantizer.quantizer import Q_ANNOTATION_KEY

    kept: list[str] = []
    for node in model.graph.nodes:
        if not is_selection(node):
            continue
        frontier, seen = list(node.all_input_nodes), set()
        for _ in range(_SELECTION_DEPTH):
            upstream = []
            for producer in frontier:
                if producer in seen:
                    continue
                seen.add(producer)
                if Q_ANNOTATION_KEY in producer.meta:
                    del producer.meta[Q_ANNOTATION_KEY]
                    kept.append(producer.name)
                else:
                    upstream.extend(producer.all_input_nodes)
            frontier = upstream
    return kept


def _shared_target_annotated(target, key: str) -> bool:
    """Whether what a SharedQuantizationSpec points at still has a spec: a node's output, or an edge (arg, user)."""
    if isinstance(target, torch.fx.Node):
        annotation = target.meta.get(key)
        return annotation is not None and getattr(annotation, "output_qspec", None) is not None
    arg, user = target
    annotation = user.meta.get(key)
    return annotation is not None and arg in (getattr(annotation, "input_qspec_map", None) or {})


def drop_orphaned_sharing(model: torch.fx.GraphModule) -> list[str]:
    """Drop, until none is left, the annotations that share a quantization spec with a node or edge whose own
    annotation was dropped (``float32_annotations_only``, ``float_selection_inputs``); return their names.

    Cause. XNNPACK's quantizer annotates ops that keep their input's grid (a view, a cat, a slice) with a
    ``SharedQuantizationSpec`` pointing at their producer. When the producer's annotation is dropped, prepare
    looked the pointer up among the annotated nodes and failed: "KeyError: mul_20" (Mistral4Model int8, whose
    router's top-k input was kept in float). Such an op then stays in float too, as its producer does."""
    from torchao.quantization.pt2e.quantizer.quantizer import Q_ANNOTATION_KEY, SharedQuantizationSpec

    dropped: list[str] = []
    changed = True
    while changed:
        changed = False
        for node in model.graph.nodes:
            annotation = node.meta.get(Q_ANNOTATION_KEY)
            if annotation is None:
                continue
            specs = list((getattr(annotation, "input_qspec_map", None) or {}).values())
            specs.append(getattr(annotation, "output_qspec", None))
            if any(isinstance(q, SharedQuantizationSpec) and not _shared_target_annotated(q.edge_or_node, Q_ANNOTATION_KEY)
                   for q in specs):
                del node.meta[Q_ANNOTATION_KEY]
                dropped.append(node.name)
                changed = True
    return dropped


class IntegerSafeXNNPACKQuantizer(XNNPACKQuantizer):
    """XNNPACKQuantizer whose scalar conversion leaves integer nodes alone (see the module docstring),
    which leaves float64 nodes unannotated (``float32_annotations_only``) and keeps the scores a selection
    op chooses from in float (``float_selection_inputs``; their producers in ``float_for_selection``, with the
    ops that shared their grid, ``drop_orphaned_sharing``), and which leaves float a linear whose weight is a
    vector (``per_channel_needs_a_channel_axis``, in ``vector_weights``); every call of a convolution module called
    more than once is annotated (``separate_shared_conv_weights``); a ``.to()`` that changes nothing is taken out
    before annotation, so that it does not requantize (``fold_same_type_conversions``)."""

    float_for_selection: list[str] = []
    vector_weights: list[str] = []  # nodes left float: a per-channel observer on a 1-D tensor
    separated_conv_weights = 0  # weight / bias nodes given to a convolution that shared them (a module called twice)
    folded_conversions: list[str] = []  # same-type .to() nodes taken out before annotation

    def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        self.separated_conv_weights = separate_shared_conv_weights(model)
        self.folded_conversions = fold_same_type_conversions(model)
        return floating_scalars_to_attrs(model)

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        model = super().annotate(model)
        float32_annotations_only(model)
        self.vector_weights = per_channel_needs_a_channel_axis(model)
        self.float_for_selection = float_selection_inputs(model)
        self.float_for_selection += drop_orphaned_sharing(model)
        return model
