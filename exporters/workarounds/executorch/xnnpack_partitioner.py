"""ExecuTorch patches on the XNNPACK partitioner's constraints and its preprocess: which dynamic-shape
nodes it takes, and outputs that pass an input straight through.
"""

from __future__ import annotations

from typing import Any

import torch

from exporters.utils import ActedFlag, register_patch


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

    The same pass puts a quantize-dequantize pair between a quantized 2-D convolution and its squeeze only where
    every user of the convolution quantizes, with the grid of the first: where a user does not (int8 Mimi's and
    PocketTTS's codec convolution feeding a slice) or quantizes on another grid, the squeeze is asked to change
    the grid, which XNNPACK refuses at load ("Failed to create squeeze node 65535 with code:
    xnn_status_invalid_parameter"). Leave a conv1d over dequantized values out unless its users all quantize on
    one grid. The users counted are those the pass sees: XNNPACK's FuseActivationPass, which runs first, folds a
    relu or hardtanh that is the convolution's only user into it, so the activation's users are the convolution's
    (PT2E quantizes a conv-relu pair after the relu only: int8 FastSpeech2Conformer's feed-forward conv1d, whose
    relu was counted as a user that does not quantize; kept out, the relu was delegated alone between the float
    convolution and its quantize, a clamp XNNPACK refuses at load: "XNN Runtime creation failed with code:
    xnn_status_unsupported_parameter").

    before: convolution(x[s0, C, s1], w[O, C, K]) partitioned -> RuntimeError at to_backend
            slice(conv1d(dq(x), dq(w))) partitioned -> load error 0x1
    after:  it runs outside the delegate; q(relu(conv1d(dq(x), dq(w)))) is still delegated
    """
    from executorch.backends.xnnpack._passes.fuse_activation_pass import FuseActivationPass
    from executorch.backends.xnnpack.utils.quant_utils import is_dequant, is_quant

    def check_constraints(self, node, ep) -> bool:
        if not original(self, node, ep):
            return False
        weight = node.args[1].meta.get("val") if isinstance(node.args[1], torch.fx.Node) else None
        if weight is None or weight.dim() != 3:
            return True
        if is_dequant(node.args[0]):  # quantized: the squeeze after it gets one grid, its users' (see above)
            users = list(node.users)
            if len(users) == 1 and getattr(users[0], "target", None) in FuseActivationPass.FUSEABLE_ACTIVATIONS:
                users = list(users[0].users)  # fused into the convolution before the squeeze is added
            if not all(is_quant(user) for user in users) or len({_grid(user) for user in users}) > 1:
                return False
        return _symbolic_dims(node.args[0]) <= 1 and _symbolic_dims(node) <= 1

    return check_constraints


@register_patch("executorch", "executorch.backends.xnnpack.partition.config.node_configs.BatchNormConfig.check_constraints")
def _patch_batch_norm_1d_dynamic_dims_constraint(original):
    """XNNPACK lowers a BatchNorm it cannot fuse as a depthwise convolution (DecomposeBatchNorm). Two
    such batch norms it cannot lower, left to the portable kernel here:

    - over a (N, C, L) input the convolution runs as a 2-D one between the static reshapes that allow
      one dynamic dimension (see the conv1d constraint above): FastSpeech2Conformer's BatchNorm1d after a
      conv1d kept out of the delegate, over a dynamic batch and a data-dependent length, failed the
      lowering ("XNNPACK reshape only supports 1 dynamic dimension"); 4-D ones and those with one
      symbolic dimension are still delegated;
    - over a dequantized input (int8 activations; PT2E folds only a batch norm that follows a
      convolution, so a standalone one keeps its float statistics) the convolution has float weights
      beside a quantized input, which XNNPACK's convolution refuses: "Weight and Input should both be
      quantized" (int8 PatchTSTForClassification, whose encoder normalizes with BatchNorm1d).

    before: batch_norm(x[s0, C, u0]) / batch_norm(dequantize(q)) partitioned -> RuntimeError at to_backend
    after:  it runs outside the delegate
    """
    from executorch.backends.xnnpack.utils.quant_utils import is_dequant

    acted = ActedFlag()

    def check_constraints(self, node, ep) -> bool:
        if not original(self, node, ep):
            return False
        source = node.all_input_nodes[0]
        val = source.meta.get("val")
        if (isinstance(val, torch.Tensor) and val.dim() <= 3 and _symbolic_dims(source) > 1) or is_dequant(source):
            acted.set()
            return False
        return True

    check_constraints.acted = acted  # fired when a batch norm is kept out
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


def _grid(node: torch.fx.Node) -> tuple:
    """A per-tensor quantize's or dequantize's (scale, zero point)."""
    return tuple(node.args[1:3])


# the ops XNNPACK runs on quantized values only on one grid, their inputs' and output's: the static reshapes
# (XNNStaticReshape) and concatenation
_ONE_GRID = ("aten.view_copy.default", "aten.squeeze_copy.dim", "aten.squeeze_copy.dims",
             "aten.unsqueeze_copy.default", "aten.cat.default")


def _regrids(node: torch.fx.Node) -> bool:
    """Whether ``node``, one of ``_ONE_GRID`` between dequantizes and quantizes, is asked to change the grid: an
    input dequantized with other (scale, zero point) than another input or a quantize of its output."""
    from executorch.backends.xnnpack.utils.quant_utils import is_dequant, is_quant

    if getattr(getattr(node, "target", None), "__name__", None) not in _ONE_GRID:  # edge ops' "aten.<op>.<overload>"
        return False
    first = node.args[0] if node.args else None
    sources = [n for n in (first if isinstance(first, (list, tuple)) else [first]) if isinstance(n, torch.fx.Node)]
    grids = {_grid(n) for n in sources if is_dequant(n)} | {_grid(user) for user in node.users if is_quant(user)}
    return len(grids) > 1


@register_patch("executorch", "executorch.backends.xnnpack.partition.config.xnnpack_config.XNNPartitionerConfig.check_common_constraints")
def _patch_xnnpack_rank_limit(original):
    """Two limits of XNNPACK's runtime that its partitioner does not check; a node past either is left outside
    the delegate, to the portable kernels.

    - XNNPACK defines tensors of at most ``XNN_MAX_TENSOR_DIMS`` (6) dims, but its partitioner takes a view or
      permute of any rank; the program then lowers and fails to load: "XNNCompiler.cpp: Failed to define tensor 0
      with code: xnn_status_unsupported_parameter", "Failed to load method forward, error: 0x1" (Inkling reshapes
      to 8 dims and permutes).
    - A static reshape (view, squeeze, unsqueeze) or a concatenation of quantized values keeps their grid: XNNPACK
      refuses one whose inputs and output are quantized with other scales or zero points, at load ("Failed to
      create squeeze node 333 with code: xnn_status_invalid_parameter", "Failed to create cat2 node 1285 ...",
      "Failed to load method forward, error: 0x1"). PT2E leaves such an op between its producers' dequantizes and
      its consumer's input quantize, and the grids differ where the observers saw other values: int8 Inkling2's
      unsqueeze, dequantized at scale 2e-3 and quantized at 1.3e36 (an observer beside the attention mask's
      finfo.min fill); int8 D-FINE's concatenation.

    before: permute_copy(x[2, 2, 1, 1, 3, 1, 3, 3]) in an XNNPACK partition -> load error 0x1
            q(unsqueeze_copy(dq(x, 2e-3, 8)), 1.3e36, 127) in an XNNPACK partition -> load error 0x1
            q(cat([dq(a, s1, z1), dq(b, s2, z2)]), s3, z3), not all grids one, likewise
    after:  each runs outside the delegate
    """
    from executorch.backends.xnnpack.utils.xnnpack_constants import XNN_MAX_TENSOR_DIMS

    def ranks(node):
        for value in [node.meta.get("val"), *(n.meta.get("val") for n in node.all_input_nodes)]:
            for v in value if isinstance(value, (tuple, list)) else [value]:
                if isinstance(v, torch.Tensor):
                    yield v.dim()

    def check_common_constraints(self, node, ep) -> bool:
        return original(self, node, ep) and max(ranks(node), default=0) <= XNN_MAX_TENSOR_DIMS and not _regrids(node)

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


@register_patch("executorch", "executorch.exir.program._program.EdgeProgramManager.to_backend")
def _patch_dequantize_per_user(original):
    """XNNPACK fuses a dequantize into the op that reads it when that op is a quantized pattern
    (``dq -> op -> q``), tagging the dequantize node itself; every other user of that node then reads
    the int8 tensor too. PT2E's convert gives each user its own dequantize, but the edge lowering's
    decompositions can split one user into several (a ``chunk`` or ``split`` becomes one
    ``slice_copy`` per piece). Where one piece feeds a quantize and another a float op (rotate-half's
    ``neg``), XNNPACK defined a static slice with an int8 input and a float output and refused the
    program at load: "Failed to create static slice node 247 with code: xnn_status_invalid_parameter",
    "Failed to load method forward, error: 0x1" (int8 Gemma4Model, rotary embeddings). Before the
    partitioners run (they may not change the graph), give each user of a shared static per-tensor
    dequantize its own copy, as PT2E's convert left it, where some users are quantized patterns and
    some are not (where all users read the same dtype, sharing is harmless and the graph is left as
    it is: copying there too changed int8 InklingModel's partitions, and its unbacked-size asserts
    then landed after the output node). The dynamic-quantization chain (scales computed in the
    graph) is left as is. A program without quantize ops has nothing to change.

    before: dq -> slice_a -> q ; dq -> slice_b -> neg     load error 0x1
    after:  dq -> slice_a -> q ; dq' -> slice_b -> neg    (dq' converts to float where it is)
    """
    acted = ActedFlag()

    def to_backend(self, partitioner):
        for program in self._edge_programs.values():
            if _dequantize_per_user(program.graph_module):
                acted.set()
        return original(self, partitioner)

    to_backend.acted = acted  # fired only when a dequantize was shared
    return to_backend


def _quantized_pattern(node: torch.fx.Node) -> bool:
    """Whether XNNPACK's partitioner can take ``node`` as ``dq -> node -> q`` (and fuse its dequantizes)."""
    from executorch.backends.xnnpack.utils.quant_utils import is_dequant, is_quant

    return (node.op == "call_function" and bool(node.all_input_nodes)
            and all(is_dequant(n) for n in node.all_input_nodes)
            and len(node.users) == 1 and is_quant(next(iter(node.users))))


def _dequantize_per_user(gm: torch.fx.GraphModule) -> bool:
    from executorch.exir.dialects._ops import ops as exir_ops

    target = exir_ops.edge.quantized_decomposed.dequantize_per_tensor.default
    graph, changed = gm.graph, False
    for node in list(graph.nodes):
        static = node.op == "call_function" and node.target == target and not any(
            isinstance(a, torch.fx.Node) for a in node.args[1:])
        if not static or len(node.users) < 2:
            continue
        patterns = [_quantized_pattern(user) for user in node.users]
        if all(patterns) or not any(patterns):  # every user reads the same dtype: sharing is harmless
            continue
        users = sorted(node.users, key=lambda u: u.op != "output")  # the output keeps the named node
        for user in users[1:]:
            with graph.inserting_before(user):
                copy = graph.call_function(node.target, node.args, node.kwargs)
            copy.meta = dict(node.meta)
            user.replace_input_with(node, copy)
        changed = True
    if changed:
        gm.recompile()
    return changed


@register_patch("executorch",
                "executorch.backends.xnnpack.partition.config.generic_node_configs.PermuteConfig.check_constraints",
                "executorch.backends.xnnpack.partition.config.generic_node_configs.MaxPool2dConfig.check_constraints")
def _patch_requantizing_data_movement(original):
    """XNNPACK's transpose and max-pooling move int8 values without rescaling them, so its compiler
    refuses one whose input and output quantization differ. The partitioner checks this for
    ``slice_copy`` only and takes a ``dq -> permute/max_pool2d -> q`` pattern with any two scales; the
    program lowers and then fails to load: "Failed to create static transpose node 297 with code:
    xnn_status_invalid_parameter" (int8 DiffusionGemmaModel, the permute's q shared with a cat),
    "Failed to create maxpool2d node 623 ..." (int8 Sam3VisionModel). Apply the slice's rule to them:
    such a node stays outside the delegate and runs in float between its dequantize and quantize,
    which is what the quantized reference computes.

    before: dq(s=0.0184) -> permute -> q(s=0.0186) partitioned   load error 0x1
    after:  it runs outside the delegate; one with equal parameters is still delegated
    """
    from executorch.backends.xnnpack.partition.config.generic_node_configs import _q_dq_quantization_params_match
    from executorch.backends.xnnpack.utils.quant_utils import is_dequant, is_quant

    acted = ActedFlag()

    def check_constraints(self, node, ep) -> bool:
        if not original(self, node, ep):
            return False
        source = node.all_input_nodes[0] if node.all_input_nodes else None
        if source is None or not is_dequant(source) or len(node.users) != 1:
            return True
        user = next(iter(node.users))
        if not is_quant(user) or _q_dq_quantization_params_match(source, user, ep):
            return True
        acted.set()
        return False

    check_constraints.acted = acted  # fired only when it kept a node out
    return check_constraints


def _neighbourhood(node: torch.fx.Node, hops: int = 3) -> set[torch.fx.Node]:
    """The nodes within ``hops`` edges of ``node``, either way: where a GEMM's q/dq dependencies lie (weight
    q -> dq, bias, activation dq, fused activation -> q)."""
    seen, frontier = {node}, {node}
    for _ in range(hops):
        frontier = {n for f in frontier for n in (*f.all_input_nodes, *f.users)} - seen
        seen |= frontier
    return seen


@register_patch("executorch", "executorch.backends.xnnpack.partition.config.gemm_configs.GEMMConfig.get_deps")
def _patch_rejected_gemm_leaves_its_quantizes_explicit(original):
    """XNNPACK's GEMM configs (linear, mm, addmm, convolution) tag every quantize / dequantize of a GEMM's pattern
    as implicit (fused into the GEMM: XNNPACK defines no convert for it) before they know whether the pattern is
    valid, and keep the tags when it is not. The GEMM then stays out of the delegate, and its output quantize, still
    tagged, is partitioned alone (QuantizedPerTensorConfig) and defined as nothing: the delegate never writes its
    output, and the runtime reads whatever the memory plan left in that buffer. int8 FlavaForPreTraining's
    contrastive logits: mm(normalized text embeddings, float, dq(image embeddings).T) is refused (a float
    activation), its q(mm) partition returned the bytes of an earlier (32, 2) int8 transpose, [37, 47, -13, -6]
    for [91, -19, -15, -13], and contrastive_logits_per_image / _per_text were 153 / 253 steps off. Where the
    dependencies are not valid, the tags this call added are taken back (tags set before it stay).

    before: mm(float, dq(w)) refused; q(mm) tagged implicit -> a partition with no node, its output never written
    after:  q(mm) explicit -> XNNPACK's convert, f32 -> int8
    """
    from executorch.backends.xnnpack.utils.quant_utils import IS_IMPLICIT_Q_DQ_TAG, is_tagged_as_implicit_q_dq

    acted = ActedFlag()

    def get_deps(self, node, ep):
        tagged_before = {n for n in _neighbourhood(node) if is_tagged_as_implicit_q_dq(n)}
        valid, deps = original(self, node, ep)
        if not valid:
            for dep in deps:
                if dep not in tagged_before and is_tagged_as_implicit_q_dq(dep):
                    del dep.meta[IS_IMPLICIT_Q_DQ_TAG]
                    acted.set()
        return valid, deps

    get_deps.acted = acted  # fired when a refused GEMM's tags were taken back
    return get_deps


def _static_bias_grid(tensor: torch.fx.Node, quant_params: Any) -> tuple | None:
    """The int32 grid XNNPACK quantizes a static GEMM's bias to (its scale, weight scale x input scale, per
    channel or not); None for any other tensor."""
    if quant_params is None or quant_params.is_dynamic or quant_params.dtype != torch.int32:
        return None
    if quant_params.q_input is not tensor:
        return None
    scale = quant_params.scale
    return tuple(scale.flatten().tolist()) if isinstance(scale, torch.Tensor) else (float(scale),)


_BIAS_GRID = "exporters_xnnpack_bias_grid"  # node.meta: (id of the vals_to_ids it was defined in, its grid)


@register_patch("executorch", "executorch.backends.xnnpack.operators.node_visitor.NodeVisitor.define_tensor")
def _patch_shared_bias_defined_per_grid(original):
    """XNNPACK's node visitors define each graph value once per delegate (``if tensor in vals_to_ids: return``).
    A static quantized GEMM's bias is defined as int32 on the grid of weight scale x input scale, so where one
    bias parameter is read by several GEMMs of one partition whose inputs (or weights) are quantized on other
    grids, every GEMM after the first gets the first one's int32 values, read on its own grid: its bias is scaled by
    the ratio of the input scales. int8 VideomtForUniversalSegmentation runs its upscale block and mask head once per
    frame with the same parameters, and one partition takes the four frames' transposed convolutions (input scales
    0.0278, 0.0241, 0.0251, 0.0266): masks_queries_logits was 17 quantization steps off its reference, frame 1's
    masks +3.5 steps on average. Standalone, two linears sharing a bias on inputs about 4x apart: the second 199
    steps off in one partition, 0 in per-op partitions (tests/test_executorch_patches.py). Define the bias again,
    as its own tensor, for each grid it is asked for; a bias asked for on the grid it was defined on is still shared.

    before: linear(dq(x, s1), w, b), linear(dq(y, s2), w, b) in one partition -> both read int32 b / (w_s * s1)
    after:  the second reads its own int32 b / (w_s * s2)
    """
    acted = ActedFlag()

    def define_tensor(self, tensor, xnn_graph, vals_to_ids, convert_to_nhwc=False, swap_in_out_for_weights=False,
                      quant_params=None, **kwargs):
        grid = _static_bias_grid(tensor, quant_params)
        defined = tensor.meta.get(_BIAS_GRID) if grid is not None else None
        if tensor in vals_to_ids and defined is not None and defined[0] == id(vals_to_ids) and defined[1] != grid:
            del vals_to_ids[tensor]  # the GEMM that asks next reads vals_to_ids[bias]: this grid's tensor
            acted.set()
        result = original(self, tensor, xnn_graph, vals_to_ids, convert_to_nhwc, swap_in_out_for_weights,
                          quant_params, **kwargs)
        if grid is not None:
            tensor.meta[_BIAS_GRID] = (id(vals_to_ids), grid)
        return result

    define_tensor.acted = acted  # fired only when a bias was defined again for another grid
    return define_tensor
