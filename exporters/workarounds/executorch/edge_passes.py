"""ExecuTorch speed patch: five passes over the edge program are not run on a graph holding nothing they rewrite.

Cause. Turning the decomposed program into the edge dialect (``_generate_edge_program``,
executorch/exir/program/_program.py) runs about a dozen ``ExportPass``-es over the whole program, each
re-interpreting every node with fake tensors (``ExportPass.call``) whatever it finds, and so does
``to_executorch``. Five of them rewrite one kind of node and pass every other one through unchanged (``call_operator``):

- ``NormalizeTransposePass`` (exir/passes/normalize_transpose_pass.py) rewrites ``aten.t.default``;
- ``ReplaceBrokenOpsWithFunctionalOpsPass`` (exir/passes/replace_broken_ops_with_function_ops_pass.py)
  rewrites view ops (``op.is_view``) into their ``*_copy`` form; it runs after
  ``ReplaceViewOpsWithViewCopyOpsPass``, which has already done so for the views it knows;
- ``ScalarToTensorPass`` (exir/passes/scalar_to_tensor_pass.py) wraps a Python float, int or bool
  passed where the op's schema takes a Tensor;
- ``SymToTensorPass`` (exir/passes/sym_to_tensor_pass.py) wraps a SymInt/SymFloat/SymBool passed
  there (the check here is wider: any node whose value is not a tensor);
- ``LegalizePortableDimOrderPass`` (exir/passes/legalize_portable_dim_order_pass.py, run by
  ``to_executorch``) puts a contiguous copy before the five portable ops of its ``_target_ops``.

On a 2-layer tiny Llama the first four took 0.92 s of a 5.8 s static export and 1.93 s of a 16.5 s dynamic
one (each timed around ``PassBase.__call__``); the first two found nothing to rewrite in either. The
fifth took 0.47 s of a 10.1 s dynamic ViT export.

What this changes (during the ExecuTorch lowering only). The pass's ``call`` first looks for what it
rewrites in the graph and its nested graph modules (the same test as the pass's own, on each node's
schema arguments for the last two); when there is none it returns the graph as it is
(``PassResult(graph_module, False)``) instead of a re-trace of it.

    before: NormalizeTransposePass()(gm)   -> a re-trace of gm, every op passed through
    after:  gm itself when no node is aten.t.default (else the pass runs as before)

Why the program is the same: every op of such a graph takes the pass-through branch, so the re-trace
would replay the same ops in the same order; ``benchmarks/lowering_speed.py`` checks the ``.pte`` bytes
with and without this patch.

Remove it when ExecuTorch's pass-through ``ExportPass``-es return their input when they rewrite nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from exporters.utils import ActedFlag, register_patch

NORMALIZE_TRANSPOSE = "executorch.exir.passes.normalize_transpose_pass.NormalizeTransposePass.call"
REPLACE_BROKEN_OPS = "executorch.exir.passes.replace_broken_ops_with_function_ops_pass.ReplaceBrokenOpsWithFunctionalOpsPass.call"
SCALAR_TO_TENSOR = "executorch.exir.passes.scalar_to_tensor_pass.ScalarToTensorPass.call"
SYM_TO_TENSOR = "executorch.exir.passes.sym_to_tensor_pass.SymToTensorPass.call"
LEGALIZE_DIM_ORDER = "executorch.exir.passes.legalize_portable_dim_order_pass.LegalizePortableDimOrderPass.call"


def _any_node(graph_module: torch.fx.GraphModule, rewritten: Callable[[torch.fx.Node], bool]) -> bool:
    return any(node.op == "call_function" and rewritten(node)
               for module in graph_module.modules() if isinstance(module, torch.fx.GraphModule)
               for node in module.graph.nodes)


def _tensor_slots(node: torch.fx.Node):
    """The values ``map_args`` hands a pass for the schema arguments typed ``Tensor`` (exir/pass_base.py)."""
    if not isinstance(node.target, torch._ops.OpOverload):
        return
    for i, schema in enumerate(node.target._schema.arguments):
        if not isinstance(schema.type, torch.TensorType):
            continue
        if schema.name in node.kwargs:
            yield node.kwargs[schema.name]
        elif not schema.kwarg_only and i < len(node.args):
            yield node.args[i]


def python_scalar_in_tensor_slot(node: torch.fx.Node) -> bool:
    """ScalarToTensorPass's ``try_coerce``: a float, int or bool where the schema takes a Tensor."""
    return any(isinstance(value, (float, int, bool)) for value in _tensor_slots(node))


