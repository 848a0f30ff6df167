"""ExecutorchExporter's FX node fixes for ops the ExecuTorch runtime has no kernel for, each spelled
with ops it has (exporters/workarounds/executorch/missing_kernels.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _stage_helpers import _assert_fix_supplies_missing_kernel, _node_fix

import exporters.exporter_executorch as et
from exporters import ExportStageError
from exporters.utils import FiredLog, Registry, apply_fx_node_fixes
from exporters.workarounds.executorch.missing_kernels import _fix_bucketize_as_comparisons


@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("out_int32", [False, True])
def test_executorch_bucketize_becomes_a_comparison_count(right, out_int32):
    """The ExecuTorch runtime has no bucketize kernel; the node fix counts boundaries instead, with
    the same dtype and the same side for values equal to a boundary."""
    class B(torch.nn.Module):
        def forward(self, x, boundaries):
            return torch.bucketize(x, boundaries, right=right, out_int32=out_int32)

    boundaries = torch.tensor([0.0, 0.25, 0.5, 0.75])
    x = torch.tensor([[-1.0, 0.0, 0.1, 0.25], [0.5, 0.6, 0.75, 2.0]])  # values on the boundaries too
    gm = torch.export.export(B(), (x, boundaries)).module()
    fix = _node_fix(_fix_bucketize_as_comparisons)
    fired = FiredLog()
    assert apply_fx_node_fixes(fix, gm, fired)
    assert not [n for n in gm.graph.nodes if n.target is torch.ops.aten.bucketize.Tensor]
    got, want = gm(x, boundaries), B()(x, boundaries)
    assert got.dtype == want.dtype and torch.equal(got, want)
    assert fired.names() == ["fix:executorch:_fix_bucketize_as_comparisons"]


@pytest.mark.parametrize("side", ["left", "right", None])
@pytest.mark.parametrize("row_wise", [False, True])
def test_executorch_searchsorted_becomes_a_comparison_count(side, row_wise):
    """searchsorted, 1-D and row-wise (seq [..., M], values [..., K]), by ``side`` and its default,
    with a scalar value into a 1-D sequence too: same indices and dtype as eager, ties on either side included."""
    class S(torch.nn.Module):
        def forward(self, seq, x):
            kw = {"side": side} if side else {}
            scalar = torch.searchsorted(seq, 0.5, out_int32=True, **kw) if seq.dim() == 1 else seq  # 1-D only
            return torch.searchsorted(seq, x, **kw), scalar

    seq = torch.tensor([0.0, 0.25, 0.5, 0.75])
    x = torch.tensor([[-1.0, 0.0, 0.1, 0.25, 0.3], [0.5, 0.6, 0.75, 2.0, 0.75]])  # values on the boundaries too
    if row_wise:
        seq = torch.stack([seq, seq * 2])
    gm = torch.export.export(S(), (seq, x)).module()
    fix = _node_fix(_fix_bucketize_as_comparisons)
    fired = FiredLog()
    assert apply_fx_node_fixes(fix, gm, fired)
    assert not [n for n in gm.graph.nodes if "searchsorted" in str(n.target)]
    for got, want in zip(gm(seq, x), S()(seq, x)):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_executorch_searchsorted_with_a_sorter_is_left_alone():
    class S(torch.nn.Module):
        def forward(self, seq, x):
            return torch.searchsorted(seq, x, sorter=seq.argsort())

    gm = torch.export.export(S(), (torch.tensor([0.5, 0.0, 0.25]), torch.tensor([0.1, 0.3]))).module()
    fix = _node_fix(_fix_bucketize_as_comparisons)
    assert not apply_fx_node_fixes(fix, gm, FiredLog())


class _TimeGrid(torch.nn.Module):
    """MusicFlamingo's lookup of each frame's time in a sorted grid."""

    def forward(self, grid, t):
        return torch.searchsorted(grid, t, right=True) * 2


def test_executorch_searchsorted_without_its_kernel():
    inputs = {"grid": torch.linspace(0, 1, 9), "t": torch.tensor([[0.0, 0.125, 0.3], [0.999, 1.0, 1.5]])}
    _assert_fix_supplies_missing_kernel(_TimeGrid(), inputs, "aten::searchsorted.Tensor_out",
                                        "_fix_bucketize_as_comparisons")


class _SegmentReduce(torch.nn.Module):
    """A 1-D scatter_reduce by segment id, as TAPAS reduces table cells."""

    def __init__(self, reduce: str, include_self: bool):
        super().__init__()
        self.reduce, self.include_self = reduce, include_self

    def forward(self, values, index):
        return torch.full((5,), 0.5).scatter_reduce(0, index, values * 2, reduce=self.reduce, include_self=self.include_self)


@pytest.mark.parametrize("reduce, include_self", [("sum", False), ("mean", True), ("mean", False), ("amax", False), ("amin", True)])
def test_executorch_scatter_reduce_without_its_kernel(reduce, include_self):
    inputs = {"values": torch.randn(7), "index": torch.tensor([0, 1, 1, 3, 3, 3, 0])}  # segments 2, 4 empty
    model = _SegmentReduce(reduce, include_self)
    if reduce == "sum":
        with pytest.raises(ExportStageError, match="no kernel for aten::scatter_reduce.two_out"):
            et.ExecutorchExporter(registry=Registry()).export(model, inputs)
    art = et.ExecutorchExporter().export(model, inputs)
    assert "fix:executorch:_fix_scatter_reduce_by_segment" in art.workarounds_fired
    (actual,) = art(**inputs).values()
    torch.testing.assert_close(actual, model(**inputs))


class _BatchedSegmentSum(torch.nn.Module):
    """TAPAS's batched segment reduction: the segment count (batch x segments per row) grows with the
    batch, so a dynamic export has a symbolic number of segments."""

    def __init__(self, reduce: str):
        super().__init__()
        self.reduce = reduce

    def forward(self, values, index):
        batch, per_row = values.shape[0], 4
        flat = (index + torch.arange(batch).unsqueeze(1) * per_row).reshape(-1)
        out = torch.zeros(batch * per_row).scatter_reduce(0, flat, values.reshape(-1), reduce=self.reduce,
                                                           include_self=False)
        return out.view(batch, per_row)


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin"])
def test_executorch_scatter_reduce_with_a_dynamic_segment_count(reduce):
    """The program's memory grows with the segments plus the elements, not their product (a membership
    mask planned at the upper bounds did not load), and it runs at a batch it was not traced at;
    segment 2 gets nothing and keeps 0, segments 1 and 3 get several values."""
    model = _BatchedSegmentSum(reduce)
    index = torch.tensor([[0, 1, 1, 3, 3, 0]])
    traced = {"values": torch.randn(2, 6), "index": index.repeat(2, 1)}
    batch = torch.export.Dim("batch", min=1, max=64)
    config = et.ExecutorchConfig(dynamic=True, dynamic_shapes={"values": {0: batch}, "index": {0: batch}})
    art = et.ExecutorchExporter().export(model, traced, config)
    assert "fix:executorch:_fix_scatter_reduce_by_segment" in art.workarounds_fired
    for n in (2, 5):
        inputs = {"values": torch.randn(n, 6), "index": index.repeat(n, 1)}
        (actual,) = art(**inputs).values()
        torch.testing.assert_close(actual, model(**inputs))


class _NormalQuantile(torch.nn.Module):
    def forward(self, x):
        return torch.distributions.Normal(0, 1).icdf(x) * 2 + torch.erfinv(x * 0.999)


def test_executorch_erfinv_without_its_kernel():
    """Gemma 3n's Normal(0, 1).icdf needs erfinv, which the runtime has no kernel for."""
    inputs = {"x": torch.linspace(0.001, 0.999, 64).reshape(4, 16)}
    _assert_fix_supplies_missing_kernel(_NormalQuantile(), inputs, "aten::erfinv.out", "_fix_erfinv_as_polynomial")


