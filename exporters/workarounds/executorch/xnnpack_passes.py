"""ExecuTorch patches on XNNPACK's own graph passes, which its preprocess runs on each delegated
partition (executorch.backends.xnnpack._passes): where one writes a partition that XNNPACK's compiler
then refuses, fails on a graph the partitioner accepted, or computes another function (a softmax run in
NHWC).
"""

from __future__ import annotations

import torch

from exporters.utils import ActedFlag, register_patch


@register_patch("executorch", "executorch.backends.xnnpack._passes.insert_pad_qdq.InsertPadQDQPass.call")
def _patch_pad_requantized_only_from_int8(original):
    """XNNPACK's InsertPadQDQPass puts an implicit quantize/dequantize pair after a zero
    ``constant_pad_nd`` whose input is a dequantize, so that the pad runs on int8. It does not ask
    whether that dequantize is fused (tagged implicit), that is whether the pad reads int8 at all.
    The partitioner fuses it only into a quantized pattern, which a pad never is (its config is float
    only), so the pad read float and wrote int8, and XNNPACK's compiler refused the program at load:
    "Failed to create StaticConstantPad node 555 with code: xnn_status_invalid_parameter" (int8
    Qwen3_5Model, Qwen3NextModel, Nemotron3_5TranscribeModel, MiniCPMV4_7, Swin2SR). Undo the pair where
    the pad's dequantize is not fused; where it is, the pass's pair stays.

    before: dq (not fused) -> pad -> q' -> dq' -> ...    load error 0x1
    after:  dq (not fused) -> pad -> ...                 (float pad, as the partition computes it)
    """
    from executorch.backends.xnnpack.utils.quant_utils import is_dequant, is_quant, is_tagged_as_implicit_q_dq
    from executorch.exir.dialects._ops import ops as exir_ops

    acted = ActedFlag()

    def call(self, graph_module):
        result = original(self, graph_module)
        graph, undone = result.graph_module.graph, False
        for pad in list(graph.nodes):
            if pad.op != "call_function" or pad.target != exir_ops.edge.aten.constant_pad_nd.default:
                continue
            source = pad.args[0]
            if not (isinstance(source, torch.fx.Node) and is_dequant(source)) or is_tagged_as_implicit_q_dq(source):
                continue
            for q in [u for u in pad.users if is_quant(u) and is_tagged_as_implicit_q_dq(u)]:
                for dq in [u for u in q.users if is_dequant(u) and is_tagged_as_implicit_q_dq(u)]:
                    dq.replace_all_uses_with(pad)
                    graph.erase_node(dq)
                if not q.users:
                    graph.erase_node(q)
                    undone = True
        if undone:
            acted.set()
            result.graph_module.recompile()
        return result

    call.acted = acted  # fired only when a pair was undone
    return call


