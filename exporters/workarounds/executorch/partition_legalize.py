"""ExecuTorch patch: fusing each delegate partition re-sorts the whole graph only when it must.

Cause. ``to_backend`` fuses the partitions one at a time (executorch/exir/backend/backend_api.py,
``_create_partitions_in_graph_module``). For each, ``create_submodule_from_nodes``
(executorch/exir/lowered_backend_module.py) calls torch's ``legalize_graph``, which copies every
node of the program into a new graph in topological order and assigns it to the module: that
assignment regenerates and recompiles the module's Python code. So a program of N nodes cut into
P partitions costs P full copies and P full code generations, quadratic in the program's size.
A graph that XNNPACK cannot take whole (a recurrence, shape arithmetic between the partitions) has
hundreds of partitions: py-spy on ``python -m sweeps.repro executorch-static-Qwen3_5TextModel`` put
27% of its samples in ``legalize_graph`` (18% recompiling, 7% copying nodes), inside the fusing.

What this changes (during that fusing only). The fused call is inserted after the partition's last
output, which leaves the graph in topological order unless a node between two of the partition's
outputs used the earlier one. The check for that is one pass over the nodes without copying; when
the order holds, the re-sort is skipped, and the module's code is regenerated once when all
partitions are fused. When it does not hold, torch's ``legalize_graph`` runs as before.

    before: per partition: copy all N nodes, sort, regenerate the code    (P x N)
    after:  per partition: check the order (N lookups); code once at the end

What it cannot change: which nodes each partition holds, or what any node computes. Both orders are
topological; the kept one is the order the program already had (upstream's sort is not stable and
also only guarantees a topological order).

Remove it when ExecuTorch fuses partitions with a single sort at the end (as torch's own
``fuse_by_partitions`` does).
"""

from __future__ import annotations

import functools

import torch

from exporters.utils import ActedFlag, register_patch


def in_topological_order(graph: torch.fx.Graph) -> bool:
    """Whether every node of ``graph`` comes after all the nodes it reads."""
    seen: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if any(arg not in seen for arg in node.all_input_nodes):
            return False
        seen.add(node)
    return True


@register_patch("executorch", "executorch.exir.backend.backend_api._create_partitions_in_graph_module")
def _patch_partitions_legalized_when_needed(original):
    """Fusing each partition re-sorted and recompiled the whole program (quadratic in its size): it
    re-sorts only when the fused call broke the order, and recompiles once at the end.

    before: per partition: legalize_graph(gm)        (copy + codegen of every node)
    after:  per partition: in_topological_order(gm.graph) or legalize_graph(gm); gm.recompile() once
    """

    acted = ActedFlag()  # set when a call skipped at least one re-sort

    @functools.wraps(original)
    def create_partitions(tagged_graph_module, *args, **kwargs):
        import executorch.exir.lowered_backend_module as fusing

        legalize = fusing.legalize_graph
        skipped = []

        def legalize_when_needed(gm):
            if gm is tagged_graph_module and in_topological_order(gm.graph):
                skipped.append(gm)
                return gm
            return legalize(gm)

        fusing.legalize_graph = legalize_when_needed
        try:
            result = original(tagged_graph_module, *args, **kwargs)
        finally:
            fusing.legalize_graph = legalize
        if skipped:
            tagged_graph_module.recompile()
            acted.set()
        return result

    create_partitions.acted = acted  # fired only on programs with a partition to fuse
    return create_partitions