class _ScaledNoise(torch.nn.Module):
    """VITS's prior sample: mean + randn_like(mean) * std * noise_scale, with noise_scale 0."""

    def forward(self, mean):
        return mean + torch.randn_like(mean) * 0.0, torch.rand_like(mean, dtype=torch.float64) * 0.0


def test_executorch_random_like_without_its_kernel():
    _assert_fix_supplies_missing_kernel(_ScaledNoise(), {"mean": torch.randn(2, 5)}, "aten::randn_like.out",
                                        "_fix_random_like_as_sized")


class _AntialiasedResize(torch.nn.Module):
    """UnlimitedOcr's position-embedding resize: bicubic with antialias, down and up, by size and by scale."""

    def forward(self, x):
        down = F.interpolate(x, size=(5, 3), mode="bicubic", antialias=True, align_corners=False)
        up = F.interpolate(x, size=(17, 9), mode="bicubic", antialias=True, align_corners=True)
        by_scale = F.interpolate(x, scale_factor=0.6, mode="bicubic", antialias=True)
        return down, up, by_scale


def test_executorch_antialiased_bicubic_without_its_kernel():
    inputs = {"x": torch.randn(2, 3, 12, 7)}
    _assert_fix_supplies_missing_kernel(_AntialiasedResize(), inputs, "aten::_upsample_bicubic2d_aa.out",
                                        "_fix_bicubic_aa_as_matmuls")


