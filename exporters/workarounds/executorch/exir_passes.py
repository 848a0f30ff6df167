"""ExecuTorch patches on exir's own passes: dim orders of symbolic strides, and view_copy kept dynamic.
"""

from __future__ import annotations

import functools
import math

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from exporters.utils import register_patch


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
