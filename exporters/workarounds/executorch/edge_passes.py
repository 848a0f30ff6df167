"""ExecuTorch speed patch: two of the edge passes are not run on a graph holding none of the ops they rewrite.

Cause. Turning the decomposed program into the edge dialect (``_generate_edge_program``,
executorch/exir/program/_program.py) runs about a dozen ``ExportPass``-es over the whole program, each
re-interpreting every node with fake tensors (``ExportPass.call``) whatever it finds. Two of them
rewrite one kind of op and pass every other op through unchanged (``call_operator``):

- ``NormalizeTransposePass`` (exir/passes/normalize_transpose_pass.py) rewrites ``aten.t.default``;
- ``ReplaceBrokenOpsWithFunctionalOpsPass`` (exir/passes/replace_broken_ops_with_function_ops_pass.py)
  rewrites view ops (``op.is_view``) into their ``*_copy`` form; it runs after
  ``ReplaceViewOpsWithViewCopyOpsPass``, which has already done so for the views it knows.

On a 2-layer tiny Llama the two took 0.34 s of a 5.8 s static export and 0.87 s of a 16.5 s dynamic
one (each timed around ``PassBase.__call__``), with none of their ops in the graph.

What this changes (during the ExecuTorch lowering only). The pass's ``call`` first looks for its op in
the graph and its nested graph modules; when there is none it returns the graph as it is
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


def _any_node(graph_module: torch.fx.GraphModule, rewritten: Callable[[object], bool]) -> bool:
    return any(node.op == "call_function" and rewritten(node.target)
               for module in graph_module.modules() if isinstance(module, torch.fx.GraphModule)
               for node in module.graph.nodes)


def _skipped_when_idle(original, rewritten: Callable[[object], bool]):
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
    return _skipped_when_idle(original, lambda target: target == torch.ops.aten.t.default)


@register_patch("executorch", REPLACE_BROKEN_OPS)
def _patch_view_ops_functionalized_when_present(original):
    """ReplaceBrokenOpsWithFunctionalOpsPass re-traced the whole program to rewrite view ops: not run when
    no node is one.

    before: ReplaceBrokenOpsWithFunctionalOpsPass()(gm) -> re-trace    after: gm, when no view op
    """
    return _skipped_when_idle(original, lambda target: bool(getattr(target, "is_view", False)))
