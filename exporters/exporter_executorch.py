"""ExecutorchExporter: torch.export, lowered with to_edge_transform_and_lower + to_executorch,
run in the ExecuTorch runtime. Five stages around the lowering."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import operator
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols, statically_known_true

from .base import Artifact, ExportConfig, Exporter, run_stage
from .constant_scalars import fold_input_independent_scalars
from .exporter_dynamo import _finite, shape_arithmetic_patches, trace
from .unbacked_bounds import source_bounds
from .utils import (FiredLog, NewNodes, apply_fx_node_fixes, apply_fx_program_fixes, apply_patches, copy_source_meta,
                    fake_val, register_fx_node_fix, register_patch, replace_node, replace_unpacked)

# "executorch" patches on these paths are ExecuTorch patches (stage 3, installed around lowering):
# ExecuTorch's internals, and the torch function its delegation calls once per partition program;
# the others are torch patches (stage 2, installed around torch.export).
_EXECUTORCH_INTERNALS = ("executorch.", "torch.export.exported_program._convert_guards_to_code")

# Fixes the export loop applies itself, as a retry, when a lowering fails or its memory plan passes
# the budget. No registry holds them (each needs the traced program, its inputs or the plan), so they
# are named here: the inventory lists them and the report counts them as registered workarounds.
LOWERING_RETRIES: dict[str, str] = {
    "fix:executorch:exact_bounds_to_fit_memory":
        "a plan past the memory budget whose interval bounds far exceed the sizes' true maxima is "
        "lowered again planning every size at its true maximum",
    "fix:executorch:bounds_halved_to_fit_memory":
        "a plan past the memory budget is exported again with max_dim halved, never below a traced size",
    "fix:executorch:per_op_partitions_on_cycle":
        "XNNPACK partitions that depend on each other both ways are lowered again one op a partition",
    "fix:executorch:fold_input_independent_scalars":
        "a data-dependent scalar no input can change is folded to the int it takes on the traced inputs",
    "fix:executorch:bound_unbacked_sizes_by_trace":
        "a data-dependent size without an upper bound is bounded by its value on the traced inputs",
    "fix:executorch:bound_unbacked_sizes_by_source":
        "a data-dependent size whose values follow from the program's shapes is bounded by that source",
}


@dataclasses.dataclass
class ExecutorchConfig(ExportConfig):
    backend: str = "xnnpack"  # a key of _BACKEND_PREPARE
    max_dim: int = 64  # ExecuTorch plans memory for the upper bound of every dynamic dim
    # a dynamic program planning more memory than this (MiB) is lowered again with exact size bounds
    # where interval arithmetic overshot (exact_share), then, while still past it, exported again with
    # every dim max_dim bounds bounded by half as much, down to the largest traced size (halved_max_dim)
    memory_budget_mb: int = 8192


# ── Stage 1: Backend preparation ─────────────────────────────────────────────
# Move the model to the target device and dtype and pick its partitioners. Add a backend by
# registering ``prepare_for_<name>(model, inputs) -> (model, inputs, partitioners)`` in _BACKEND_PREPARE.


def prepare_for_xnnpack(model: torch.nn.Module, inputs: dict[str, Any]):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    # float32 for the real floating tensors only: Module.to(dtype=torch.float32) also casts complex
    # parameters and buffers to their real part, in place (Llama4's vision freqs_ci lost its imaginary
    # half before tracing); complex ones are rewritten as real pairs later (complex_as_real)
    model = model.to(device="cpu")._apply(lambda t: t.float() if t.is_floating_point() else t)
    inputs = {k: v.to("cpu") if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    return model, inputs, [XnnpackPartitioner()]


def prepare_for_cuda(model: torch.nn.Module, inputs: dict[str, Any]):
    if not torch.cuda.is_available():
        raise RuntimeError(
            "ExecutorchConfig(backend='cuda') needs a CUDA device, and torch.cuda.is_available() is False "
            "on this machine (use backend='xnnpack' for CPU)"
        )
    from executorch.backends.cuda.cuda_partitioner import CudaPartitioner

    model = model.to(device="cuda")
    inputs = {k: v.to("cuda") if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    return model, inputs, [CudaPartitioner([])]


_BACKEND_PREPARE: dict[str, Callable] = {"xnnpack": prepare_for_xnnpack, "cuda": prepare_for_cuda}


def bound_dynamic_shapes(spec: Any, max_dim: int) -> Any:
    """ExecuTorch plans memory for each dynamic dim's upper bound, and bounds must be known when
    torch.export runs (editing the program's range constraints afterwards does not reach memory
    planning). Give every unbounded ``Dim`` / ``Dim.AUTO`` in an explicit ``dynamic_shapes`` the
    upper bound ``max_dim``; derived dims follow their root.

    before: {"x": {0: Dim("n", min=2)}}    after: {"x": {0: Dim("n", min=2, max=max_dim)}}
    """
    from torch.export import Dim
    from torch.export.dynamic_shapes import _DimHint

    if isinstance(spec, dict):
        return {k: bound_dynamic_shapes(v, max_dim) for k, v in spec.items()}
    if isinstance(spec, (list, tuple)):
        return type(spec)(bound_dynamic_shapes(v, max_dim) for v in spec)
    if type(spec) is Dim and not _finite(spec.max):
        return Dim(spec.__name__, min=spec.min, max=max(max_dim, spec.min))
    if isinstance(spec, _DimHint) and spec.max is None:
        return Dim.AUTO(min=spec.min, max=max_dim) if spec.min is not None else Dim.AUTO(max=max_dim)
    return spec


# ── Stage 2: Torch patches ───────────────────────────────────────────────────
# Replace torch ops the backend rejects while torch.export traces: @register_patch("executorch", "torch.op").


# ── Stage 3: ExecuTorch patches ──────────────────────────────────────────────
# Replace ExecuTorch internals that crash on valid dynamic-shape graphs, installed around the
# lowering: @register_patch("executorch", "executorch.exir....").


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


def _check_nonzero_stride(stride: torch.SymInt) -> None:
    """Tell the shape environment a symbolic stride is >= 1. A stride is a product of sizes; when it
    is a monomial (``u0``, ``32*u0*u1``) and not zero, each size in it is >= 1 too, which is what
    lets ``32*u0 < 32`` be decided (``torch._check(32*u0 >= 1)`` alone does not refine ``u0``)."""
    expr, shape_env = stride.node.expr, stride.node.shape_env
    torch._check(stride >= 1, lambda: "0 in strides is not supported for ExecuTorch.")
    if expr.is_Symbol or expr.is_Mul:
        for symbol in expr.free_symbols:
            if shape_env.var_to_range[symbol].lower >= 0:  # a size, not an arbitrary integer
                torch._check(shape_env.create_symintnode(symbol, hint=None) >= 1)


# executorch.exir imports the function by name in four modules: patch each binding (the view-copy
# pass of to_executorch calls its own, which left Glm4v, Qwen3.5 and Cohere Compass failing there).
@register_patch("executorch", "executorch.exir.tensor.dim_order_from_stride",
                "executorch.exir.tensor_layout.dim_order_from_stride",
                "executorch.exir.emit._emitter.dim_order_from_stride",
                "executorch.exir.passes.replace_view_copy_with_view_pass.dim_order_from_stride")
def _patch_dim_order_positive_strides(original):
    """ExecuTorch orders a tensor's dims by sorting its strides. A data-dependent size (an unbacked
    symbol, e.g. the image tokens a VLM selects with a mask) makes strides like ``u0`` or ``32*u0``,
    and the sort then asks ``u0 < 1``, which torch cannot decide: "Could not guard on data-dependent
    expression u0 < 1" (Glm4v, Idefics3, Cosmos3Omni and other VLMs, static exports included).
    Strides are never negative and ExecuTorch already rejects a zero one, so tell the shape
    environment each symbolic stride is >= 1 before the sort; ``u0 < 1`` is then known false.

    Two strides that are equal but spelled differently get one spelling first: ExecuTorch's sort
    reads ``Max(1, u0)`` vs ``u0`` (a keepdim reduction over [1, C, u0], e.g. SuperPoint's
    ``normalize`` of the descriptors at its kept keypoints) as "smaller, since u0 % Max(1, u0) == 0
    and they may differ", and planned that output with dim order (1, 0, 2), which the portable
    sum kernel refuses at run time ("Check failed (tensor_is_default_or_channels_last_dim_order(out))").

    before: dim_order_from_stride((u0, 1)) -> GuardOnDataDependentSymNode
            dim_order_from_stride((Max(1, u0), u0, 1)) -> (1, 0, 2)
    after:  torch._check(u0 >= 1); dim_order_from_stride((u0, 1)) -> (0, 1)
            dim_order_from_stride((u0, u0, 1)) -> (0, 1, 2)
    A comparison that stays undecidable (``u0*(8//u0) < u0``) leaves that pair in row-major order.
    """

    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, guard_or_false, statically_known_true

    def one_spelling(stride):
        """``stride`` with each size known equal to an earlier one replaced by that earlier one."""
        seen: list = []
        for s in stride:
            same = next((t for t in seen if (isinstance(s, torch.SymInt) or isinstance(t, torch.SymInt))
                         and statically_known_true(s == t)), None)
            seen.append(s if same is None else same)
        return tuple(seen)

    def decided_order(stride, a: int, b: int) -> int:
        """-1 if dim a's stride is known to be larger, 1 if known smaller, 0 if undecidable."""
        return -1 if guard_or_false(stride[a] > stride[b]) else (1 if guard_or_false(stride[a] < stride[b]) else 0)

    def dim_order_from_stride(stride):
        for s in stride:
            if isinstance(s, torch.SymInt):
                _check_nonzero_stride(s)
        stride = one_spelling(stride)
        try:
            return original(stride)
        except GuardOnDataDependentSymNode:
            # still undecidable (u0*(8//u0) < u0): a pair whose order cannot be decided keeps its
            # place, i.e. row-major, the layout torch gives data-dependent outputs; a wrong guess
            # shows up as a parity failure, not a silent pass
            by_stride = functools.cmp_to_key(lambda a, b: decided_order(stride, a, b))
            return tuple(sorted(range(len(stride)), key=by_stride))

    return dim_order_from_stride


@register_patch("executorch", "executorch.exir.passes.replace_view_copy_with_view_pass._is_view_copy")
def _patch_view_copy_keeps_dynamism(original):
    """to_executorch turns each view_copy into a view sharing its base's memory, and refuses one whose
    shape dynamism differs from its base's: "_ViewSpec is incompatible with its base on creation. It
    has shape_dynamism=1, but its base has shape_dynamism=0". That is a view of a static tensor into
    data-dependent dims (Glm4v's vision tower splits its 6 patches by grid sizes it reads with
    .tolist()). Leave such a node a view_copy (a copy, which the portable runtime has a kernel for)
    instead of failing the lowering.

    The view also checks its byte count equals its base's, a guard torch cannot decide when the two
    sizes are different expressions of data-dependent values: Lfm2Vl keeps the first
    ``mask.sum()`` rows and views them as an (h, w) grid read from ``spatial_shapes``, so
    ``Ne(4*u1*u2*((4*u0)//(u1*u2)), 16*u0)`` is asked. Such a node stays a copy too.

    A view is planned in its base's memory, but declared with a capacity of its own: the product of
    its dims' separate upper bounds, which can exceed its base's when the dims split one size
    differently (Reformer's LSH chunks view a padded length L as L // (L // 4) chunks of L // 4;
    FastSpeech2's mel frames): the runtime then refused to load the program ("offset_bytes + size_bytes
    >= allocator size", MemoryAllocationFailed). A view whose capacity exceeds its base's stays a copy.

    before: view_copy(static (6, d)) -> (6//u0, u0, d): Exception at to_executorch
            view_copy((u0, 4)) -> (1, u1, u2, (4*u0)//(u1*u2)): GuardOnDataDependentSymNode
            view_copy([2, 4, L, 8]) -> [2, 4, L//c, c, 8] with capacity 16*67*134 > 4*L: 0x21 at load
    after:  those view_copies stay copies; every other view_copy still becomes a view
    """

    from executorch.exir.sym_util import eval_shape_upper_bound
    from executorch.exir.tensor import determine_tensor_dynanism

    def exceeds_base(val, base_val) -> bool:
        try:
            return math.prod(eval_shape_upper_bound(val.shape)) > math.prod(eval_shape_upper_bound(base_val.shape))
        except RuntimeError:  # no finite bound for a data-dependent size: planning reports it itself
            return False

    def is_view_copy(node) -> bool:
        if not original(node):
            return False
        base_spec, val = node.args[0].meta.get("spec"), node.meta.get("val")
        base_val = node.args[0].meta.get("val")
        if base_spec is None or val is None:
            return True
        if isinstance(base_val, torch.Tensor) and not statically_known_true(base_val.numel() == val.numel()):
            return False
        if isinstance(base_val, torch.Tensor) and exceeds_base(val, base_val):
            return False
        return determine_tensor_dynanism(val.shape) == base_spec.shape_dynamism

    return is_view_copy


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


# ── Stage 4: FX program fixes ────────────────────────────────────────────────
# Fixes that need the whole program: @register_fx_program_fix("executorch"),
# fn(program, *, config) -> (program, modified). (Upper bounds for dynamic dims are set before
# tracing, in bound_dynamic_shapes: range constraints edited after export do not reach memory planning.)


# ── Stage 5: FX node fixes ───────────────────────────────────────────────────
# Rewrite single nodes: @register_fx_node_fix("executorch"), fn(gm, node) -> bool.


@register_fx_node_fix("executorch")
def _fix_gelu_tanh_explicit(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """XNNPACK lowers ``gelu(x, approximate="tanh")`` as the exact erf GELU: the outputs differ from
    eager by up to ~5e-4 (SigLIP, GPT-2-style activations). Spell the tanh form out in ops XNNPACK
    computes as written.

    before: gelu(x, approximate="tanh")
    after:  0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x * x * x)))
    """
    if node.op != "call_function" or node.target is not torch.ops.aten.gelu.default:
        return False
    approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
    if approximate != "tanh":
        return False
    aten = torch.ops.aten
    x = node.args[0]
    with gm.graph.inserting_before(node):
        cube = gm.graph.call_function(aten.mul.Tensor, (gm.graph.call_function(aten.mul.Tensor, (x, x)), x))
        inner = gm.graph.call_function(aten.add.Tensor, (x, gm.graph.call_function(aten.mul.Tensor, (cube, 0.044715))))
        scaled = gm.graph.call_function(aten.mul.Tensor, (inner, math.sqrt(2.0 / math.pi)))
        one_plus = gm.graph.call_function(aten.add.Tensor, (gm.graph.call_function(aten.tanh.default, (scaled,)), 1.0))
        out = gm.graph.call_function(aten.mul.Tensor, (gm.graph.call_function(aten.mul.Tensor, (x, 0.5)), one_plus))
    replace_node(gm, node, (cube, inner, scaled, one_plus, out))
    return True


@register_fx_node_fix("executorch")
def _fix_bucketize_as_comparisons(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The ExecuTorch runtime has no kernel for ``aten::bucketize.Tensor_out`` nor
    ``aten::searchsorted.Tensor_out`` (the program lowers, then fails to load: "Missing operator";
    Idefics2/3, SmolVLM and Phi-4-multimodal bucket patch coordinates with bucketize, MusicFlamingo
    searches its time grid with searchsorted). A bucket or insertion index is a count of boundaries
    below the value, so compute it with a comparison and a sum, which the portable kernels have.

    before: bucketize(x, boundaries, right=r, out_int32=i)
    after:  sum((boundaries <= x[..., None] if r else boundaries < x[..., None]).to(int32 if i else int64), -1)
    before: searchsorted(seq, x, right=r)      # seq 1-D, or [..., M] with x [..., K] (row-wise)
    after:  sum(seq <= x[..., None] if r else seq < x[..., None], -1)  # seq[..., None, :] when row-wise

    A searchsorted with a ``sorter`` is left alone (the permutation would need a gather first).
    """
    aten = torch.ops.aten
    if node.op != "call_function":
        return False
    if node.target is aten.bucketize.Tensor:
        x, boundaries = node.args[:2]
        right = node.kwargs.get("right", False)
    elif node.target in (aten.searchsorted.Tensor, aten.searchsorted.Scalar):
        boundaries, x = node.args[:2]
        if node.kwargs.get("sorter") is not None or len(node.args) > 2:
            return False
        side = node.kwargs.get("side")
        right = side == "right" if side is not None else node.kwargs.get("right", False)
    else:
        return False
    out_int32 = node.kwargs.get("out_int32", False)
    seq = fake_val(boundaries)
    if seq is None:
        return False  # without the sequence's rank, 1-D and row-wise search cannot be told apart
    new, dtype = NewNodes(gm.graph), torch.int32 if out_int32 else torch.int64
    with gm.graph.inserting_before(node):
        if node.target is aten.searchsorted.Tensor and seq.dim() > 1:
            # row-wise, seq [..., M] and x [..., K]: compare every value of a row with that row's boundaries
            boundaries = new.call(aten.unsqueeze.default, boundaries, -2)
        if isinstance(x, torch.fx.Node):
            below = new.call(aten.le.Tensor if right else aten.lt.Tensor, boundaries, new.call(aten.unsqueeze.default, x, -1))
        else:  # searchsorted.Scalar: one value, a 0-d result
            below = new.call(aten.le.Scalar if right else aten.lt.Scalar, boundaries, x)
        new.call(aten.sum.dim_IntList, new.call(aten._to_copy.default, below, dtype=dtype), [-1], dtype=dtype)
    replace_node(gm, node, new)
    return True


@register_fx_node_fix("executorch")
def _fix_nonzero_as_masked_select(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """torch declares ``nonzero``'s [n, ndim] output column-major (strides ``(1, n)``, as ATen's CPU
    kernel fills it), ExecuTorch takes each tensor's dim order from the fake strides, and its
    portable nonzero kernel writes row-major. The program so labelled nonzero's output, and what
    follows it, with dim order (1, 0): the next kernel that checks dim order refused ("2 input
    tensors have different dim orders" in slice_copy: MusicFlamingo, OneFormer) and a bare
    ``return x.nonzero()`` came back with its indices scrambled. Select the flat positions of the
    nonzero elements instead (one masked_select, row-major like nonzero's order) and unravel them
    into per-dim indices, all contiguous.

    before: nonzero(x)                                   # [n, d], column-major
    after:  p = masked_select(arange(numel).view(shape), x != 0)
            (p[:, None] // tensor(strides)) % tensor(sizes)  # [n, d], row-major
    before: rows, cols = where(x)                        # columns of nonzero(x)
    after:  rows, cols = p // stride0, (p // stride1) % size1

    The count stays the nonzero's own unbacked size (its fake values are reused), so what the
    graph already derived from it still holds. Sizes may be symbolic (dynamic exports).
    """
    aten = torch.ops.aten
    unpacked = node.target in (aten.where.default, aten.nonzero_numpy.default)  # a tuple of index columns
    if node.op != "call_function" or not (node.target is aten.nonzero.default or unpacked) or len(node.args) != 1:
        return False
    x = node.args[0]
    xv, out = fake_val(x), node.meta.get("val")
    if unpacked and (out is None or any(u.target is not operator.getitem for u in node.users)):
        return False
    count = (out[0] if unpacked else out).shape[0] if out is not None else None
    if xv is None or count is None or xv.dim() == 0:
        return False
    g = gm.graph
    new = NewNodes(g)
    with g.inserting_before(node):
        def mul(a, b):  # an int, or a node of size arithmetic when either is symbolic
            return a * b if isinstance(a, int) and isinstance(b, int) else new.call(operator.mul, a, b)

        sizes = [s if isinstance(s, int) else new.call(aten.sym_size.int, x, k) for k, s in enumerate(xv.shape)]
        strides = [1]
        for size in reversed(sizes[1:]):
            strides.insert(0, mul(size, strides[0]))
        flat = new.call(aten.arange.default, mul(strides[0], sizes[0]), dtype=torch.int64)
        grid = new.call(aten.view.default, flat, sizes)
        mask = new.call(aten.ne.Scalar, x, 0)
        picked = new.call(aten.masked_select.default, grid, mask)
        picked.meta["val"] = xv.new_empty((count,), dtype=torch.int64)  # the nonzero's own count, no new symbol
        if unpacked:  # where(x) / nonzero_numpy(x): column k is (p // stride_k) % size_k
            columns = {}
            for k, (size, stride) in enumerate(zip(sizes, strides)):
                col = picked
                if stride != 1:
                    col = new.call(aten.div.Scalar_mode, col, stride, rounding_mode="floor")
                if k > 0:
                    col = new.call(aten.remainder.Scalar, col, size)
                columns[k] = col
            copy_source_meta(node, new)
            replace_unpacked(gm, node, columns)
            return True
        column = new.call(aten.unsqueeze.default, picked, -1)
        if len(sizes) > 1:  # row-wise (p // strides) % sizes, broadcast: stacking n-long columns gives
            # [0, 0] instead of [0, d] in the runtime when n == 0, a [d] vector of each has no such edge
            def vector(values):
                scalars = [new.call(aten.scalar_tensor.default, v, dtype=torch.int64) for v in values]
                return new.call(aten.stack.default, scalars)

            column = new.call(aten.div.Tensor_mode, column, vector(strides), rounding_mode="floor")
            new.call(aten.remainder.Tensor, column, vector(sizes))
    replace_node(gm, node, new)
    return True


@register_fx_node_fix("executorch")
def _fix_negative_pad_as_slice(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """A negative pad crops; the ExecuTorch runtime's constant_pad_nd refuses it: "Padding values
    must be non-negative, but got pad[3] = -1" (RWKV's token shift is ``ZeroPad2d((0, 0, 1, -1))``:
    one row of zeros in front, the last row cut). Slice the cropped sides off first, then pad
    the rest.

    before: constant_pad_nd(x, [0, 0, 1, -1])                  # pad(x, ..., "constant") alike
    after:  constant_pad_nd(slice(x, -2, 0, -1), [0, 0, 1, 0])
    """
    aten = torch.ops.aten
    if node.op != "call_function" or node.target not in (aten.constant_pad_nd.default, aten.pad.default):
        return False
    args = dict(zip(("self", "pad", "mode", "value"), node.args), **node.kwargs)
    pad, mode = args["pad"], args.get("mode", "constant")
    if mode != "constant" or not all(isinstance(p, int) for p in pad) or min(pad, default=0) >= 0:
        return False
    new, x = NewNodes(gm.graph), args["self"]
    with gm.graph.inserting_before(node):
        for i in range(len(pad) // 2):
            left, right = pad[2 * i], pad[2 * i + 1]
            if left < 0 or right < 0:
                x = new.call(aten.slice.Tensor, x, -1 - i, max(-left, 0), right if right < 0 else None)
        value = args.get("value")
        new.call(aten.constant_pad_nd.default, x, [max(p, 0) for p in pad], 0.0 if value is None else value)
    replace_node(gm, node, new)
    return True


def _input_dim_of(gm: torch.fx.GraphModule, size: torch.SymInt) -> tuple[torch.fx.Node, int] | None:
    """(placeholder, dim) of an input whose size is exactly ``size``'s symbol, else None."""
    if free_unbacked_symbols(size) or not size.node.expr.is_Symbol:
        return None
    for node in gm.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(val, torch.Tensor):
            for d, s in enumerate(val.shape):
                if isinstance(s, torch.SymInt) and s.node.expr == size.node.expr:
                    return node, d
    return None


@register_fx_node_fix("executorch")
def _fix_bincount_of_known_length(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The ExecuTorch runtime has no kernel for ``aten::bincount.out`` (Splinter counts question
    tokens per row with ``torch.bincount(rows)``). Its length is data-dependent, but when the graph
    pins it (Splinter checks it equals the batch size; a dynamic batch is read back from the input)
    the counts are a comparison with each bin and a sum, which the portable kernels have. An unweighted bincount only; one whose length the
    graph does not pin is left alone.

    before: bincount(x)                                  # length u0, asserted == B
    after:  sum(x[:, None] == arange(B)[None, :], 0)
    """
    aten = torch.ops.aten
    if node.op != "call_function" or node.target is not aten.bincount.default:
        return False
    args = {"weights": None, "minlength": 0, **dict(zip(("self", "weights", "minlength"), node.args)), **node.kwargs}
    out, x = node.meta.get("val"), args["self"]
    xv = fake_val(x)
    if args["weights"] is not None or out is None or xv is None:
        return False
    length = out.shape[0]
    length = length if isinstance(length, int) else (length.node.maybe_as_int() or _input_dim_of(gm, length))
    if length is None:
        return False
    new = NewNodes(gm.graph)
    with gm.graph.inserting_before(node):
        if isinstance(length, tuple):  # pinned to a dynamic input size (the batch): read it back
            length = new.call(aten.sym_size.int, *length)
        bins = new.call(aten.arange.default, length, dtype=xv.dtype)
        hits = new.call(aten.eq.Tensor, new.call(aten.unsqueeze.default, x, -1), bins)
        counts = new.call(aten._to_copy.default, hits, dtype=torch.int64)
        new.call(aten.sum.dim_IntList, counts, [0], dtype=torch.int64)
    replace_node(gm, node, new)
    return True


@register_fx_node_fix("executorch")
def _fix_slice_bounds_checked(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """A slice bound read from data (``hidden_states[i, :length]`` with ``length`` from the attention
    mask: the XVector heads of Wav2Vec2, WavLM, Data2VecAudio, UniSpeechSat) is an unbacked symbol.
    torch.export's fake slice handles it, but the lowering turns the slice into slice_copy, whose meta
    is the decomposition that asks whether the bound is negative: "Could not guard on data-dependent
    expression u42 < 0" (caused by slice_forward). Check the bound is within [0, size] at run time
    (the artifact then refuses a negative or too-long bound instead of computing what eager's
    clamping would), which lets the decomposition decide its comparisons.

    before: slice(x, d, 0, u0)
    after:  _assert_scalar(u0 >= 0); _assert_scalar(u0 <= x.size(d)); slice(x, d, 0, u0)

    The size may itself be data-dependent (SuperPoint writes each image's u29 keypoints into rows
    padded to Max(u29, u31): "Could not guard on data-dependent expression u29 > Max(u29, u31)").

    Once the checks decide the bound, re-tracing the slice gives it the bound's own size, where the
    traced graph gave it a fresh symbol: ``slice(x, 0, None, u0)`` was ``[u1, ...]``, re-traced ``[u0, ...]``.
    The lowering's re-trace then renames u0 to u1 for the first slice and fails at a second slice
    with the same bound (Data2VecAudioForXVector's mean and std over ``hidden_states[i, :length]``:
    "AssertionError: u0 -> u1" in ``rebind_unbacked``). So the slice's fresh symbol is made the
    bound (``_slice_size_is_its_bound``) and no longer bound by the node.
    """
    import operator

    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols, statically_known_true

    if node.op != "call_function" or node.target is not torch.ops.aten.slice.Tensor:
        return False
    x = node.args[0]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    size = x.meta["val"].shape[dim] if isinstance(x, torch.fx.Node) and "val" in x.meta else None
    if not isinstance(size, (int, torch.SymInt)):
        return False
    changed = False
    for bound in node.args[2:4]:
        value = fake_val(bound)
        if not isinstance(value, torch.SymInt) or not free_unbacked_symbols(value):
            continue
        if statically_known_true(value >= 0) and statically_known_true(value <= size):
            continue
        torch._check(value >= 0)
        torch._check(value <= size)
        made = NewNodes(gm.graph)
        with gm.graph.inserting_before(node):
            limit_node = size if isinstance(size, int) else made.call(torch.ops.aten.sym_size.int, x, dim)
            for op, limit, what in ((operator.ge, 0, ">= 0"), (operator.le, limit_node, f"<= {size}")):
                made.call(torch.ops.aten._assert_scalar.default, made.call(op, bound, limit),
                          f"slice bound {bound.name} must be {what} (dim {dim} of {x.name}) in this ExecuTorch program")
        copy_source_meta(node, made)
        changed = True
    return _slice_size_is_its_bound(node, dim) or changed


def _slice_size_is_its_bound(node: torch.fx.Node, dim: int) -> bool:
    """After ``_fix_slice_bounds_checked``: when the slice's start and end are now known to lie in
    [0, size] (what re-tracing it decides too), its size along ``dim`` is ``end - start``. The traced
    meta gave it a fresh unbacked symbol: tell the shape environment that symbol equals ``end - start``
    and drop the node's binding of it, so a re-trace has nothing to rename. This holds for every such
    slice, also one whose bound an earlier slice's checks decided. Returns whether it changed the node."""
    import sympy
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    val, bindings = node.meta.get("val"), node.meta.get("unbacked_bindings")
    if not isinstance(val, torch.Tensor) or not bindings:
        return False
    size = val.shape[dim]
    x = node.args[0]
    full = x.meta["val"].shape[dim]
    def value(i, default):
        arg = node.args[i] if len(node.args) > i else None
        arg = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg
        return default if arg is None or (isinstance(arg, int) and arg >= sys.maxsize) else arg

    start, end, step = value(2, 0), value(3, full), value(4, 1)
    if not isinstance(size, torch.SymInt) or step != 1 or size.node.expr not in bindings:
        return False
    decided = all(statically_known_true(b >= 0) and statically_known_true(b <= full) for b in (start, end))
    if not (decided and statically_known_true(end >= start)):
        return False
    length, symbol, shape_env = end - start, size.node.expr, size.node.shape_env
    target = length.node.expr if isinstance(length, torch.SymInt) else sympy.Integer(length)
    shape_env._set_replacement(symbol, target, "slice bounds checked")
    if shape_env.replacements.get(symbol) != target:
        return False  # the shape environment refused it: keep the binding
    rest = {k: v for k, v in bindings.items() if k != symbol}
    if rest:
        node.meta["unbacked_bindings"] = rest
    else:
        del node.meta["unbacked_bindings"]
    return True


@register_fx_node_fix("executorch")
def _fix_erfinv_as_polynomial(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The ExecuTorch runtime has no kernel for ``aten::erfinv.out`` (Gemma 3n's activation sparsity
    takes ``Normal(0, 1).icdf``: "the ExecuTorch runtime has no kernel for aten::erfinv.out"). Compute it
    with Giles' single-precision polynomial approximation, as the ONNX exporter does.

    before: erfinv(x)    after: x * where(w < 5, p_central(w - 2.5), p_tail(sqrt(w) - 3)), w = -log((1 - x)(1 + x))
    """
    from .exporter_onnx import _ERFINV_CENTRAL, _ERFINV_TAIL

    if node.op != "call_function" or node.target is not torch.ops.aten.erfinv.default:
        return False
    aten, made = torch.ops.aten, NewNodes(gm.graph)
    call = made.call
    x = node.args[0]
    with gm.graph.inserting_before(node):
        one_minus = call(aten.rsub.Scalar, x, 1.0)
        one_plus = call(aten.add.Scalar, x, 1.0)
        w = call(aten.neg.default, call(aten.log.default, call(aten.mul.Tensor, one_minus, one_plus)))
        central = call(aten.sub.Scalar, w, 2.5)
        tail = call(aten.sub.Scalar, call(aten.sqrt.default, w), 3.0)
        p_central = call(aten.mul.Scalar, call(aten.ones_like.default, x), _ERFINV_CENTRAL[0])
        p_tail = call(aten.mul.Scalar, call(aten.ones_like.default, x), _ERFINV_TAIL[0])
        for a, b in zip(_ERFINV_CENTRAL[1:], _ERFINV_TAIL[1:]):
            p_central = call(aten.add.Scalar, call(aten.mul.Tensor, p_central, central), a)
            p_tail = call(aten.add.Scalar, call(aten.mul.Tensor, p_tail, tail), b)
        picked = call(aten.where.self, call(aten.lt.Scalar, w, 5.0), p_central, p_tail)
        call(aten.mul.Tensor, picked, x)
    replace_node(gm, node, made)
    return True


_LONG_INDEX_OPS = (torch.ops.aten.gather.default, torch.ops.aten.scatter_add.default, torch.ops.aten.scatter_add_.default,
                   torch.ops.aten.scatter.src, torch.ops.aten.scatter_.src, torch.ops.aten.scatter.value,
                   torch.ops.aten.scatter_.value)  # the traced program keeps in-place ops; the index is args[2]


@register_fx_node_fix("executorch")
def _fix_int32_index_as_int64(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The portable ``gather`` / ``scatter`` / ``scatter_add`` kernels take int64 indices only, where
    eager also takes int32 (Glm5Next's MoE: "[index_util.cpp:156] Check failed (index.scalar_type() ==
    ScalarType::Long): Expected dtype int64 for index; index.scalar_type() = Int ... op_scatter_add").
    Widen an int32 index before the op; the values are the same.

    before: scatter_add(x, dim, index.int32, src)    after: scatter_add(x, dim, index.to(int64), src)
    """
    if node.op != "call_function" or node.target not in _LONG_INDEX_OPS:
        return False
    index = node.args[2] if len(node.args) > 2 else None
    val = fake_val(index)
    if val is None or val.dtype != torch.int32:
        return False
    made = NewNodes(gm.graph)
    with gm.graph.inserting_before(node):
        wide = made.call(torch.ops.aten._to_copy.default, index, dtype=torch.int64)
    copy_source_meta(node, made)
    node.update_arg(2, wide)
    return True


_SORTS = {
    torch.ops.aten.sort.default: ("self", "dim", "descending"),
    torch.ops.aten.sort.stable: ("self",),  # stable, dim, descending are keyword-only
    torch.ops.aten.argsort.default: ("self", "dim", "descending"),
    torch.ops.aten.argsort.stable: ("self",),
}


@register_fx_node_fix("executorch")
def _fix_sort_as_topk(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The ExecuTorch runtime has no kernel for ``aten::sort.values`` (JetMoe groups tokens by expert
    with ``top_k_experts.flatten().sort()``, Hiera's masking takes ``argsort`` of noise: "the ExecuTorch
    runtime has no kernel for aten::sort.values"). A full sort along ``dim`` is a top-k with ``k`` the
    size of ``dim``, which the portable kernels have (``topk.values``), sorted, largest first when
    descending.

    topk promises no order among equal keys, and eager's sort of a short row keeps them in index
    order: PP-DocLayoutV2 moves its detections to the front with ``argsort(mask.int(), descending=True)``
    and its outputs came back permuted. Integer and bool keys (at most 32 bits, a static row) are
    made distinct first, ``key * n + position`` (``n - 1 - position`` when descending), which orders
    ties by position, exactly, so ``stable=True`` holds too; values are then gathered from the input.
    Float keys take the plain top-k (ties in another order than eager's are possible), and a stable
    float sort is left alone.

    before: values, indices = sort(x, dim, descending)    argsort(x, dim, descending)
    after:  values, indices = topk(x, x.size(dim), dim, largest=descending, sorted=True)    topk(...)[1]
    after (int keys): indices = topk(x.long() * n + ties, n, dim, descending)[1]; values = gather(x, dim, indices)
    """
    if node.op != "call_function" or node.target not in _SORTS:
        return False
    args = {"dim": -1, "descending": False, "stable": False, **dict(zip(_SORTS[node.target], node.args)), **node.kwargs}
    x = args["self"]
    val = fake_val(x)
    if val is None or val.dim() == 0:
        return False
    dim = args["dim"] % val.dim()
    size = val.shape[dim]
    exact = isinstance(size, int) and (val.dtype == torch.bool or (not val.dtype.is_floating_point
                                       and not val.dtype.is_complex and val.dtype.itemsize <= 4))
    if args["stable"] and not exact:
        return False
    aten, made = torch.ops.aten, NewNodes(gm.graph)
    descending = bool(args["descending"])
    argsort = node.target in (aten.argsort.default, aten.argsort.stable)
    with gm.graph.inserting_before(node):
        if exact:  # key * n + position: distinct keys, ties ordered by position
            position = made.call(aten.arange.default, size, dtype=torch.int64)
            if descending:
                position = made.call(aten.rsub.Scalar, position, size - 1)
            position = made.call(aten.view.default, position, [size] + [1] * (val.dim() - 1 - dim))
            key = made.call(aten._to_copy.default, x, dtype=torch.int64)
            key = made.call(aten.add.Tensor, made.call(aten.mul.Scalar, key, size), position)
            topk = made.call(aten.topk.default, key, size, dim, descending, True)
        else:
            k = size if isinstance(size, int) else made.call(aten.sym_size.int, x, dim)
            topk = made.call(aten.topk.default, x, k, dim, descending, True)
        if argsort or exact:
            indices = made.call(operator.getitem, topk, 1)
        if exact and not argsort:  # the sorted values, from the input rather than the made-up keys
            values = made.call(aten.gather.default, x, dim, indices)
    if exact and not argsort:
        copy_source_meta(node, made)
        replace_unpacked(gm, node, {0: values, 1: indices})
    else:  # argsort: the indices; a plain sort: topk's (values, indices) as they are
        replace_node(gm, node, made)
    return True


_REMAINDERS = (torch.ops.aten.remainder.Tensor, torch.ops.aten.remainder.Scalar)


@register_fx_node_fix("executorch")
def _fix_integer_remainder_floored(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The ExecuTorch runtime's integer ``remainder`` keeps the dividend's sign, as C's ``%`` does
    (``-1 % 8`` gives -1), where torch's takes the divisor's (7); float remainder is right.
    EfficientLoFTR marks unmatched points with index -1 and takes ``index % width``: half its
    keypoints came back one image width off. A nonzero result whose sign differs from the
    divisor's gets the divisor added, which is torch's remainder from C's (and a no-op on a
    runtime that already floors).

    before: r = remainder(a, b)
    after:  t = remainder(a, b); r = where((t != 0) & ((t < 0) ^ (b < 0)), t + b, t)
    """
    if node.op != "call_function" or node.target not in _REMAINDERS or node.meta.get("floored_remainder"):
        return False
    val = fake_val(node)
    if val is None or val.dtype.is_floating_point or val.dtype.is_complex or val.dtype == torch.bool:
        return False
    aten, made = torch.ops.aten, NewNodes(gm.graph)
    truncated, divisor = node, node.args[1]
    size_divisor = isinstance(divisor, torch.fx.Node) and isinstance(fake_val(divisor), torch.SymInt)
    if size_divisor and not statically_known_true(fake_val(divisor) >= 1):
        return False  # a symbolic divisor of unknown sign: no tensor to compare (never seen; sizes are >= 1)
    users = list(node.users)
    with gm.graph.inserting_before(node.next):
        negative = made.call(aten.lt.Scalar, truncated, 0)
        if size_divisor:  # a size (Reformer's sequence length): positive, added as a Scalar
            differs = negative
            shifted = made.call(aten.add.Scalar, truncated, divisor)
        elif isinstance(divisor, torch.fx.Node):
            differs = made.call(aten.logical_xor.default, negative, made.call(aten.lt.Scalar, divisor, 0))
            shifted = made.call(aten.add.Tensor, truncated, divisor)
        else:
            differs = negative if divisor > 0 else made.call(aten.gt.Scalar, truncated, 0)
            shifted = made.call(aten.add.Scalar, truncated, divisor)
        wrong = made.call(aten.logical_and.default, made.call(aten.ne.Scalar, truncated, 0), differs)
        fixed = made.call(aten.where.self, wrong, shifted, truncated)
    copy_source_meta(node, made)
    for user in users:
        user.replace_input_with(node, fixed)
    node.meta["floored_remainder"] = True  # a second pass leaves it alone
    return True


@register_fx_node_fix("executorch")
def _fix_symint_mod_floored(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The runtime's ``executorch_prim::mod.Scalar`` (a Python ``%`` on sizes in the graph) is C's ``%``:
    the result takes the dividend's sign, where Python's takes the divisor's. LongT5's local attention pads
    the sequence by ``(-seq) % block_len``: the runtime computed -7 for 121, ``constant_pad_nd`` refused the
    negative pad (portable kernel) and XNNPACK's pad divided by zero (the process died of SIGFPE). With a
    positive divisor, ``((a % b) + b) % b`` is Python's result under either convention.

    before: r = a % b                 after: r = ((a % b) + b) % b        (SymInts, b > 0 constant)
    """
    if node.op != "call_function" or node.target is not operator.mod or node.meta.get("floored_mod"):
        return False
    divisor = node.args[1]
    if not isinstance(divisor, int) or divisor <= 0 or not isinstance(fake_val(node), torch.SymInt):
        return False
    made = NewNodes(gm.graph)
    with gm.graph.inserting_after(node):
        shifted = made.call(operator.add, node, divisor)
    with gm.graph.inserting_after(shifted):
        floored = made.call(operator.mod, shifted, divisor)
    shifted.meta["val"] = fake_val(node) + divisor
    floored.meta["val"] = fake_val(node)
    floored.meta["floored_mod"] = True
    copy_source_meta(node, made)
    node.replace_all_uses_with(floored, delete_user_cb=lambda user: user is not shifted)
    return True


_EMPTY = (torch.ops.aten.new_empty.default, torch.ops.aten.empty.memory_format)


@register_fx_node_fix("executorch")
def _fix_symbolic_empty_as_full(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """ExecuTorch's edge lowering turns ``empty`` into ``dim_order_ops::_empty_dim_order``, whose ``size``
    is ``int[]``, not ``SymInt[]`` (MemoryFormatOpsPass, exir/passes/dim_order_ops_registry.py): calling it
    with symbolic sizes reads each one as an int, which specializes the input dims behind them to their
    traced values in a frozen shape environment ("Ignored guard s70 == 7, this could result in accuracy
    problems"). The whole program is then planned static: the DeepSeek-V3-style MLA ``expand_kv``
    (``kv_nope.new_empty(batch, heads, seq, dim)``, 17 model families) refused every other sequence
    length ("Attempted to resize a bounded tensor with a maximum capacity of 14 elements to 16"). An
    empty tensor's contents are undefined, so a zero-filled one of the same size is a valid value;
    ``full`` takes ``SymInt[]`` and stays dynamic. Static sizes are left alone.

    before: e = new_empty(x, [s0, 4, s1, 12])        after: e = full([s0, 4, s1, 12], 0, dtype=x.dtype)
    """
    if node.op != "call_function" or node.target not in _EMPTY:
        return False
    val = fake_val(node)
    if val is None or not any(isinstance(d, torch.SymInt) for d in val.shape):
        return False
    if node.target is torch.ops.aten.empty.memory_format and node.kwargs.get("memory_format") not in (
            None, torch.contiguous_format, torch.preserve_format):
        return False
    size = node.args[1] if node.target is torch.ops.aten.new_empty.default else node.args[0]
    _zeros_in_place_of(gm, node, NewNodes(gm.graph), size)
    return True


@register_fx_node_fix("executorch")
def _fix_circular_pad_as_cat(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The lowering decomposes circular padding (``F.pad(x, p, mode="circular")``, Autoformer's and
    Informer's ``padding_mode="circular"`` convolutions) into a ``new_empty`` of the padded shape and
    copies into it. That empty becomes ``dim_order_ops::_empty_dim_order``, whose ``int[] size`` reads
    each symbolic size as an int (see ``_fix_symbolic_empty_as_full``): AutoformerModel's batch was
    specialized to its traced 2 and the program refused batch 3 (``set_inputs`` 0x10). Circular
    padding of a dim is the tail wrapped before it and the head after it: a ``cat`` of slices, which
    stays symbolic. Padding dims one after another wraps the corners as ``F.pad`` does.

    before: y = pad(x, [l, r], "circular")
    after:  y = cat([x[..., -l:], x, x[..., :r]], -1)
    Only for a tensor with a symbolic size and non-negative pads no wider than their dim.
    """
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if node.op != "call_function" or node.target is not torch.ops.aten.pad.default:
        return False
    mode = node.args[2] if len(node.args) > 2 else node.kwargs.get("mode", "constant")
    x, pads = node.args[0], node.args[1]
    val = fake_val(x)
    if mode != "circular" or val is None or not any(isinstance(d, torch.SymInt) for d in val.shape):
        return False
    if not all(isinstance(p, int) and p >= 0 for p in pads) or len(pads) % 2:
        return False
    if not all(statically_known_true(val.shape[-1 - i // 2] >= pads[i]) for i in range(len(pads))):
        return False
    aten, made = torch.ops.aten, NewNodes(gm.graph)
    out = x
    with gm.graph.inserting_before(node):
        for i in range(0, len(pads), 2):
            left, right, dim = pads[i], pads[i + 1], val.dim() - 1 - i // 2
            parts = ([made.call(aten.slice.Tensor, out, dim, -left, sys.maxsize)] if left else []) + [out] + (
                [made.call(aten.slice.Tensor, out, dim, 0, right)] if right else [])
            if len(parts) > 1:
                out = made.call(aten.cat.default, parts, dim)
    if out is x:
        return False
    replace_node(gm, node, made)
    return True


def _size_value(made: NewNodes, of: torch.fx.Node, d: int, extent):
    """Dim ``d`` of ``of`` as a node argument: ``extent`` when it is static, else a ``sym_size.int`` node."""
    return extent if isinstance(extent, int) else made.call(torch.ops.aten.sym_size.int, of, d)


def _zeros_in_place_of(gm: torch.fx.GraphModule, node: torch.fx.Node, made: NewNodes, sizes: list) -> None:
    """Replace ``node`` by ``full(sizes, 0)`` of its dtype and device (its fake value kept); ``made`` holds
    the nodes already added for ``sizes``."""
    val = fake_val(node)
    with gm.graph.inserting_before(node):
        full = made.call(torch.ops.aten.full.default, sizes, 0, dtype=val.dtype, device=val.device)
    full.meta["val"] = val
    copy_source_meta(node, made)
    node.replace_all_uses_with(full)
    gm.graph.erase_node(node)


@register_fx_node_fix("executorch")
def _fix_empty_cat_as_full(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """ExecuTorch's PruneEmptyTensorsPass replaces a ``cat`` whose inputs are all empty with
    ``full(tuple(out.meta["val"].shape), 0)`` (exir/passes/prune_empty_tensors_pass.py): with dynamic
    shapes that tuple holds SymInt objects, not graph nodes, and the emitter stops ("Unsupported type
    encountered in int list", at ``aten.full.out(args = ((s43, 1, s53, 0), 0))``). Glm5Next's MLA has no
    rotary part (``qk_rope_head_dim = 0``), so its cache update concatenates (B, 1, S, 0) keys. Done here
    first, with the sizes as graph values: the same empty tensor, and nothing left for that pass.

    before: y = cat([a[s0, 1, s1, 0], b[s0, 1, s2, 0]], 2)
    after:  y = full([sym_size(a, 0), 1, sym_size(a, 2) + sym_size(b, 2), 0], 0, dtype=a.dtype)
    """
    if node.op != "call_function" or node.target is not torch.ops.aten.cat.default:
        return False
    val, parts = fake_val(node), list(node.args[0])
    if val is None or not parts or not any(isinstance(d, torch.SymInt) for d in val.shape):
        return False
    vals = [fake_val(p) for p in parts]
    if any(v is None for v in vals) or not any(isinstance(d, int) and d == 0 for d in val.shape):
        return False  # not certainly empty
    dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % val.dim()
    # a legacy 1-D empty input (a cache's initial torch.tensor([])) takes no part in the sizes
    ranked = [(part, value) for part, value in zip(parts, vals) if value.dim() == val.dim()]
    if not ranked:
        return False
    made = NewNodes(gm.graph)
    with gm.graph.inserting_before(node):
        sizes = []
        for d in range(val.dim()):
            if d != dim:
                sizes.append(_size_value(made, ranked[0][0], d, ranked[0][1].shape[d]))
                continue
            total, *rest = [_size_value(made, part, d, value.shape[d]) for part, value in ranked]
            for extent in rest:
                total = total + extent if isinstance(total, int) and isinstance(extent, int) else \
                    made.call(operator.add, total, extent)
            sizes.append(total)
    _zeros_in_place_of(gm, node, made, sizes)
    return True


_CUMULATIVE = {torch.ops.aten.cummax.default: torch.ops.aten.amax.default,
               torch.ops.aten.cummin.default: torch.ops.aten.amin.default}


@register_fx_node_fix("executorch")
def _fix_cumulative_extreme_as_masked_reduction(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The ExecuTorch runtime has no kernel for ``aten::cummax.out`` / ``aten::cummin.out`` (Grounding
    DINO finds each token's previous and next special token with them: "the ExecuTorch runtime has no
    kernel for aten::cummax.out, aten::cummin.out"). Along a dim of length n (static, or dynamic: the
    text length of a dynamic export), the running extreme at i is the extreme over the positions j <= i:
    a reduction over an (n x n) lower-triangular mask, in ops the portable kernels have. Its index is
    eager's, the last position j <= i holding it (except after a NaN, whose running value is NaN as in
    eager but whose index is -1).

    before: values, indices = cummax(x, dim)
    after:  xt = x.transpose(dim, -1); keep[i, j] = j <= i
            values = amax(where(keep, xt[..., None, :], lowest), -1)
            indices = amax(where(keep & (xt[..., None, :] == values[..., None]), arange(n), -1), -1)
            (both transposed back; cummin: amin, highest)
    """
    if node.op != "call_function" or node.target not in _CUMULATIVE:
        return False
    x, dim = node.args[0], node.args[1]
    val = fake_val(x)
    if (val is None or val.dim() == 0 or val.dtype == torch.bool
            or any(u.op != "call_function" or u.target is not operator.getitem for u in node.users)):
        return False
    dim %= val.dim()
    last = val.dim() - 1
    reduce = _CUMULATIVE[node.target]
    info = torch.finfo(val.dtype) if val.is_floating_point() else torch.iinfo(val.dtype)
    lowest = (-math.inf if val.is_floating_point() else info.min) if reduce is torch.ops.aten.amax.default else (
        math.inf if val.is_floating_point() else info.max)
    aten, made = torch.ops.aten, NewNodes(gm.graph)
    call = made.call
    with gm.graph.inserting_before(node):
        n = _size_value(made, x, dim, val.shape[dim])  # a dynamic length: an (n x n) mask planned at its bound
        xt = call(aten.transpose.int, x, dim, last) if dim != last else x
        positions = call(aten.arange.start_step, 0, n, 1, dtype=torch.int64)
        keep = call(aten.le.Tensor, call(aten.unsqueeze.default, positions, 0), call(aten.unsqueeze.default, positions, 1))
        rows = call(aten.unsqueeze.default, xt, -2)  # (..., 1, n): row i sees every j
        values = call(reduce, call(aten.where.self, keep, rows, call(aten.full_like.default, rows, lowest)), [-1])
        hit = call(aten.logical_and.default, keep, call(aten.eq.Tensor, rows, call(aten.unsqueeze.default, values, -1)))
        indices = call(aten.amax.default, call(aten.where.ScalarOther, hit, positions, -1), [-1])
        if dim != last:
            values = call(aten.transpose.int, values, dim, last)
            indices = call(aten.transpose.int, indices, dim, last)
    copy_source_meta(node, made)
    replace_unpacked(gm, node, {0: values, 1: indices})
    return True


_EMBEDDING_BAGS = (torch.ops.aten.embedding_bag.default, torch.ops.aten.embedding_bag.padding_idx,
                   torch.ops.aten._embedding_bag.default)
_BAG_REDUCTIONS = {0: torch.ops.aten.sum.dim_IntList, 1: torch.ops.aten.mean.dim, 2: torch.ops.aten.amax.default}


@register_fx_node_fix("executorch")
def _fix_embedding_bag_of_equal_bags(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The ExecuTorch runtime has no kernel for ``aten::_embedding_bag.out`` (Kimi K2.5's vision tower
    resamples its position grid bicubically as a weighted ``F.embedding_bag`` over 2-D indices: "the
    ExecuTorch runtime has no kernel for aten::_embedding_bag.out"). 2-D indices make bags of one
    length L, so ``F.embedding_bag`` passes ``offsets = arange(0, N, L)``; for those offsets the bag
    is a gather, a weighting and a reduction over a (bags, L, dim) view, in portable ops. Other
    offsets (bags of different lengths), ``include_last_offset`` and ``padding_idx`` are left alone.

    before: embedding_bag(table, idx[N], offsets=arange(0, N, L), mode, per_sample_weights=w[N])[0]
    after:  reduce_mode((table[idx] * w[:, None]).view(N // L, L, dim), dim=1)
    """
    if node.op != "call_function" or node.target not in _EMBEDDING_BAGS:
        return False
    names = ("weight", "indices", "offsets", "scale_grad_by_freq", "mode", "sparse", "per_sample_weights",
             "include_last_offset", "padding_idx")
    args = {"mode": 0, "per_sample_weights": None, "include_last_offset": False, "padding_idx": None,
            **dict(zip(names, node.args)), **node.kwargs}
    offsets, indices = args["offsets"], args["indices"]
    ival = fake_val(indices)
    if (ival is None or ival.dim() != 1 or not isinstance(ival.shape[0], int) or args["include_last_offset"]
            or args["padding_idx"] not in (None, -1) or args["mode"] not in _BAG_REDUCTIONS
            or not isinstance(offsets, torch.fx.Node) or offsets.target is not torch.ops.aten.arange.start_step
            or any(u.op != "call_function" or u.target is not operator.getitem or (u.args[1] != 0 and u.users)
                   for u in node.users)):
        return False
    n = ival.shape[0]
    start, end, step = (list(offsets.args) + [1])[:3]
    if not all(isinstance(v, int) for v in (start, end, step)) or start != 0 or step <= 0 or end != n or n % step:
        return False
    aten, made = torch.ops.aten, NewNodes(gm.graph)
    call = made.call
    with gm.graph.inserting_before(node):
        rows = call(aten.index_select.default, args["weight"], 0, indices)
        if args["per_sample_weights"] is not None:
            rows = call(aten.mul.Tensor, rows, call(aten.unsqueeze.default, args["per_sample_weights"], -1))
        bags = call(aten.view.default, rows, [n // step, step, -1])
        reduced = call(_BAG_REDUCTIONS[args["mode"]], bags, [1])
    copy_source_meta(node, made)
    replace_unpacked(gm, node, {0: reduced})  # offset2bag, bag_size, max_indices: checked unused above
    return True


@register_fx_node_fix("executorch")
def _fix_scatter_reduce_by_segment(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The ExecuTorch runtime has no kernel for ``aten::scatter_reduce.two_out`` (TAPAS reduces table
    cells by segment with it: "the ExecuTorch runtime has no kernel for aten::scatter_reduce.two_out").
    For a 1-D reduction, spell it in ops the portable kernels have, in memory O(segments + elements):
    TAPAS's segment count grows with the batch (65536 x batch for its position reset), and a
    (segments x elements) membership mask planned at the upper bounds did not load (std::bad_alloc).

    - sum and mean accumulate with ``index_put(accumulate=True)``;
    - amax and amin order the elements by value (``topk`` of all of them: the runtime has no sort)
      so that each segment's extreme comes last, then ``scatter`` them: the portable scatter kernel
      writes in index order, so the last write, the extreme, stays (a unit test runs it in the runtime).

    before: scatter_reduce(self[S], 0, index[N], src[N], reduce, include_self)
    after:  sum/mean: total = index_put(include_self ? self : zeros, [index], src, accumulate=True)
                      count = index_put(zeros, [index], ones, accumulate=True)
                      mean: total / (count + 1) with self, else total / max(count, 1)
                      without self: where(count > 0, total, self)   (an empty segment keeps self)
            amax:     values, order = topk(src, N, largest=False)   (ascending; amin: descending)
                      r = scatter(self, 0, index[order], values)     (an empty segment keeps self)
                      with self: maximum(r, self)                    (amin: minimum)
    """
    if node.op != "call_function" or node.target is not torch.ops.aten.scatter_reduce.two:
        return False
    names = ("self", "dim", "index", "src", "reduce", "include_self")
    args = {"include_self": True, **dict(zip(names, node.args)), **node.kwargs}
    vals = [fake_val(args[k]) for k in ("self", "index", "src")]
    reduce, include_self = args["reduce"], args["include_self"]
    if (reduce not in ("sum", "mean", "amax", "amin") or any(v is None or v.dim() != 1 for v in vals)
            or args["dim"] not in (0, -1) or not vals[2].is_floating_point() or vals[1].dtype != torch.int64):
        return False
    aten, made = torch.ops.aten, NewNodes(gm.graph)
    call = made.call
    self_, index, src = args["self"], args["index"], args["src"]
    with gm.graph.inserting_before(node):
        if reduce in ("amax", "amin"):
            n = _size_value(made, src, 0, vals[2].shape[0])
            ordered = call(aten.topk.default, src, n, 0, reduce == "amin", True)
            values, order = call(operator.getitem, ordered, 0), call(operator.getitem, ordered, 1)
            reduced = call(aten.scatter.src, self_, 0, call(aten.index_select.default, index, 0, order), values)
            if include_self:
                call(aten.maximum.default if reduce == "amax" else aten.minimum.default, reduced, self_)
        else:
            zeros = call(aten.full_like.default, self_, 0.0)
            count = None
            if reduce == "mean" or not include_self:  # how many elements each segment got
                count = call(aten.index_put.default, zeros, [index], call(aten.full_like.default, src, 1.0), True)
            reduced = call(aten.index_put.default, self_ if include_self else zeros, [index], src, True)
            if reduce == "mean":
                reduced = call(aten.div.Tensor, reduced, call(aten.add.Tensor, count, 1.0) if include_self
                               else call(aten.clamp_min.default, count, 1.0))
            if not include_self:
                call(aten.where.self, call(aten.gt.Scalar, count, 0), reduced, self_)
    replace_node(gm, node, made)
    return True


def _known_int(size) -> int | None:
    """A size as an int when it has one value: an int, or a SymInt a guard pinned to a number (VJEPA2's
    channel dim, Dim.AUTO specialized to 3, prints as 3 but is still a SymInt)."""
    return size if isinstance(size, int) else size.node.maybe_as_int()


def _conv_args(node: torch.fx.Node):
    """(x, weight, bias, stride, padding, dilation, groups) of a 3-D convolution node, else None."""
    aten = torch.ops.aten
    if node.op != "call_function":
        return None
    if node.target is aten.conv3d.default:
        names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
        defaults = (None, None, None, [1, 1, 1], [0, 0, 0], [1, 1, 1], 1)
    elif node.target is aten.convolution.default:
        names = ("input", "weight", "bias", "stride", "padding", "dilation", "transposed", "output_padding", "groups")
        defaults = (None,) * 9
    else:
        return None
    args = dict(zip(names, defaults))
    args.update(zip(names, node.args))
    args.update(node.kwargs)
    x = fake_val(args["input"])
    w = fake_val(args["weight"])
    if x is None or w is None or x.dim() != 5 or args.get("transposed"):
        return None
    # the batch, the frames and the spatial sizes may be symbolic (read back with sym_size); channels
    # and the kernel must be static (the taps are unrolled)
    if any(_known_int(d) is None for d in (x.shape[1], *w.shape)):
        return None
    triple = lambda v: list(v) * 3 if len(v) == 1 else list(v)  # noqa: E731
    return (args["input"], args["weight"], args["bias"], triple(args["stride"]), triple(args["padding"]),
            triple(args["dilation"]), args["groups"])


@register_fx_node_fix("executorch")
def _fix_conv3d_as_conv2d(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Neither XNNPACK nor the portable kernels run a 3-D convolution: the program lowers, then fails
    at run time, "Check failed (in.dim() == 3 || in.dim() == 4): Expect input tensor to be 3-D or
    4-D, but got, 5" and "method->execute() failed with error 0x12" (the Conv3d patch embeddings of
    Qwen2-VL, Glm4v and the other video-capable VLMs, VideoMAE's tubelets). A 3-D convolution is a
    sum over its temporal taps of 2-D convolutions of strided frame slices, frames folded into the
    batch: kt 2-D convolutions, whatever the number of frames.

    before: conv3d(x[N, C, T, H, W], w[O, C/g, kt, kh, kw], b, stride, padding, dilation, g)
    after:  x padded in T; for each tap i: conv2d(fold(x[:, :, i*dt :: st][:, :, :T_out]), w[:, :, i],
            b if i == 0 else None, stride[1:], padding[1:], dilation[1:], g); summed; unfolded to
            [N, O, T_out, H', W']
    A symbolic frame count (a video model's dynamic num_frames: VideoMAE, ViViT) takes T_out from the
    last tap's slice, x[:, :, (kt-1)*dt :: st], which has exactly T_out frames.
    """
    found = _conv_args(node)
    if found is None:
        return False
    x, weight, bias, (st, sh, sw), (pt, ph, pw), (dt, dh, dw), groups = found
    _, c, t, h, w = node.args[0].meta["val"].shape
    _, o, t_out, h_out, w_out = node.meta["val"].shape
    c, o, kt = _known_int(c), _known_int(o), _known_int(weight.meta["val"].shape[2])
    t_out = _known_int(t_out) or t_out
    aten, made = torch.ops.aten, NewNodes(gm.graph)
    call = made.call
    with gm.graph.inserting_before(node):
        if pt:
            x = call(aten.constant_pad_nd.default, x, [0, 0, 0, 0, pt, pt], 0.0)
        total = None
        h, w = _size_value(made, x, 3, h), _size_value(made, x, 4, w)
        if not isinstance(t_out, int):
            last = call(aten.slice.Tensor, x, 2, (kt - 1) * dt, sys.maxsize, st)
            t_out = call(aten.sym_size.int, last, 2)
        for i in range(kt):
            if isinstance(t_out, int):
                frames = call(aten.slice.Tensor, x, 2, i * dt, i * dt + st * (t_out - 1) + 1, st)
            else:  # every tap's slice cut to T_out frames
                frames = call(aten.slice.Tensor, call(aten.slice.Tensor, x, 2, i * dt, sys.maxsize, st), 2, 0, t_out)
            folded = call(aten.reshape.default, call(aten.permute.default, frames, [0, 2, 1, 3, 4]), [-1, c, h, w])
            tap = call(aten.select.int, weight, 2, i)
            y = call(aten.convolution.default, folded, tap, bias if i == 0 else None, [sh, sw], [ph, pw],
                     [dh, dw], False, [0, 0], groups)
            total = y if total is None else call(aten.add.Tensor, total, y)
        unfolded = call(aten.reshape.default, total, [-1, t_out, o, _size_value(made, total, 2, h_out),
                                                      _size_value(made, total, 3, w_out)])
        call(aten.permute.default, unfolded, [0, 2, 1, 3, 4])
    replace_node(gm, node, made)
    return True


@register_fx_node_fix("executorch")
def _fix_alias_as_its_input(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """``alias`` (a full-range slice, ``x[:, :, :H, :W]`` at H, W == x's sizes) becomes ``alias_copy``,
    whose output takes its dim order from the fake strides (contiguous) and whose kernel requires the
    same dim order in and out. When an XNNPACK delegate returns its input channels-last, the run fails:
    "Check failed (tensors_have_same_dim_order(in, out))" (Swin2SR's final crop). An alias of a value
    is that value: use it directly. An alias of a graph input, or of a value the graph also returns,
    is left alone (the program would return one buffer twice, or its own input).

    before: y = alias(x)
    after:  y = x
    """
    if node.op != "call_function" or node.target is not torch.ops.aten.alias.default:
        return False
    source = node.args[0]
    if not isinstance(source, torch.fx.Node) or source.op != "call_function":
        return False
    if any(user.op == "output" for user in source.users) and any(user.op == "output" for user in node.users):
        return False
    node.replace_all_uses_with(source)
    gm.graph.erase_node(node)
    return True


_POOLS_2D = (torch.ops.aten.max_pool2d.default, torch.ops.aten.avg_pool2d.default)


@register_fx_node_fix("executorch")
def _fix_unbatched_pool_as_batched(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """A 2-D pool over an unbatched [C, H, W] input: XNNPACK's partitioner takes it, then its channels-last
    pass refuses the 3-D tensor ("Attempting to convert non-NHWC compatible node to NHWC"; SuperPoint's
    non-maximum suppression pools each image's [1, H, W] score map). Pool a batch of one instead.

    before: max_pool2d(x[C, H, W], ...)
    after:  squeeze(max_pool2d(unsqueeze(x, 0), ...), 0)
    """
    if node.op != "call_function" or node.target not in _POOLS_2D:
        return False
    x = fake_val(node.args[0])
    if x is None or x.dim() != 3:
        return False
    aten, new = torch.ops.aten, NewNodes(gm.graph)
    with gm.graph.inserting_before(node):
        batched = new.call(aten.unsqueeze.default, node.args[0], 0)
        pooled = new.call(node.target, batched, *node.args[1:], **node.kwargs)
        new.call(aten.squeeze.dim, pooled, 0)
    replace_node(gm, node, new)
    return True


_RANDOM_LIKE = {"randn_like": "randn", "rand_like": "rand"}


@register_fx_node_fix("executorch")
def _fix_random_like_as_sized(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The ExecuTorch runtime has kernels for ``randn.out`` and ``rand.out`` but not for
    ``randn_like.out`` nor ``rand_like.out`` (VITS draws its prior noise with ``randn_like``, scaled by
    noise_scale): draw with the sized op at the input's sizes and dtype.

    before: randn_like(x, dtype=d)
    after:  randn([x.size(0), ...], dtype=d or x.dtype)     # symbolic sizes through sym_size
    """
    aten = torch.ops.aten
    packet = getattr(node.target, "overloadpacket", None)
    if node.op != "call_function" or packet is None or packet.__name__ not in _RANDOM_LIKE:
        return False
    x = fake_val(node.args[0])
    if x is None or node.kwargs.get("memory_format") not in (None, torch.preserve_format, torch.contiguous_format):
        return False
    new = NewNodes(gm.graph)
    with gm.graph.inserting_before(node):
        sizes = [d if isinstance(d, int) else new.call(aten.sym_size.int, node.args[0], i) for i, d in enumerate(x.shape)]
        sized = getattr(aten, _RANDOM_LIKE[packet.__name__]).default
        new.call(sized, sizes, dtype=node.kwargs.get("dtype") or x.dtype)
    replace_node(gm, node, new)
    return True


def _aa_bicubic_weights(new: NewNodes, n_in, n_out, align_corners: bool, scale: float | None):
    """The [n_out, n_in] matrix of ATen's antialiased bicubic resampling along one axis (Keys' cubic,
    a = -0.5, stretched by the scale when downsampling, each row normalised to sum 1), built from
    aranges so that it needs no constant tensor. ``n_in`` and ``n_out`` are ints, or ``sym_size``
    nodes for symbolic sizes: the step and the stretch are then computed as 0-d tensors in the
    program, the stretch without a branch (``min(1 / step, 1)``)."""
    aten, a = torch.ops.aten, -0.5
    call = new.call
    if isinstance(n_in, int) and isinstance(n_out, int):
        if align_corners:
            step = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        else:
            step = 1.0 / scale if scale else n_in / n_out
        stretch = 1.0 / step if step >= 1.0 else 1.0
        half_step = 0.5 * step
    else:
        def scalar(value):  # a size node or a number, as a 0-d float32 tensor
            return call(aten.scalar_tensor.default, value, dtype=torch.float32)

        if align_corners:  # (n_in - 1) / (n_out - 1), 0 for a single output
            span = call(aten.clamp_min.default, call(aten.sub.Tensor, scalar(n_out), 1.0), 1.0)
            step = call(aten.where.self, call(aten.gt.Scalar, scalar(n_out), 1.0),
                        call(aten.div.Tensor, call(aten.sub.Tensor, scalar(n_in), 1.0), span), scalar(0))
        elif scale:
            step = scalar(1.0 / scale)
        else:
            step = call(aten.div.Tensor, scalar(n_in), scalar(n_out))
        stretch = call(aten.clamp_max.default, call(aten.reciprocal.default, step), 1.0)  # 1/0 = inf -> 1
        half_step = call(aten.mul.Tensor, step, 0.5)
    centers = call(aten.unsqueeze.default, call(aten.add.Tensor, call(aten.mul.Tensor, call(
        aten.arange.default, n_out, dtype=torch.float32), step), half_step), -1)
    taps = call(aten.unsqueeze.default, call(aten.add.Tensor, call(aten.arange.default, n_in, dtype=torch.float32), 0.5), 0)
    x = call(aten.abs.default, call(aten.mul.Tensor, call(aten.sub.Tensor, taps, centers), stretch))
    near = call(aten.add.Tensor, call(aten.mul.Tensor, call(aten.mul.Tensor, call(
        aten.sub.Tensor, call(aten.mul.Tensor, x, a + 2.0), a + 3.0), x), x), 1.0)  # ((a+2)x - (a+3))x^2 + 1
    far = call(aten.mul.Tensor, call(aten.sub.Tensor, call(aten.mul.Tensor, call(aten.add.Tensor, call(
        aten.mul.Tensor, call(aten.sub.Tensor, x, 5.0), x), 8.0), x), 4.0), a)  # (((x-5)x + 8)x - 4)a
    zero = call(aten.full.default, [], 0.0, dtype=torch.float32)
    w = call(aten.where.self, call(aten.lt.Scalar, x, 1.0), near,
             call(aten.where.self, call(aten.lt.Scalar, x, 2.0), far, zero))
    return call(aten.div.Tensor, w, call(aten.sum.dim_IntList, w, [-1], True))


@register_fx_node_fix("executorch")
def _fix_bicubic_aa_as_matmuls(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The ExecuTorch runtime has no kernel for ``aten::_upsample_bicubic2d_aa.out``
    (``F.interpolate(mode="bicubic", antialias=True)``: UnlimitedOcr resizes its position embeddings
    with it); the program lowers, then fails to load. The resampling is separable and linear: a
    weight matrix per axis, applied by two matmuls. Symbolic sizes (UnlimitedOcr's dynamic export
    resizes to the image's patch grid) build the matrices from ``sym_size`` reads.

    before: _upsample_bicubic2d_aa(x[..., H, W], [H', W'], align_corners, scales)
    after:  Wh[H', H] @ x @ Ww[W', W].T      # the weight matrices built from aranges

    A dtype other than float32 is left alone.
    """
    aten = torch.ops.aten
    if node.op != "call_function":
        return False
    if node.target is aten._upsample_bicubic2d_aa.default:
        args = dict(zip(("input", "output_size", "align_corners", "scales_h", "scales_w"), node.args))
        args.update(node.kwargs)
        scales = (args.get("scales_h"), args.get("scales_w"))
    elif node.target is aten._upsample_bicubic2d_aa.vec:
        args = dict(zip(("input", "output_size", "align_corners", "scale_factors"), node.args))
        args.update(node.kwargs)
        scales = tuple(args.get("scale_factors") or (None, None))
    else:
        return False
    x, out = fake_val(args["input"]), node.meta.get("val")
    if x is None or out is None or x.dtype != torch.float32:
        return False
    align = bool(args["align_corners"])
    requested = args.get("output_size")
    if requested is not None and len(requested) == 2 and all(isinstance(n, (int, torch.fx.Node)) for n in requested):
        h_out, w_out = requested  # ints, or the nodes reading the symbolic sizes
    elif isinstance(out.shape[-2], int) and isinstance(out.shape[-1], int):
        h_out, w_out = out.shape[-2], out.shape[-1]
    else:
        return False  # symbolic output sizes from scale factors alone: no node holds them
    new = NewNodes(gm.graph)
    with gm.graph.inserting_before(node):
        h, w = (_size_value(new, args["input"], x.dim() + d, x.shape[d]) for d in (-2, -1))
        rows = _aa_bicubic_weights(new, h, h_out, align, scales[0])
        cols = _aa_bicubic_weights(new, w, w_out, align, scales[1])
        resized = new.call(aten.matmul.default, rows, args["input"])
        new.call(aten.matmul.default, resized, new.call(aten.t.default, cols))
    replace_node(gm, node, new)
    return True


def buffers_keep_their_values(program) -> None:
    """Serialize every buffer's value, mutated or not. ExecuTorch gives a buffer the graph mutates "a
    meaningless initial state" (only shape and dtype are saved) unless its placeholder has
    ``meta["et_init_buffer"]``. A module that reassigns its buffer in forward
    (``self.pos_encoding = self.pos_encoding.to(dtype)``, CTRL) becomes such a mutation after
    to_edge, and the program then read zeros: CTRLModel's last_hidden_state was off by 2.9 on every
    element. Eager's buffers start with their values; so do the artifact's."""
    buffers = program.graph_signature.inputs_to_buffers
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.target in buffers:
            node.meta["et_init_buffer"] = True


# ── the exporter ─────────────────────────────────────────────────────────────


def missing_kernels(buffer: bytes, registered) -> list[str]:
    """The operators a .pte program calls (outside delegates) that the runtime has no kernel for,
    as ``namespace::op.overload``, in program order."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    registered = set(registered)
    names = []
    for plan in deserialize_pte_binary(buffer).program.execution_plan:
        for op in plan.operators:
            name = f"{op.name}.{op.overload}" if op.overload else op.name
            if name not in registered and name not in names:
                names.append(name)
    return names


# executorch/runtime/core/error.h: the codes a failed load reports, by name
_RUNTIME_ERRORS = {
    0x01: "Internal", 0x02: "InvalidState", 0x10: "NotSupported", 0x11: "NotImplemented",
    0x12: "InvalidArgument", 0x13: "InvalidType", 0x14: "OperatorMissing", 0x20: "NotFound",
    0x21: "MemoryAllocationFailed (the method's planned memory or a buffer could not be allocated)",
    0x22: "AccessFailed", 0x23: "InvalidProgram", 0x25: "OutOfResources",
    0x30: "DelegateInvalidCompatibility", 0x31: "DelegateMemoryAllocationFailed", 0x32: "DelegateInvalidHandle",
}


def runtime_error_name(message: str) -> str:
    """The name of the ExecuTorch error code in ``message`` ("... error: 0x:21" -> MemoryAllocationFailed)."""
    import re

    found = re.search(r"0x:?([0-9a-fA-F]+)", message)
    code = int(found.group(1), 16) if found else None
    return f"ExecuTorch error {_RUNTIME_ERRORS.get(code, 'code unknown to this suite')}"


def load_forward(buffer: bytes):
    """Load a .pte program and its ``forward`` method; a method that cannot load because the runtime
    lacks a kernel names the missing operators instead of an error code."""
    from executorch.runtime import Runtime, Verification

    runtime = Runtime.get()
    program = runtime.load_program(buffer, verification=Verification.Minimal)
    try:
        return program, program.load_method("forward")
    except RuntimeError as exc:
        missing = missing_kernels(buffer, runtime.operator_registry.operator_names)
        if not missing:
            raise RuntimeError(f"{exc}: {runtime_error_name(str(exc))}") from exc
        raise RuntimeError(
            f"the ExecuTorch runtime has no kernel for {', '.join(missing)}, which the program calls "
            "outside any delegate: lower the op to ops the runtime has (an executorch node fix) or "
            f"link a kernel library that registers it ({exc})"
        ) from exc


_RUNTIME_FAILURE_LINES = ("Check failed", "KernelCall failed", "Missing operator", "failed with error")


def execute_with_runtime_log(method, inputs):
    """``method.execute(inputs)``; when it fails, the error carries what the runtime logged about it.
    The runtime reports only a code ("method->execute() failed with error 0x12") and logs the cause
    ("Check failed (in.dim() == 3 || in.dim() == 4) ...", "KernelCall failed at instruction 0:9 in
    operator aten::convolution.out"), which a report never sees. Its log is captured during the call,
    at the file descriptor and at ``sys.stderr`` (the bindings write to either, depending on what
    stderr is), and passed on unchanged."""
    import contextlib
    import io
    import os
    import sys
    import tempfile

    sys.stderr.flush()
    python_log = io.StringIO()
    with tempfile.TemporaryFile() as fd_log:
        saved = os.dup(2)
        os.dup2(fd_log.fileno(), 2)
        try:
            with contextlib.redirect_stderr(python_log):
                return method.execute(inputs)
        except RuntimeError as exc:
            os.dup2(saved, 2)
            fd_log.seek(0)
            logged = fd_log.read().decode(errors="replace") + python_log.getvalue()
            lines = [line.strip() for line in logged.splitlines() if any(key in line for key in _RUNTIME_FAILURE_LINES)]
            if not lines:
                raise
            raise RuntimeError(f"{exc}; the runtime logged: {' | '.join(lines[:4])}") from exc
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            fd_log.seek(0)
            os.write(2, fd_log.read())
            sys.stderr.write(python_log.getvalue())


class ExecutorchArtifact(Artifact):
    backend = "executorch"
    file_name = "model.pte"

    def __init__(self, buffer: bytes, *, mutated_inputs: tuple[str, ...] = (), planned_bytes: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.buffer = buffer
        self.mutated_inputs = tuple(mutated_inputs)
        self.extra_metadata["mutated_inputs"] = list(self.mutated_inputs)
        try:
            self._program, self._method = load_forward(buffer)
        except MemoryError as exc:
            if planned_bytes is None:
                raise
            raise MemoryError(
                f"loading the program allocates its memory plan, {planned_bytes / 2**30:.1f} GiB for every dynamic "
                f"dim at its upper bound (max_dim {self.config.max_dim}), and this machine could not ({exc}): "
                "export with smaller bounds (ExecutorchConfig.max_dim, or dynamic_shapes with a max per dim)"
            ) from exc

    def _run(self, ordered):
        self._check_planned_sizes(ordered)
        outputs = execute_with_runtime_log(self._method, [t.contiguous() for t in ordered])
        outputs = [o if isinstance(o, torch.Tensor) else torch.as_tensor(o) for o in outputs]
        # the program returns the inputs forward mutated in place (``pixel_values *= mask``) ahead of
        # its outputs: write them back into the caller's tensors, as eager and the dynamo artifact do
        k = len(self.mutated_inputs)
        if k and len(outputs) == k + len(self.output_names):
            for name, value in zip(self.mutated_inputs, outputs[:k]):
                ordered[self.input_names.index(name)].copy_(value)
            outputs = outputs[k:]
        return outputs

    def _planned_input_sizes(self) -> list[tuple[int, ...] | None] | None:
        """Each input's planned sizes (its bound per dim) from the method's metadata, read once per
        artifact; None for a non-tensor input; None altogether for a runtime without these bindings."""
        if not hasattr(self, "_planned"):
            self._planned = self._read_planned_input_sizes()
        return self._planned

    def _read_planned_input_sizes(self) -> list[tuple[int, ...] | None] | None:
        try:
            meta = self._program.metadata("forward")
            count = meta.num_inputs()
        except Exception:  # noqa: BLE001  (a runtime without these bindings: its own error stands)
            return None
        planned = []
        for i in range(count):
            try:
                planned.append(tuple(meta.input_tensor_meta(i).sizes()))
            except Exception:  # noqa: BLE001  (not a tensor input)
                planned.append(None)
        return planned

    def _check_planned_sizes(self, ordered) -> None:
        """The runtime refuses an input larger than the memory its program planned for it with a bare
        code (``set_inputs`` 0x10 for a tensor planned static, 0x12 for one past its bound); name the
        input, the dim and the planned bound instead. The input checks take what torch.export allowed:
        a plan smaller than that means the lowering specialized or narrowed a dynamic dim (AutoformerModel's
        batch, planned at its traced 2 while its range was [2, 64]), which is the export's defect, so this
        is a RuntimeError and not an InputError that the shape checks would skip."""
        planned = self._planned_input_sizes()
        if planned is None or len(planned) != len(ordered):
            return
        for name, value, sizes in zip(self.input_names, ordered, planned):
            if sizes is None or len(sizes) != value.dim():
                continue
            for d, (size, bound) in enumerate(zip(value.shape, sizes)):
                if size <= bound:
                    continue
                spec = self.input_specs[name][2].get(d)
                narrowed = (f"; torch.export gave it the range [{spec['min']}, {spec['max']}] ({spec['symbol']}), "
                            "so the ExecuTorch lowering specialized or narrowed it"
                            if spec and (spec["max"] is None or spec["max"] > bound) else "")
                raise PlannedShapeError(
                    f"input {name!r} dim {d} is {size}, but the ExecuTorch program was planned for at most {bound}"
                    + narrowed)

    def _save_model(self, path):
        with open(path, "wb") as f:
            f.write(self.buffer)


class PlannedShapeError(RuntimeError):
    """An ExecuTorch artifact called with an input larger than its program's memory plan allows."""


class ExecutorchExporter(Exporter):
    backend = "executorch"
    config_class = ExecutorchConfig

    def export(self, model, inputs, config=None):
        config = config or ExecutorchConfig()
        if config.backend not in _BACKEND_PREPARE:
            raise ValueError(f"unknown ExecuTorch backend {config.backend!r}; registered: {sorted(_BACKEND_PREPARE)}")
        fired = FiredLog()
        model, inputs, partitioners = _BACKEND_PREPARE[config.backend](model, dict(inputs))
        if config.dynamic_shapes is not None:
            config = dataclasses.replace(config, dynamic_shapes=bound_dynamic_shapes(config.dynamic_shapes, config.max_dim))
        patches = self.registry.patches("dynamo", "executorch")
        torch_patches = [p for p in patches if not p.path.startswith(_EXECUTORCH_INTERNALS)]
        et_patches = [p for p in patches if p.path.startswith(_EXECUTORCH_INTERNALS)]
        et_patches += shape_arithmetic_patches(torch_patches)  # to_edge re-traces the sizes too

        def export_and_lower(config):
            traced = run_stage("export", self.backend, lambda: trace(model, inputs, config, torch_patches, fired), fired)
            ordered = [inputs[name] for name in traced.input_names]
            retrace = lambda: trace(model, inputs, config, torch_patches, fired).program  # noqa: E731
            lowered = run_stage("lower", self.backend,
                                lambda: self._lower(traced.program, config, partitioners, et_patches, fired, ordered, retrace),
                                fired)
            return traced, lowered

        traced, lowered = export_and_lower(config)
        budget = config.memory_budget_mb << 20
        exact = False
        if lowered.planned_bytes > budget and exact_share(lowered.graph_module) < 0.5:
            # interval arithmetic planned some sizes far past their true maxima (Swin2SR's window
            # dims): plan every size at its true maximum, keeping the bounds
            fired.add("fix:executorch:exact_bounds_to_fit_memory")
            exact = True
            with exact_planning_bounds():
                traced, lowered = export_and_lower(config)
        while lowered.planned_bytes > budget:
            smaller = halved_max_dim(config, inputs)
            if smaller is None:
                break  # the artifact reports what it plans; loading it may still fail for memory
            fired.add("fix:executorch:bounds_halved_to_fit_memory")
            config = dataclasses.replace(config, max_dim=smaller)
            with exact_planning_bounds() if exact else contextlib.nullcontext():
                traced, lowered = export_and_lower(config)
        return run_stage(
            "run", self.backend,
            lambda: ExecutorchArtifact(lowered.buffer, mutated_inputs=[traced.input_names[i] for i in lowered.mutated],
                                       planned_bytes=lowered.planned_bytes, **traced.artifact_kwargs(fired, config),
                                       extra_metadata={"executorch_backend": config.backend,
                                                       "planned_bytes": lowered.planned_bytes,
                                                       "max_dim": config.max_dim}),
            fired,
        )

    def _fixed(self, program, config, fired) -> torch.export.ExportedProgram:
        program = apply_fx_program_fixes(self.registry.fixes("executorch", "program"), program, fired, config=config)
        apply_fx_node_fixes(self.registry.fixes("executorch", "node"), program.graph_module, fired)
        return program

    def _lower(self, program, config, partitioners, et_patches, fired, inputs=(), retrace=None) -> Lowered:
        """Lower ``program``; ``retrace()`` exports it again, for a retry that needs a program no
        lowering has touched."""
        program = self._fixed(program, config, fired)
        try:
            return _lower_program(program, partitioners, et_patches, fired)
        except AssertionError as exc:
            # fusing XNNPACK's partitions one by one made one depend on another both ways (FlavaForPreTraining):
            # lower again with one partition per op, which cannot form a cycle
            per_op = per_op_partitioners(partitioners)
            if "found dependency cycles" not in str(exc) or per_op is None:
                raise
            retry, partitioners = "fix:executorch:per_op_partitions_on_cycle", per_op
        except RuntimeError as exc:
            # only when planning needs it: a size the graph already bounds (a slice of a known length)
            # must keep running for any value up to that bound, not just up to the traced one
            if "finite upper bound" not in str(exc) or not inputs:
                raise
            if retrace is not None:
                # the failed lowering re-traced this program and renamed its fresh unbacked symbols to
                # the program's own: re-tracing it again then meets its own names ("u1 possible memo
                # disaster", Lfm2Vl); a fresh export has a fresh shape environment
                program = self._fixed(retrace(), config, fired)
            # a scalar no input can change is an int (Ernie 4.5-VL's offsets); what stays data-dependent
            # is bounded by the value it takes on the traced inputs
            try:
                values = traced_unbacked_values(program, list(inputs))
            except Exception:  # noqa: BLE001  (the graph does not run eagerly on its inputs: fold nothing,
                values = {}    # the lowering's own error stands)
            folded = fold_input_independent_scalars(program, values)
            if folded:
                fired.add("fix:executorch:fold_input_independent_scalars")
            bounded = bound_unbacked_sizes_by_trace(program, list(inputs))
            if not (bounded or folded):
                raise
            for name in sorted(bounded or ()):
                fired.add(name)
            retry = None
        if retry:
            fired.add(retry)
        _forget_pending_unbacked(program)
        return _lower_program(program, partitioners, et_patches, fired)


class Lowered(NamedTuple):
    buffer: bytes  # the .pte program
    mutated: tuple[int, ...]  # mutated_user_inputs
    planned_bytes: int  # the memory its plan allocates when the method loads (every planned buffer)
    graph_module: Any = None  # the lowered program's graph, its tensor specs planned (exact_share reads it)


def planned_bytes(program) -> int:
    """What loading ``program`` (an ExecuTorch ``Program``) allocates for its planned tensors: each
    plan's non-constant buffers, sized for the upper bounds of every dynamic dim."""
    return sum(sum(plan.non_const_buffer_sizes) for plan in program.execution_plan)


def halved_max_dim(config: ExecutorchConfig, inputs: dict[str, Any]) -> int | None:
    """The bound to export again with when the plan is too large: half of ``config.max_dim``, but not
    below the largest traced size among the dims it bounds, so every traced shape stays valid; None when
    nothing would change (explicit ``dynamic_shapes`` keep their bounds; a static export plans exactly).

    VJEPA2Model: its 2 x (T//2)(H//8)(W//8) predictor tokens reach 4,096 with every dim at 64, and an
    attention matrix per layer of 64 x 4 x 4,096^2 floats (16 GiB): load_method raised std::bad_alloc.
    Exported again at 32 it plans 398 MiB and passes, 3 dynamic shapes compared (``python -m sweeps.repro
    executorch-dynamic-VJEPA2Model``, 566 s beside a 2-worker sweep, two lowerings).
    """
    if config.dynamic_shapes is not None or not config.dynamic:
        return None
    traced = [s for t in inputs.values() if isinstance(t, torch.Tensor) for s in t.shape if s <= config.max_dim]
    smaller = max(config.max_dim // 2, max(traced, default=1))
    return smaller if smaller < config.max_dim else None


def mutated_user_inputs(program: torch.export.ExportedProgram) -> tuple[int, ...]:
    """Positions of the user inputs forward mutates in place, in the order the lowered program returns
    their new values (ahead of its outputs). The traced program still has the in-place op; the edge
    program, functionalized, lists the mutation. TvpModel's visual prompter does ``pixel_values *=
    mask``: the runtime returned 3 outputs where 2 were named, and the artifact refused its own run."""
    signature = program.graph_signature
    placeholders = [s.arg.name for s in signature.input_specs if s.kind == InputKind.USER_INPUT]
    return tuple(placeholders.index(s.target) for s in signature.output_specs if s.kind == OutputKind.USER_INPUT_MUTATION)


def per_op_partitioners(partitioners: list) -> list | None:
    """The partitioners with every XNNPACK one in per-op mode (each supported op its own delegate), or
    None when there is no XNNPACK partitioner to change. torch.fx's ``fuse_as_graphmodule`` refuses a
    partition that would depend on itself through another ("Invalid partition, found dependency
    cycles"); single-op partitions cannot. The program runs more delegate calls, with the same ops."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    if not any(isinstance(p, XnnpackPartitioner) for p in partitioners):
        return None
    return [XnnpackPartitioner(per_op_mode=True) if isinstance(p, XnnpackPartitioner) else p for p in partitioners]


def _forget_pending_unbacked(program: torch.export.ExportedProgram) -> None:
    """A lowering that failed midway leaves the unbacked symbols it had just created pending in the
    program's shape environment, and the next lowering then stops on them ("Pending unbacked
    symbols {u8, ...} not in returned outputs"): drop them before lowering again."""
    for node in program.graph.nodes:
        for _, size in _symbolic_sizes(node):
            size.node.shape_env.pending_fresh_unbacked_symbols.clear()
            return


@contextlib.contextmanager
def cpu_conv_heuristics_off():
    """Lower with oneDNN (mkldnn) and NNPACK off, as torch.export traces and decomposes.

    Cause. The fake kernel of ``aten.convolution`` asks ATen which CPU kernel eager mode would pick
    (``_select_conv_backend``) to give its output the memory format that kernel would. With oneDNN
    on, that choice compares the batch with 16 for an unstrided, undilated conv (ATen's CPU kernel
    heuristics), and with a backed batch this is a guard: the edge passes' re-trace records
    ``batch < 16`` and narrows the batch's range, and ExecuTorch then plans the program for it.
    torch.export turns these backends off while it traces and runs decompositions
    (``_ignore_backend_decomps``), so its ranges never see the guard; ExecuTorch's passes run with
    them on. EfficientLoFTRModel, whose pairs are folded into a conv batch of ``2*s99``, got
    ``2*s99 < 16`` and a program planned for batch 7 of the [2, 64] torch.export allowed.

    This only changes the memory format the fake conv reports while lowering; the program and the
    runtime kernels are ExecuTorch's. Remove it when ExecuTorch's passes trace with ATen's backend
    selection off (executorch#19262, for XNNPACK's own passes only, ran them with
    ``backed_size_oblivious`` against the same kind of narrowing)."""
    mkldnn = torch.backends.mkldnn.set_flags(_enabled=False, _fp32_precision=None)  # the rest as they are
    nnpack = torch.backends.nnpack.set_flags(False)
    try:
        yield
    finally:
        torch.backends.mkldnn.set_flags(*mkldnn)
        torch.backends.nnpack.set_flags(*nnpack)


def _lower_program(program, partitioners, et_patches, fired) -> Lowered:
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    # no_grad: a program that still has complex ops fails here with grad on ("view_as_complex_copy
    # does not support automatic differentiation for outputs with complex dtype")
    with apply_patches(et_patches, fired), torch.no_grad(), cpu_conv_heuristics_off():
        edge = to_edge_transform_and_lower(
            program, partitioner=partitioners, compile_config=EdgeCompileConfig(_check_ir_validity=False)
        )
        buffers_keep_their_values(edge.exported_program())
        lowered = edge.to_executorch()
        return Lowered(lowered.buffer, mutated_user_inputs(edge.exported_program()), planned_bytes(lowered.executorch_program),
                       lowered.exported_program().graph_module)


from .complex_as_real import _fix_complex_as_real  # noqa: E402,F401  (registers on import)
from .patch_partition_legalize import _patch_partitions_legalized_when_needed  # noqa: E402,F401  (registers on import)
from .patch_guards_code_cache import _patch_guards_code_printed_once  # noqa: E402,F401  (registers on import)
from .patch_planning_bounds import _patch_unbounded_sizes_planned_at_their_maximum  # noqa: E402,F401  (registers on import)
from .patch_planning_bounds import exact_planning_bounds, exact_share  # noqa: E402
