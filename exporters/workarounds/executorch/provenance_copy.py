"""ExecuTorch speed patch: a node's provenance chain is shared, not deep-copied, on every pass.

Cause. Every pass that re-creates a node (each ``ExportPass`` re-interpreting a graph, every
``run_decompositions``, each of XNNPACK's 17 passes per delegate partition) records where the new
node came from: ``torch.fx.traceback.NodeSource(node)`` (torch/fx/traceback.py), whose ``__init__``
``copy.deepcopy``-s the old node's whole ``meta["from_node"]`` chain. The chain grows by one level
per pass, so the copies grow with the number of passes: cProfile of a 2-layer tiny Llama's ExecuTorch
export (static) put 3.2 s of 19.3 s in ``copy.deepcopy``, all but 0.2 s of it from this ``__init__``.

What this changes (during the ExecuTorch lowering only). The new ``NodeSource`` gets a new list
holding the same ``NodeSource`` objects instead of copies of them. Nothing mutates a ``NodeSource``
once built (torch and ExecuTorch only append to a node's own ``meta["from_node"]`` list, which is
still copied; ``from_dict`` builds new objects; ``_dict`` and ``_action_string`` are caches of the
fields), so the chain reads the same: equal ``to_dict()``, the same ``print_readable()``. The
provenance is debug metadata: the ``.pte`` does not contain it, and ``benchmarks/lowering_speed.py``
checks the program's bytes are identical with and without this patch.

    before: NodeSource(node).from_node = copy.deepcopy(node.meta["from_node"])
    after:  NodeSource(node).from_node = list(node.meta["from_node"])

Remove it when torch shares the provenance chain itself (its entries are never mutated).
"""

from __future__ import annotations

from exporters.utils import register_patch

PATH = "torch.fx.traceback.NodeSource.__init__"


@register_patch("executorch", PATH)
def _patch_provenance_shared_not_copied(original):
    """Each pass deep-copied every node's provenance chain (``meta["from_node"]``): the new record
    shares the old records, which nothing mutates.

    before: NodeSource(node)   (deep copy of the whole chain, per node, per pass)
    after:  the same record, its ``from_node`` a new list of the same entries
    """

    def __init__(self, node=None, pass_name="", action=None):
        original(self, None, pass_name, action)
        if node:
            self.node_info = self.NodeInfo(name=node.name, target=str(node.target), graph_id=id(node.graph))
            self.from_node = list(node.meta["from_node"]) if "from_node" in node.meta else []

    return __init__
