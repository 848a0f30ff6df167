"""ExecuTorch patches on the XNNPACK partitioner's constraints and its preprocess: which dynamic-shape
nodes it takes, and outputs that pass an input straight through.
"""

from __future__ import annotations

from typing import Any

import torch

from exporters.utils import register_patch


@register_patch("executorch", "executorch.backends.xnnpack.partition.config.node_configs.MaxDimConfig.check_constraints")
def _patch_max_dim_partition_constraints(original):
    """XNNPACK's partitioner takes every 4-D ``max.dim`` whose index output is unused, but its node
    visitor only lowers ``dim`` 2 or 3 with ``keepdim=True`` and raises otherwise, failing the whole
    lowering: "amax.default only supports dim == 2 or dim == 3" / "... keep_dim == True" (DeepseekV4's
    ``x.max(-1)``). Leave those to the portable kernel instead, which is what a partitioner
    constraint is for.

    before: max.dim(x4d, 1) partitioned to XNNPACK -> RuntimeError at to_backend
    after:  max.dim(x4d, 1) stays outside the delegate; max.dim(x4d, 3, True) is still delegated
    """

    def check_constraints(self, node, ep) -> bool:
        if not original(self, node, ep):
            return False
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        return dim in (2, 3) and len(node.args) == 3 and bool(keepdim)

    return check_constraints


def _symbolic_dims(node: Any) -> int:
    from torch.fx.experimental.symbolic_shapes import free_symbols

    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return sum(1 for d in val.shape if free_symbols(d)) if isinstance(val, torch.Tensor) else 0


@register_patch("executorch",
                "executorch.backends.xnnpack.partition.config.generic_node_configs.UnsqueezeCopyConfig.check_constraints")
def _patch_unsqueeze_dynamic_dims_constraint(original):
    """XNNPACK's partitioner takes a trailing ``unsqueeze_copy`` whatever its shape, but its node visitor
    lowers it as a static reshape that allows one dynamic dimension and raises otherwise, failing the
    whole lowering: "XNNPACK reshape only supports 1 dynamic dimension" (SwitchTransformers' router
    ``max(...).values.unsqueeze(-1)`` and Step3p7's gate over a dynamic batch and sequence). Leave an
    unsqueeze whose output has more than one symbolic dimension to the portable kernel.

    before: unsqueeze_copy(x[s0, s1], -1) partitioned to XNNPACK -> RuntimeError at to_backend
    after:  it runs outside the delegate; one with a single symbolic dimension is still delegated
    """

    def check_constraints(self, node, ep) -> bool:
        return original(self, node, ep) and _symbolic_dims(node) <= 1

    return check_constraints


@register_patch("executorch", "executorch.backends.xnnpack.partition.config.gemm_configs.ConvolutionConfig.check_constraints")
def _patch_conv1d_dynamic_dims_constraint(original):
    """XNNPACK runs a 1-D convolution as a 2-D one between an ``unsqueeze_copy`` and a ``squeeze_copy``
    that its Conv1dUnsqueezePass adds inside the delegate, and lowers both as static reshapes that
    allow one dynamic dimension: a conv1d over a dynamic batch and length fails the whole lowering
    ("XNNPACK reshape only supports 1 dynamic dimension": Wav2Vec2's conv feature encoder). Leave such
    a conv1d to the portable kernel; one with a single symbolic dimension is still delegated.

    before: convolution(x[s0, C, s1], w[O, C, K]) partitioned -> RuntimeError at to_backend
    after:  it runs outside the delegate
    """

    def check_constraints(self, node, ep) -> bool:
        if not original(self, node, ep):
            return False
        weight = node.args[1].meta.get("val") if isinstance(node.args[1], torch.fx.Node) else None
        if weight is None or weight.dim() != 3:
            return True
        return _symbolic_dims(node.args[0]) <= 1 and _symbolic_dims(node) <= 1

    return check_constraints


@register_patch("executorch", "executorch.backends.xnnpack.partition.config.node_configs.BatchNormConfig.check_constraints")
def _patch_batch_norm_1d_dynamic_dims_constraint(original):
    """XNNPACK lowers a BatchNorm it cannot fuse over a (N, C, L) input as a depthwise 1-D convolution
    (DecomposeBatchNorm), which then runs as a 2-D one between the static reshapes that allow one
    dynamic dimension (see the conv1d constraint above): FastSpeech2Conformer's BatchNorm1d after a
    conv1d kept out of the delegate, over a dynamic batch and a data-dependent length, failed the
    lowering ("XNNPACK reshape only supports 1 dynamic dimension"). Leave such a batch norm to the
    portable kernel; 4-D ones and those with one symbolic dimension are still delegated.

    before: batch_norm(x[s0, C, u0]) partitioned -> RuntimeError at to_backend
    after:  it runs outside the delegate
    """

    def check_constraints(self, node, ep) -> bool:
        if not original(self, node, ep):
            return False
        source = node.all_input_nodes[0]
        val = source.meta.get("val")
        return not (isinstance(val, torch.Tensor) and val.dim() <= 3 and _symbolic_dims(source) > 1)

    return check_constraints


