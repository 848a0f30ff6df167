"""exporters/workarounds/executorch/partition_legalize.py: fusing ExecuTorch's delegate partitions re-sorts the program
only when a fused call broke its order, and regenerates the code once."""

from __future__ import annotations

import operator

import pytest
import torch

from exporters.workarounds.executorch.partition_legalize import _patch_partitions_legalized_when_needed, in_topological_order

PATCH = "patch:executorch:executorch.exir.backend.backend_api._create_partitions_in_graph_module"


def _graph_using_before_defined() -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    a = graph.call_function(operator.neg, (x,))
    b = graph.call_function(operator.neg, (a,))
    graph.output(b)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    a.prepend(b)  # b now comes before the a it reads
    return gm


def test_topological_order_check():
    gm = torch.fx.symbolic_trace(lambda x: -(-x))  # noqa: B002 - two neg nodes, on purpose
    assert in_topological_order(gm.graph)
    assert not in_topological_order(_graph_using_before_defined().graph)


@pytest.mark.parametrize("ordered", [True, False], ids=["kept", "re-sorted"])
def test_resorts_only_out_of_order_and_recompiles_once(ordered):
    """The stand-in for ExecuTorch's fusing calls legalize_graph as create_submodule_from_nodes does."""
    import executorch.exir.lowered_backend_module as fusing

    gm = torch.fx.symbolic_trace(lambda x: -(-x)) if ordered else _graph_using_before_defined()  # noqa: B002 - two negs
    legalized, recompiled = [], []
    real_legalize = fusing.legalize_graph

    def fuse(tagged, *_):
        for _ in range(3):  # three partitions
            fusing.legalize_graph(tagged)
        return "result"

    def legalize(module):
        legalized.append(module)
        return real_legalize(module)

    fusing.legalize_graph = legalize
    gm.recompile = lambda: recompiled.append(gm)
    try:
        patched = _patch_partitions_legalized_when_needed(fuse)
        assert patched(gm, None, None, False) == "result"
        assert fusing.legalize_graph is legalize  # restored after the call
    finally:
        fusing.legalize_graph = real_legalize
    if ordered:
        assert legalized == [] and recompiled == [gm] and patched.acted()
    else:
        assert len(legalized) == 1  # the first re-sort fixes the order; the next two are skipped
        assert in_topological_order(gm.graph)


class _Alternating(torch.nn.Module):
    """Linear layers (XNNPACK) between cumulative sums (portable kernels): one partition per linear."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(4))

    def forward(self, x):
        for layer in self.layers:
            x = torch.cumsum(layer(x), dim=1)
        return x


def test_lowering_with_many_partitions_matches_without_the_patch():
    from executorch.exir._serialize._program import deserialize_pte_binary

    import exporters.exporter_executorch as et
    from exporters.utils import DEFAULT_REGISTRY

    torch.manual_seed(0)
    model = _Alternating().eval()
    inputs = {"x": torch.randn(2, 5, 8)}
    art = et.ExecutorchExporter().export(model, inputs)
    bare = et.ExecutorchExporter(registry=DEFAULT_REGISTRY.without(PATCH)).export(model, inputs)
    assert PATCH in art.workarounds_fired and PATCH not in bare.workarounds_fired

    def delegates(artifact):
        plan = deserialize_pte_binary(artifact.buffer).program.execution_plan[0]
        return len(plan.delegates)

    assert delegates(art) == delegates(bare) == 4
    (actual,) = art(**inputs).values()
    (expected,) = bare(**inputs).values()
    torch.testing.assert_close(actual, expected, atol=0, rtol=0)
    torch.testing.assert_close(actual, model(**inputs), atol=1e-5, rtol=1e-5)
