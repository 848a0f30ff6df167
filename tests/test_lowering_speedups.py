"""The ExecuTorch speed patches (exporters/workarounds/executorch/: provenance_copy.py, xnnpack_pipeline.py,
edge_decompositions.py, edge_passes.py): each skips only work whose result it can tell in advance, and
a small program lowers to the same .pte bytes with all of them on and off (benchmarks/lowering_speed.py
does the same on tiny Llama, BERT and ViT)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.fx.traceback import NodeSource

from exporters.utils import DEFAULT_REGISTRY


def test_provenance_is_shared_and_reads_the_same():
    from exporters.workarounds.executorch.provenance_copy import _patch_provenance_shared_not_copied

    gm = torch.fx.symbolic_trace(torch.nn.ReLU())
    node = next(n for n in gm.graph.nodes if n.op == "call_function" or n.op == "call_module")
    node.meta["from_node"] = [NodeSource(node, "first"), NodeSource(None, "second")]
    upstream = NodeSource(node, "p")
    shared = NodeSource.__new__(NodeSource)
    _patch_provenance_shared_not_copied(NodeSource.__init__)(shared, node, "p")
    assert shared.to_dict() == upstream.to_dict() and shared.print_readable() == upstream.print_readable()
    assert shared.from_node is not node.meta["from_node"]  # a new list: appending to the node's leaves it
    assert all(a is b for a, b in zip(shared.from_node, node.meta["from_node"]))


def test_xnnpack_triggers_name_real_passes():
    from executorch.backends.xnnpack._passes import XNNPACKPassManager

    from exporters.workarounds.executorch.xnnpack_pipeline import pass_triggers

    default = {p.__name__ for p in XNNPACKPassManager(None).passes}
    assert set(pass_triggers()) <= default, set(pass_triggers()) - default  # a renamed pass would never be skipped
    no_ops: set = set()
    assert not any(may_act(no_ops) for may_act in pass_triggers().values())


def test_edge_pass_predicates():
    from exporters.workarounds.executorch.edge_passes import non_tensor_node_in_tensor_slot, python_scalar_in_tensor_slot

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(2)
    size = graph.call_function(torch.ops.aten.sym_size.int, (x, 0))
    size.meta["val"] = 2
    scalar = graph.call_function(torch.ops.aten.mul.Tensor, (x, 2.0))
    sym = graph.call_function(torch.ops.aten.mul.Tensor, (x, size))
    tensors = graph.call_function(torch.ops.aten.mul.Tensor, (x, x))
    assert python_scalar_in_tensor_slot(scalar) and not python_scalar_in_tensor_slot(tensors)
    assert non_tensor_node_in_tensor_slot(sym) and not non_tensor_node_in_tensor_slot(tensors)
    assert not python_scalar_in_tensor_slot(size)  # sym_size's int argument is not a Tensor slot


class _Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x):
        return self.norm(torch.relu(self.linear(x)) * 2.0).t()


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_same_pte_bytes_with_speedups_on_and_off(dynamic):
    pytest.importorskip("executorch")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.lowering_speed import SPEED_UPS
    from exporters import get_exporter

    on, off = get_exporter("executorch"), get_exporter("executorch", registry=DEFAULT_REGISTRY.without(*SPEED_UPS))
    model, inputs = _Small().eval(), {"x": torch.randn(4, 8)}
    config = on.config_class(dynamic=dynamic)
    with_them = on.export(copy.deepcopy(model), inputs, config)
    without = off.export(copy.deepcopy(model), inputs, config)
    assert bytes(with_them.buffer) == bytes(without.buffer)
    assert any(name in with_them.workarounds_fired for name in SPEED_UPS)
    assert not any(name in without.workarounds_fired for name in SPEED_UPS)