def _scalar_placeholder_behind(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a dequantize of a quantize of a 0-dim placeholder (a lifted scalar constant)."""
    from executorch.backends.xnnpack.utils.quant_utils import is_dequant

    if not (is_dequant(node) and node.all_input_nodes):
        return False
    quantize = node.args[0]
    source = quantize.args[0] if isinstance(quantize, torch.fx.Node) and quantize.all_input_nodes else None
    val = source.meta.get("val") if isinstance(source, torch.fx.Node) and source.op == "placeholder" else None
    return isinstance(val, torch.Tensor) and val.dim() == 0


@register_patch("executorch",
                "executorch.backends.xnnpack._passes.channels_last_tagged_reshape_pass.ChannelsLastTaggedReshapePass.is_nhwc_node",
                "executorch.backends.xnnpack._passes.channels_last_tagged_reshape_pass.ChannelsLastTaggedReshapePass.is_nchw_node")
def _patch_channels_last_scalar_placeholder(original):
    """XNNPACK's ChannelsLastTaggedReshapePass asks of a dequantized placeholder whether it is NHWC by
    indexing its value (``meta["val"][0]``), which a 0-dim placeholder (a scalar constant that int8
    quantized, lifted into the program) cannot take, and the whole lowering failed: "An error occurred
    when running the 'ChannelsLastTaggedReshapePass' pass", "IndexError: invalid index of a 0-dim
    tensor" (int8 RTDetrModel, Deimv2Model). A scalar has no memory format: it is not NHWC, and it
    is NCHW in the pass's sense (nothing to convert); every other node is asked as before.

    before: is_nhwc_node(dq(q(scalar placeholder)))  IndexError
    after:  False (is_nchw_node: True)
    """
    answer = original.__name__ == "is_nchw_node"
    acted = ActedFlag()

    def is_node(node):
        if _scalar_placeholder_behind(node):
            acted.set()
            return answer
        return original(node)

    is_node.acted = acted  # fired only for a scalar placeholder
    return is_node


@register_patch("executorch",
                "executorch.backends.xnnpack._passes.channels_last_tagged_reshape_pass.ChannelsLastTaggedReshapePass"
                ".create_call_function_node")
def _patch_channels_last_copies_carry_val(original):
    """XNNPACK's ChannelsLastTaggedReshapePass creates its memory-format copies (and the quantize /
    dequantize pairs around them, which copy the copy's meta) without ``meta["val"]``, relying on the
    re-trace after the pass; but within the pass, where a dequantized NHWC tensor feeds both an op that
    needs NCHW and the graph's output, ``replace_all_uses_with`` rewires the output to the new dequantize,
    and the output branch then reads its ``val``: "KeyError: 'val'" (int8 ZoeDepthForDepthEstimation and
    MaskFormerForInstanceSegmentation on executorch). Each copy the pass creates gets the value
    ``_to_copy`` gives on its input's value (a fake tensor in the new memory format), as the re-trace
    would; the pass then copies that meta to the quantize / dequantize pair it puts after the copy (their
    dtype is not what the check reads: it asks the dim order only). Copies of an input without a value
    are left as before.

    before: copy = _to_copy(x, memory_format=...)         meta: {}   (q, dq after it: meta of the copy)
    after:  copy.meta["val"] = _to_copy(x.val, memory_format=...)
    """
    from executorch.exir.dialects._ops import ops as exir_ops

    acted = ActedFlag()
    copy_op = exir_ops.edge.aten._to_copy.default

    def create_call_function_node(self, graph_module, target, args, memory_format=None):
        node = original(self, graph_module, target, args, memory_format)
        source = args[0] if target == copy_op and args and isinstance(args[0], torch.fx.Node) else None
        if source is not None and isinstance(source.meta.get("val"), torch.Tensor) and "val" not in node.meta:
            node.meta["val"] = target(source.meta["val"], **node.kwargs)
            acted.set()
        return node

    create_call_function_node.acted = acted  # fired when a created node got its value
    return create_call_function_node


@register_patch("executorch",
                "executorch.backends.xnnpack._passes.channels_last_tagged_reshape_pass.ChannelsLastTaggedReshapePass"
                ".requires_nchw_inputs")
def _patch_channels_last_softmax(original):
    """XNNPACK's ChannelsLastTaggedReshapePass runs a node it does not list as needing one layout in the layout of
    its inputs, and a softmax whose input it had made NHWC then ran in NHWC: XNNPACK's softmax normalizes the
    innermost dimension of the tensor it is given, which is C there, while the program asks for the last
    dimension of the NCHW tensor, W (the softmax visitor, unlike cat's, permute's or slice's, does not map its
    dimension into NHWC). Int8 Musicgen's T5 text encoder: the relative position bias, a constant PT2E folded from
    ``values.permute([2, 0, 1]).unsqueeze(0)`` and so stored channels-last, was marked NHWC, the attention scores
    it is added to followed, and the softmax normalized over the 4 heads instead of the 7 keys
    (encoder_last_hidden_state 60 quantization steps off the reference, the cross-attention cache 82; the
    encoder exported alone, whose bias is computed at run time, matches it exactly). A softmax takes NCHW inputs,
    as a linear does.

    before: softmax(add(scores, bias_nhwc), -1) -> transpose to NHWC, XNNSoftmax over C, transpose back
    after:  the softmax's input is NCHW (a transpose back where it was NHWC); XNNSoftmax over W
    """
    from executorch.exir.dialects._ops import ops as exir_ops

    softmax = exir_ops.edge.aten._softmax.default
    acted = ActedFlag()

    def requires_nchw_inputs(self, node) -> bool:
        if node.target == softmax:
            if any(self.is_nhwc_node(n) for n in node.all_input_nodes):
                acted.set()
            return True
        return original(self, node)

    requires_nchw_inputs.acted = acted  # fired when a softmax's input was NHWC
    return requires_nchw_inputs


def _users_already_laid_out(before: torch.fx.Node, after: torch.fx.Node, copy: torch.fx.Node) -> list[torch.fx.Node]:
    """The users of ``before`` other than ``after`` and ``copy`` that stand before ``after`` in the graph: the
    pass walks the graph in order, so it has already chosen their input's memory format (``before``'s own)."""
    position = {node: i for i, node in enumerate(before.graph.nodes)}
    return [user for user in before.users
            if user is not after and user is not copy and user.op != "output" and position[user] < position[after]]


@register_patch("executorch",
                "executorch.backends.xnnpack._passes.channels_last_tagged_reshape_pass.ChannelsLastTaggedReshapePass"
                ".insert_copy_q_dq")
def _patch_channels_last_copy_for_its_target_only(original):
    """XNNPACK's ChannelsLastTaggedReshapePass converts a dequantized tensor to the other memory format for one
    node (``after``) as ``dq -> copy -> q' -> dq'``, marks ``dq`` implicit (the copy reads int8) and moves every
    user of ``dq`` to ``dq'`` (``replace_all_uses_with``), including the users it has already laid out in
    ``dq``'s format. Those then read the other format under their old tag. In int8 SuperPoint and SuperGlue the
    encoder's last NHWC convolution feeds the partition's output (NCHW: the copy) and two ``slice_copy`` (batch
    0 and 1, from ``unbind``), tagged NHWC before the output was reached: each slice then read the NCHW copy as
    NHWC, sliced sizes (1, 4, 4, 16) out of (2, 16, 4, 4), and the run failed: "Attempted to resize a static
    tensor. Expected shape (1, 16, 4, 4), but received (1, 4, 4, 4)", "CALL_DELEGATE execute failed". The fp32
    program has no quantize pair there and the pass rewires only ``after``. Give the users already laid out a
    dequantize of their own (the same quantize, not implicit where ``dq`` was not), so that only the rest move.

    before: q -> dq -> {slice (NHWC, laid out), output}  ->  q -> dq(implicit) -> copy -> q' -> dq' -> {slice, output}
    after:                                               ->  q -> dq2 -> slice ;  q -> dq(implicit) -> copy -> q' -> dq' -> output
    """
    acted = ActedFlag()

    def insert_copy_q_dq(self, graph_module, before, after, copy, q_params):
        laid_out = _users_already_laid_out(before, after, copy)
        if laid_out:
            with graph_module.graph.inserting_after(before):
                own = graph_module.graph.create_node("call_function", before.target, before.args, dict(before.kwargs))
            own.meta = dict(before.meta)
            for user in laid_out:
                user.replace_input_with(before, own)
            acted.set()
        return original(self, graph_module, before, after, copy, q_params)

    insert_copy_q_dq.acted = acted  # fired when users kept the format they were laid out in
    return insert_copy_q_dq
