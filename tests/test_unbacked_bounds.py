"""exporters/executorch/unbacked_bounds.py: a size read from tensor data (``.item()``) whose values follow from the
program's shapes is planned at the bound that holds for every input, not at the value seen while tracing.

Before the fix, ExecuTorch planned such a size at its traced value and an input making a larger one was
refused in the runtime (``resize_tensor``, 0x12): the same mask shape with more marked tokens, or LED's
chunk count at a longer sequence. A chain the module does not know keeps the trace-based bound.
"""

from __future__ import annotations

import pytest
import torch

import exporters.exporter_executorch as et
from exporters.executorch.unbacked_bounds import _op_name, source_bounds, value_range

BY_SOURCE = "fix:executorch:bound_unbacked_sizes_by_source"
BY_TRACE = "fix:executorch:bound_unbacked_sizes_by_trace"


class CountThenArange(torch.nn.Module):
    """LED's global-token count in small: the largest per-row count of marked tokens sizes an arange."""

    def forward(self, x, mask):
        count = (mask > 0).sum(dim=1).max().item()
        return x.sum(dim=1, keepdim=True) + torch.arange(count, dtype=x.dtype).sum()


class ChunkCount(torch.nn.Module):
    """LED's ``_sliding_chunks_query_key_matmul``: a chunk count from ``torch.div`` of a symbolic length
    (a tensor, so the buffer it sizes reads it back with ``.item()``). Like LED's position embeddings,
    a table shorter than the exported bound makes the program refuse the largest inputs eagerly, so
    the trace-based bound cannot grow the count with them."""

    def __init__(self):
        super().__init__()
        self.positions = torch.nn.Embedding(16, 1)

    def forward(self, x):
        chunks = torch.div(x.shape[1], 2, rounding_mode="trunc") - 1
        buffer = x.new_ones((x.shape[0], chunks + 1, 3))
        return buffer.sum(dim=(1, 2)) + x.sum(dim=1) + self.positions(torch.arange(x.shape[1])).sum()


class ScaledCount(torch.nn.Module):
    """A count from scaled values: nothing in the shapes bounds it."""

    def forward(self, x):
        count = (x * 1000).amax().to(torch.int64).item()
        torch._check(count >= 0)
        return torch.arange(count, dtype=x.dtype).sum() + x.sum()


def _mask(rows):
    return torch.tensor(rows, dtype=torch.int64)


def _item(program):
    return next(n for n in program.graph.nodes if _op_name(n.target) in ("item", "_local_scalar_dense"))


def test_a_count_over_a_mask_is_bounded_by_the_mask_length():
    length = torch.export.Dim("length", min=2, max=40)
    program = torch.export.export(CountThenArange(), (torch.randn(2, 8), _mask([[1, 1] + [0] * 6, [1] + [0] * 7])),
                                  dynamic_shapes={"x": {1: length}, "mask": {1: length}})
    item = _item(program)
    ranges = item.meta["val"].node.shape_env.var_to_range
    assert value_range(item.args[0], ranges) == (0, 40)
    assert list(source_bounds(program.graph_module).values()) == [(0, 40)]


def test_a_chunk_count_follows_the_symbolic_length():
    length = torch.export.Dim("length", min=4, max=41)
    program = torch.export.export(ChunkCount(), (torch.randn(2, 8),), dynamic_shapes={"x": {1: length}})
    # (length // 2 - 1) + 1 over length in [4, 41]
    assert list(source_bounds(program.graph_module).values()) == [(2, 20)]


def test_an_unknown_chain_gives_no_bound():
    program = torch.export.export(ScaledCount(), (torch.rand(2, 3),))
    item = _item(program)
    assert value_range(item.args[0], item.meta["val"].node.shape_env.var_to_range) is None
    assert source_bounds(program.graph_module) == {}


def test_more_marked_tokens_than_traced_at_the_same_shape():
    """The traced mask marks at most 2 tokens a row; one marking 7 of 8 must run, not be refused."""
    model = CountThenArange()
    traced = {"x": torch.randn(2, 8), "mask": _mask([[1, 1] + [0] * 6, [1] + [0] * 7])}
    art = et.ExecutorchExporter().export(model, traced, et.ExecutorchConfig())
    fuller = {"x": torch.randn(2, 8), "mask": _mask([[1] * 7 + [0], [1] * 3 + [0] * 5])}
    for feed in (traced, fuller):
        (out,) = art(**feed).values()
        torch.testing.assert_close(out, model(**feed))
    assert BY_SOURCE in art.workarounds_fired and BY_TRACE not in art.workarounds_fired


def test_a_chunk_count_runs_at_a_longer_length():
    model = ChunkCount()
    seq = torch.export.Dim("seq", min=4, max=24)
    art = et.ExecutorchExporter().export(model, {"x": torch.randn(2, 8)},
                                         et.ExecutorchConfig(dynamic=True, dynamic_shapes={"x": {1: seq}}))
    for length in (8, 13, 16):  # the traced 8 made 4 chunks; 16 makes 8
        feed = {"x": torch.randn(2, length)}
        (out,) = art(**feed).values()
        torch.testing.assert_close(out, model(**feed))
    assert BY_SOURCE in art.workarounds_fired


def test_an_unknown_chain_keeps_the_traced_bound():
    model = ScaledCount()
    art = et.ExecutorchExporter().export(model, {"x": torch.full((2, 3), 0.004)}, et.ExecutorchConfig())
    assert BY_TRACE in art.workarounds_fired and BY_SOURCE not in art.workarounds_fired
    with pytest.raises(RuntimeError, match="resize"):  # larger than the traced 4: refused, not wrong
        art(x=torch.full((2, 3), 0.009))


def test_an_elementwise_max_takes_both_operands():
    """``torch.max(a, b)`` (aten.max.other) is not a reduction of ``a``: its values reach ``b``'s."""

    class MaxOfTwo(torch.nn.Module):
        def forward(self, mask, other):
            count = torch.max((mask > 0).sum(dim=1), other).max().item()
            return torch.arange(count).sum()

    length = torch.export.Dim("length", min=2, max=40)
    program = torch.export.export(MaxOfTwo(), (_mask([[1, 1, 0, 0]]), torch.tensor([3])),
                                  dynamic_shapes={"mask": {1: length}, "other": None})
    assert source_bounds(program.graph_module) == {}  # other's values are unknown: no bound