def non_tensor_node_in_tensor_slot(node: torch.fx.Node) -> bool:
    """SymToTensorPass's ``is_sym`` (a SymInt/SymFloat/SymBool node where the schema takes a Tensor),
    widened to any node whose value is not known to be a tensor."""
    return any(isinstance(value, torch.fx.Node) and not isinstance(value.meta.get("val"), torch.Tensor)
               for value in _tensor_slots(node))


def _skipped_when_idle(original, rewritten: Callable[[torch.fx.Node], bool]):
    from torch.fx.passes.infra.pass_base import PassResult

    acted = ActedFlag()  # set when a re-trace was skipped

    @functools.wraps(original)
    def call(self, graph_module):
        if _any_node(graph_module, rewritten):
            return original(self, graph_module)
        acted.set()
        return PassResult(graph_module, False)

    call.acted = acted
    return call


@register_patch("executorch", NORMALIZE_TRANSPOSE)
def _patch_normalize_transpose_when_present(original):
    """NormalizeTransposePass re-traced the whole program to rewrite ``aten.t``: not run when no node is one.

    before: NormalizeTransposePass()(gm) -> re-trace    after: gm, when no aten.t.default
    """
    return _skipped_when_idle(original, lambda node: node.target == torch.ops.aten.t.default)


@register_patch("executorch", REPLACE_BROKEN_OPS)
def _patch_view_ops_functionalized_when_present(original):
    """ReplaceBrokenOpsWithFunctionalOpsPass re-traced the whole program to rewrite view ops: not run when
    no node is one.

    before: ReplaceBrokenOpsWithFunctionalOpsPass()(gm) -> re-trace    after: gm, when no view op
    """
    return _skipped_when_idle(original, lambda node: bool(getattr(node.target, "is_view", False)))


@register_patch("executorch", SCALAR_TO_TENSOR)
def _patch_scalars_to_tensors_when_present(original):
    """ScalarToTensorPass re-traced the whole program to wrap Python scalars passed where a Tensor is
    expected: not run when no node has one.

    before: ScalarToTensorPass()(gm) -> re-trace    after: gm, when no scalar sits in a Tensor argument
    """
    return _skipped_when_idle(original, python_scalar_in_tensor_slot)


@register_patch("executorch", SYM_TO_TENSOR)
def _patch_syms_to_tensors_when_present(original):
    """SymToTensorPass re-traced the whole program to wrap symbolic scalars passed where a Tensor is
    expected: not run when no node has a non-tensor node in a Tensor argument.

    before: SymToTensorPass()(gm) -> re-trace    after: gm, when every Tensor argument is a tensor node
    """
    return _skipped_when_idle(original, non_tensor_node_in_tensor_slot)


@register_patch("executorch", LEGALIZE_DIM_ORDER)
def _patch_portable_dim_order_legalized_when_present(original):
    """LegalizePortableDimOrderPass (to_executorch) re-traced the whole program to put a contiguous copy
    before the few portable ops that need one (its ``_target_ops``: pooling, mean, sum, expand_copy):
    not run when no node is one of them.

    before: LegalizePortableDimOrderPass()(gm) -> re-trace    after: gm, when none of its target ops
    """
    from executorch.exir.passes.legalize_portable_dim_order_pass import LegalizePortableDimOrderPass

    return _skipped_when_idle(original, lambda node: node.target in LegalizePortableDimOrderPass._target_ops)