@register_patch("executorch", "executorch.backends.xnnpack.partition.config.node_configs.PreluConfig.check_constraints")
def _patch_prelu_partition_constraints(original):
    """XNNPACK's partitioner takes a ``prelu`` of any rank, but its channels-last pass can only give it
    a 4-D (NHWC) input and fails the lowering otherwise: "ChannelsLastTaggedReshapePass ...
    Attempting to convert non-NHWC compatible node to NHWC" (DAB-DETR's encoder MLP, PReLU over
    (batch, tokens, hidden)). Leave a prelu that is not 4-D outside the delegate.

    before: prelu(x[2, 1, 64], w) partitioned to XNNPACK -> AssertionError at to_backend
    after:  it runs outside the delegate; a 4-D prelu is still delegated
    """

    def check_constraints(self, node, ep) -> bool:
        value = node.all_input_nodes[0].meta.get("val")
        return original(self, node, ep) and value is not None and value.dim() == 4

    return check_constraints


@register_patch("executorch", "executorch.backends.xnnpack.partition.config.xnnpack_config.XNNPartitionerConfig.check_common_constraints")
def _patch_xnnpack_rank_limit(original):
    """XNNPACK defines tensors of at most ``XNN_MAX_TENSOR_DIMS`` (6) dims, but its partitioner takes
    a view or permute of any rank; the program then lowers and fails to load: "XNNCompiler.cpp:
    Failed to define tensor 0 with code: xnn_status_unsupported_parameter", "Failed to load method
    forward, error: 0x1" (Inkling reshapes to 8 dims and permutes). Leave a node with an input or
    output of more dims than that outside the delegate, to the portable kernels.

    before: permute_copy(x[2, 2, 1, 1, 3, 1, 3, 3]) in an XNNPACK partition -> load error 0x1
    after:  it runs outside the delegate
    """
    from executorch.backends.xnnpack.utils.xnnpack_constants import XNN_MAX_TENSOR_DIMS

    def ranks(node):
        for value in [node.meta.get("val"), *(n.meta.get("val") for n in node.all_input_nodes)]:
            for v in value if isinstance(value, (tuple, list)) else [value]:
                if isinstance(v, torch.Tensor):
                    yield v.dim()

    def check_common_constraints(self, node, ep) -> bool:
        return original(self, node, ep) and max(ranks(node), default=0) <= XNN_MAX_TENSOR_DIMS

    return check_common_constraints


@register_patch("executorch", "executorch.backends.xnnpack.xnnpack_preprocess.generate_node_to_external_map")
def _patch_xnnpack_pass_through_outputs(original):
    """XNNPACK's own passes can leave a delegated partition returning one of its inputs unchanged (a
    permute pair cancelled, a no-op copy removed), or one value twice, and the delegate then refuses
    the whole lowering: "Output node 'aten_permute_copy_default_2' is already in the inputs. This is
    likely due to pass through arguments, which are not supported in XNNPACK Delegate" (Clvp,
    OneFormer). Give each such output its own copy (XNNPACK's clone) before the delegate maps its
    external values.

    before: partition(a) -> (a, f(a))          RuntimeError at to_backend
    after:  partition(a) -> (clone(a), f(a))
    """

    def generate_node_to_external_map(exported_program, graph_module):
        from executorch.exir.dialects._ops import ops as exir_ops

        graph = graph_module.graph
        output = next(n for n in graph.nodes if n.op == "output")
        placeholders = {n for n in graph.nodes if n.op == "placeholder"}
        seen, values, copied = set(), [], False
        for value in output.args[0]:
            if isinstance(value, torch.fx.Node) and (value in placeholders or value in seen):
                with graph.inserting_before(output):
                    copy = graph.call_function(exir_ops.edge.aten.clone.default, (value,))
                copy.meta.update({k: v for k, v in value.meta.items() if k in ("val", "tensor_meta")})
                value, copied = copy, True
            seen.add(value)
            values.append(value)
        if copied:
            output.args = (type(output.args[0])(values), *output.args[1:])
            graph_module.recompile()
        return original(exported_program, graph_module)

    return generate_node_to_external_map