class _PositionTableToGrid(torch.nn.Module):
    """UnlimitedOcr's dynamic export: a fixed (8, 8) position table resized, bicubic with antialias, to
    the patch grid of the image, whose sizes are symbolic (down and up across the range)."""

    def __init__(self, align_corners=False):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(1, 3, 8, 8))
        self.align_corners = align_corners

    def forward(self, x):
        grid = F.interpolate(self.table, size=(x.shape[-2], x.shape[-1]), mode="bicubic", antialias=True,
                             align_corners=self.align_corners)
        return x + grid


@pytest.mark.parametrize("align_corners", [False, True])
def test_executorch_antialiased_bicubic_to_symbolic_sizes(align_corners):
    torch.manual_seed(0)
    model = _PositionTableToGrid(align_corners).eval()
    traced = {"x": torch.randn(1, 3, 6, 10)}
    config = et.ExecutorchConfig(dynamic=True, dynamic_shapes={"x": {2: torch.export.Dim("h", min=1, max=20),
                                                                     3: torch.export.Dim("w", min=1, max=20)}})
    art = et.ExecutorchExporter().export(model, traced, config)
    assert "fix:executorch:_fix_bicubic_aa_as_matmuls" in art.workarounds_fired
    for h, w in ((6, 10), (3, 17), (20, 8), (1, 1), (8, 8)):
        x = torch.randn(1, 3, h, w)
        (got,) = art(x=x).values()
        torch.testing.assert_close(got, model(x), atol=1e-5, rtol=1e-5)


class _QuestionsPerRow(torch.nn.Module):
    """Splinter's question tokens per row: bincount of where() rows, its length checked against the batch."""

    def forward(self, ids):
        rows, cols = torch.where(ids == 7)
        counts = torch.bincount(rows)
        torch._check(counts.size(0) == ids.size(0))
        return counts * 1, cols


def test_executorch_bincount_of_a_pinned_length():
    inputs = {"ids": torch.tensor([[1, 7, 7, 2], [7, 3, 4, 7], [7, 0, 0, 0]])}
    _assert_fix_supplies_missing_kernel(_QuestionsPerRow(), inputs, "aten::bincount.out", "_fix_bincount_of_known_length")


def test_executorch_bincount_pinned_to_a_dynamic_batch():
    """With a dynamic batch the pinned length is the batch's symbol, read back from the input."""
    model, traced = _QuestionsPerRow(), {"ids": torch.tensor([[1, 7, 7, 2], [7, 3, 4, 7], [7, 0, 0, 0]])}
    config = et.ExecutorchConfig(dynamic=True, dynamic_shapes={"ids": {0: torch.export.Dim("b", min=2, max=16)}})
    art = et.ExecutorchExporter().export(model, traced, config)
    assert "fix:executorch:_fix_bincount_of_known_length" in art.workarounds_fired
    inputs = {"ids": torch.tensor([[7, 7, 7, 2], [7, 3, 4, 7], [7, 0, 0, 0], [1, 7, 2, 2], [7, 1, 1, 1]])}
    for got, want in zip(art(**inputs).values(), model(**inputs)):
        torch.testing.assert_close(got, want)


class _Sorts(torch.nn.Module):
    """JetMoe's grouping of tokens by expert (sort of int ids) and Hiera's argsort of noise."""

    def forward(self, x, ids):
        values, order = x.sort(dim=0, descending=True)
        sorted_ids, by_id = ids.flatten().sort()
        return values, order, sorted_ids, x.flatten()[x.flatten().argsort()], torch.argsort(x, dim=-1)


def test_executorch_sort_without_its_kernel():
    inputs = {"x": torch.randn(5, 7), "ids": torch.tensor([[3, 0], [1, 3], [2, 0], [1, 1], [0, 2], [3, 2], [0, 1]])}
    with pytest.raises(ExportStageError, match="no kernel for aten::sort.values"):
        et.ExecutorchExporter(registry=Registry()).export(_Sorts(), inputs)
    art = et.ExecutorchExporter().export(_Sorts(), inputs)
    assert "fix:executorch:_fix_sort_as_topk" in art.workarounds_fired
    actual, expected = list(art(**inputs).values()), _Sorts()(**inputs)
    for got, want in zip(actual[:2] + actual[3:], expected[:2] + expected[3:]):  # no ties among floats
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(actual[2], expected[2])  # sorted keys agree; ties' indices may not


