"""ExecuTorch speed patch: XNNPACK's per-partition pass pipeline skips the passes with nothing to act on.

Cause. XNNPACK's ``preprocess`` (executorch/backends/xnnpack/xnnpack_preprocess.py) runs its whole pass
pipeline, 17 passes (``XNNPACKPassManager``, executorch/backends/xnnpack/_passes/__init__.py), on every
delegated partition, and each pass ends by re-tracing the partition with fake tensors
(``ExportPass.call``) and building a new ``ExportedProgram`` that is verified before and after, whether or
not the pass found anything to change. A 2-layer tiny Llama is cut into 13 partitions: 221 pass runs,
of which cProfile and a graph diff found 16 that changed a graph (``XNNPACKRemoveCloneOpsTransform`` 4,
``DimOrderOpsRevertPass`` 12); the rest re-traced an unchanged graph, about 0.02 s each.

What this changes (during the ExecuTorch lowering only). Before each pass, the partition's graph is
checked for the ops that pass acts on (``PASS_TRIGGERS``, read from each pass's source); a pass whose
ops are absent is not run, so the partition keeps the graph the previous pass produced instead of a
re-trace of it. The check is made on the graph as it stands at that pass, so a pass that adds ops a
later one acts on (``DecomposeBatchNorm`` adds a convolution, which ``Conv1dUnsqueezePass`` handles)
still reaches it. Passes without a trigger here (``ConstPropPass``, ``ChannelsLastTaggedReshapePass``,
the clone and dim-order passes) always run.

    before: 17 passes per partition, each re-tracing and verifying the partition
    after:  the passes whose ops occur in the partition (Llama: 4-5 of 17)

Why the program is the same: a pass skipped here finds nothing to rewrite, so running it would only
re-trace the same ops in the same order; the node visitors then serialize the same XNNPACK graph.
``benchmarks/lowering_speed.py`` checks the ``.pte`` bytes with and without this patch.

Remove it when XNNPACK's passes skip their re-trace when they change nothing (or the pipeline runs
once over the whole program instead of per partition).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from exporters.utils import ActedFlag, register_patch

PATH = "executorch.backends.xnnpack._passes.XNNPACKPassManager.transform"


def _targets(graph: torch.fx.Graph) -> set:
    return {node.target for node in graph.nodes if node.op == "call_function"}


def _names(targets: set) -> set[str]:
    return {getattr(t, "__name__", "") for t in targets}


def _any_pattern_fits(patterns: Callable[[], list]) -> Callable[[set], bool]:
    """A ``SubgraphMatcher`` pass (SDPA, bilinear upsample) can only match where every op of one of
    its pattern graphs occurs: it compares call_function targets for equality."""

    def may_act(targets: set) -> bool:
        return any(_targets(p.graph) <= targets for p in patterns())

    return may_act


@functools.cache
def pass_triggers() -> dict[str, Callable[[set], bool]]:
    """``{pass class name: may_act(call_function targets of the partition)}``: False only when the pass
    has nothing to act on (each predicate is the first test of the pass's own ``call``)."""
    from executorch.backends.xnnpack._passes.decompose_batch_norm import DecomposeBatchNorm
    from executorch.backends.xnnpack._passes.fuse_activation_pass import FuseActivationPass
    from executorch.backends.xnnpack.partition.graphs import bilinear_2d, sdpa
    from executorch.exir.dialects._ops import ops as exir_ops

    edge = exir_ops.edge
    batch_norm = set(DecomposeBatchNorm.BATCH_NORM_OPS)
    return {
        "ConvertToUpsampleBilinear2d": _any_pattern_fits(lambda: list(bilinear_2d.get_graphs_dict())),
        "ConvertToLinearPass": lambda t: bool(t & {edge.aten.mm.default, edge.aten.addmm.default, edge.aten.bmm.default}),
        # q/dq nodes (is_quant / is_dequant): every quantize or dequantize op has it in its name
        "PropagateCustomMetaPass": lambda t: any("quantize" in n for n in _names(t)),
        "ConvertToSDPAPass": _any_pattern_fits(sdpa.get_graphs),
        "FuseBatchNormPass": lambda t: bool(t & batch_norm),
        "DecomposeBatchNorm": lambda t: bool(t & batch_norm),
        "FuseActivationPass": lambda t: bool(t & set(FuseActivationPass.FUSEABLE_ACTIVATIONS)),
        "DecomposeConcatenate": lambda t: "aten.cat.default" in _names(t),
        "RemoveGetItemPass": lambda t: bool(_names(t) & {"aten.max_pool2d_with_indices.default", "aten.max.dim"}),
        "InsertPadQDQPass": lambda t: edge.aten.constant_pad_nd.default in t,
        "Conv1dUnsqueezePass": lambda t: "aten.convolution.default" in _names(t),
        "PReLUReshapePass": lambda t: edge.aten._prelu_kernel.default in t,
        "RemoveRedundantCopyPass": lambda t: edge.aten._to_copy.default in t,
    }


@register_patch("executorch", PATH)
def _patch_idle_xnnpack_passes_skipped(original):
    """XNNPACK ran all 17 of its passes on every partition, each re-tracing it even when it found
    nothing to change: a pass whose ops do not occur in the partition is not run.

    before: for pass in 17 passes: ep = _transform(ep, pass(ep))
    after:  the same, skipping a pass whose PASS_TRIGGERS predicate is False on the current graph
    """

    acted = ActedFlag()  # set when a pass was skipped

    @functools.wraps(original)
    def transform(self):
        triggers = pass_triggers()
        passes = self.passes
        try:
            for pass_ in passes:
                may_act = triggers.get(pass_.__name__)
                if may_act is not None and not may_act(_targets(self._exported_program.graph_module.graph)):
                    acted.set()
                    continue
                self.passes = [pass_]
                self._exported_program = original(self)
        finally:
            self.passes = passes
        return self._exported_program

    transform.acted = acted
    return transform
