"""ExecuTorch speed patch: the edge lowering's last ``run_decompositions`` is skipped when it has nothing to decompose.

Cause. ``to_edge_transform_and_lower`` re-traces the program three times before it reaches the edge
dialect (``_gen_edge_manager_for_partitioners``, executorch/exir/program/_program.py): once with an
empty table to functionalize it, once with the default table minus the ops the partitioner keeps,
and, for a partitioner that checks its ops one by one (XNNPACK), once more with the full default
table after the ops it accepted were renamed into the ``EDGE_DO_NOT_DECOMP`` namespace, so that the
kept ops it rejected get decomposed after all. When it accepted every one, that third re-trace finds
no op of its table in the graph and only re-traces it: on a 2-layer tiny Llama (static) 257 nodes in,
the same 257 out, about 0.7 s (cProfile: the three ``run_decompositions`` were 4.7 s of 11.8 s).

What this changes (during the ExecuTorch lowering only). ``_replace_aten_ops_with_transformed_ops``
is the step just before that third call, on the same program. After it runs, the program is checked
with upstream's own test (``contains_any_call_fn_target_op``, the graph and its control-flow
subgraphs) against the default decomposition table (less ``aten.sym_size.int``, which decomposes into
itself: ``RETRACED_AS_THEMSELVES``); when no node's op is in it, that program's next
``run_decompositions`` returns the program unchanged instead of re-tracing it. Upstream skips the
same re-trace on the same test in its other branch ("safe to skip when none of those targets occur in
the graph": the graph was functionalized by the first call and decomposed by the second).

    before: run_decompositions(default table) on a graph holding none of its ops: a full re-trace
    after:  the program as it is (the re-trace still runs when any op of the table is there)

Why the program is the same: with no op to decompose and a graph already functional, the re-trace
replays the same ops in the same order; ``benchmarks/lowering_speed.py`` checks the ``.pte`` bytes
with and without this patch.

Remove it when ExecuTorch applies its own skip test to this call too.
"""

from __future__ import annotations

import functools

import torch

from exporters.utils import ActedFlag, register_patch

PATH = "executorch.exir.program._program._replace_aten_ops_with_transformed_ops"

# Ops of the default table whose "decomposition" is the op itself: sym_size.int's CompositeImplicitAutograd
# kernel reads ``self.sym_size(dim)``, which a re-trace records as a sym_size.int node again (the second
# call, whose table has it, leaves every sym_size.int of a dynamic program in place).
RETRACED_AS_THEMSELVES = (torch.ops.aten.sym_size.int,)


@register_patch("executorch", PATH)
def _patch_idle_redecomposition_skipped(original):
    """The third edge re-trace ran even with no op left to decompose: the program it would re-trace
    is kept as it is.

    before: program.run_decompositions(_default_decomposition_table())   (a re-trace)
    after:  program, when no node's op is in that table
    """
    from executorch.exir.graph_module import contains_any_call_fn_target_op
    from executorch.exir.tracer import _default_decomposition_table

    acted = ActedFlag()  # set when a re-trace was skipped

    def _table(table=None):
        """The ops the call would decompose: the table's, less those a re-trace records unchanged."""
        table = dict(_default_decomposition_table() if table is None else table)
        for op in RETRACED_AS_THEMSELVES:
            table.pop(op, None)
        return table

    @functools.wraps(original)
    def replace_aten_ops_with_transformed_ops(name, program, partitioner):
        preserved = original(name, program, partitioner)
        if preserved is not None and not contains_any_call_fn_target_op(program.graph_module, _table()):
            run_decompositions = type(program).run_decompositions

            def once(decomp_table=None, **kwargs):
                # one call only: the one _gen_edge_manager_for_partitioners makes next, on this program
                del program.__dict__["run_decompositions"]
                if decomp_table is not None and not contains_any_call_fn_target_op(program.graph_module, _table(decomp_table)):
                    return program
                return run_decompositions(program, decomp_table, **kwargs)

            program.__dict__["run_decompositions"] = once
            acted.set()
        return preserved

    replace_aten_ops_with_transformed_ops.acted = acted
    return replace_aten_ops_with_transformed_ops