class _IntSorts(torch.nn.Module):
    """PP-DocLayoutV2's detections to the front (argsort of a 0/1 mask, descending) and stable and
    plain sorts of small int keys along both dims: ties must keep eager's (index) order."""

    def forward(self, mask, keys):
        front = torch.argsort(mask.int(), dim=1, descending=True)
        values, order = keys.sort(dim=0, stable=True)
        by_row, row_order = keys.sort(dim=-1, descending=True)
        return front, values, order, by_row, row_order, torch.argsort(mask, dim=1)


def test_executorch_sort_of_int_keys_keeps_ties_in_index_order():
    mask = torch.tensor([[0, 1, 0, 1, 1, 0, 0, 1], [1, 1, 0, 0, 0, 1, 0, 0]], dtype=torch.bool)
    keys = torch.tensor([[2, 0, 2], [1, 1, 2], [2, 0, 0], [1, 2, 1], [2, 1, 1]], dtype=torch.int32)
    art = et.ExecutorchExporter().export(_IntSorts(), {"mask": mask, "keys": keys})
    assert "fix:executorch:_fix_sort_as_topk" in art.workarounds_fired
    for got, want in zip(art(mask=mask, keys=keys).values(), _IntSorts()(mask, keys)):
        assert got.dtype == want.dtype and torch.equal(got, want)


class _RunningExtremes(torch.nn.Module):
    """Grounding DINO's previous/next special token: cummax, and cummin of the flipped positions."""

    def forward(self, special, x):
        prev_values, prev_index = torch.cummax(special, dim=1)
        next_values = torch.flip(torch.cummin(torch.flip(special, dims=[1]), dim=1)[0], dims=[1])
        low, low_index = torch.cummin(x, dim=0)
        return prev_values, prev_index, next_values, low, low_index


def test_executorch_cummax_cummin_without_their_kernels():
    special = torch.tensor([[0, 0, 2, 2, 0, 5, 0], [1, 0, 0, 3, 3, 0, 6]])  # ties: eager's index is the last
    inputs = {"special": special, "x": torch.randn(6, 3)}
    _assert_fix_supplies_missing_kernel(_RunningExtremes(), inputs, "aten::cummax.out",
                                        "_fix_cumulative_extreme_as_masked_reduction")


def test_executorch_cummax_cummin_of_a_dynamic_length():
    """Grounding DINO's dynamic export: the text length varies, so the mask is (n x n) for a symbolic n."""
    special = torch.tensor([[0, 0, 2, 2, 0, 5, 0], [1, 0, 0, 3, 3, 0, 6]])
    inputs = {"special": special, "x": torch.randn(6, 3)}
    art = et.ExecutorchExporter().export(_RunningExtremes(), inputs, et.ExecutorchConfig(dynamic=True))
    assert "fix:executorch:_fix_cumulative_extreme_as_masked_reduction" in art.workarounds_fired
    assert art.dynamic_dims["special"] and art.dynamic_dims["x"]
    for length, rows in ((7, 6), (12, 9), (3, 2)):
        other = {"special": torch.randint(0, 4, (3, length)), "x": torch.randn(rows, 3)}
        for got, want in zip(art(**other).values(), _RunningExtremes()(**other)):
            torch.testing.assert_close(got, want)


class _Bags(torch.nn.Module):
    """Kimi K2.5's weighted bicubic gather (mode sum with weights), and plain mean / max bags."""

    def forward(self, idx, w, table):
        weighted = torch.nn.functional.embedding_bag(idx, table, per_sample_weights=w, mode="sum")
        return (weighted, torch.nn.functional.embedding_bag(idx, table, mode="mean"),
                torch.nn.functional.embedding_bag(idx[:, :2], table, mode="max"))


def test_executorch_embedding_bag_without_its_kernel():
    inputs = {"idx": torch.randint(0, 10, (6, 4)), "w": torch.rand(6, 4), "table": torch.randn(10, 3)}
    _assert_fix_supplies_missing_kernel(_Bags(), inputs, "aten::_embedding_bag", "_fix_embedding_bag_of_equal_bags")
