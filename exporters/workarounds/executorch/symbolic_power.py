"""ExecuTorch patch: a power in the program's symbolic size arithmetic becomes multiplications.

Cause. ExecuTorch runs a program's symbolic size arithmetic as ``executorch_prim`` ops: ``EdgeToBackendOpsPass``
(exir/passes/replace_edge_with_backend_pass.py) maps ``operator.add``, ``mul``, ``floordiv``, ... to them
(``_PYTHON_SYM_OPS_TO_EXECUTORCH_SYM_OPS``), and there is no power among them. torch.export writes one where it
infers a view's ``-1`` from a product of symbolic sizes; the decomposition inside ``to_edge`` re-traces it, so it
appears after our node fixes have run. An int8 decode step with dynamic batch and cache length failed at
lowering: "InternalError: invalid target for call_function <built-in function pow>" (``pow(s, 2)`` for
``view(x, [b, s, -1, 8])``, tiny Llama, export_for_generation with quantization={'decode': int8(...)}).

What this changes (during the ExecuTorch lowering only). Before the pass maps the symbolic ops, a power of a
symbolic int by a literal integer exponent from 1 to 8 becomes that many multiplications, which the pass then
maps to ``executorch_prim.mul``. Any other power is left for the pass (and its error) as before.

    before: p = pow(s, 2)        -> InternalError at emit
    after:  p = mul(s, s)        -> executorch_prim.mul.Scalar

Remove when: ExecuTorch has a power among its symbolic prim ops.
"""

from __future__ import annotations

import functools
import operator

import torch

from exporters.utils import ActedFlag, register_patch


def powers_as_products(graph_module: torch.fx.GraphModule) -> int:
    """Rewrite ``pow(symint, n)`` (1 <= n <= 8, a literal int) into multiplications in every graph module;
    return how many."""
    count = 0
    for module in graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        before = count
        for node in list(module.graph.nodes):
            if node.op != "call_function" or node.target is not operator.pow or len(node.args) != 2:
                continue
            base, exponent = node.args
            if not isinstance(base, torch.fx.Node) or isinstance(exponent, bool) or not isinstance(exponent, int) \
                    or not 1 <= exponent <= 8 or not isinstance(base.meta.get("val"), torch.SymInt):
                continue
            with module.graph.inserting_before(node):
                product = base
                for _ in range(exponent - 1):
                    product = module.graph.call_function(operator.mul, (product, base))
                    product.meta.update(node.meta)
            node.replace_all_uses_with(product)
            module.graph.erase_node(node)
            count += 1
        if count > before:
            module.recompile()
    return count


@register_patch("executorch", "executorch.exir.passes.replace_edge_with_backend_pass.EdgeToBackendOpsPass.call")
def _patch_symbolic_powers_as_products(original):
    acted = ActedFlag()

    @functools.wraps(original)
    def call(self, graph_module):
        if powers_as_products(graph_module):
            acted.set()
        return original(self, graph_module)

    call.acted = acted  # fired only where a power was rewritten
    return call
