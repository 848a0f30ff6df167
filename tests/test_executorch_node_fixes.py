"""ExecutorchExporter's FX node fixes for kernels that compute something else than eager, or refuse
dynamic sizes (exporters/workarounds/executorch/kernel_semantics.py, dynamic_sizes.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _stage_helpers import _assert_fix_repairs_a_run, _node_fix, _PositionInRound

import exporters.exporter_executorch as et
from exporters import ExportStageError
from exporters.executorch.artifact import PlannedShapeError
from exporters.utils import DEFAULT_REGISTRY, FiredLog, Registry, apply_fx_node_fixes
from exporters.workarounds.executorch.dynamic_sizes import _fix_slice_bounds_checked
from exporters.workarounds.executorch.kernel_semantics import _fix_gelu_tanh_explicit


def test_executorch_gelu_tanh_is_spelled_out():
    """XNNPACK computes gelu(approximate='tanh') as the erf GELU; the node fix rewrites it, exactly."""
    class G(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.gelu(x, approximate="tanh") + torch.nn.functional.gelu(x)

    x = torch.linspace(-4, 4, 64).reshape(2, 32)
    gm = torch.export.export(G(), (x,)).module()
    fix = _node_fix(_fix_gelu_tanh_explicit)
    fired = FiredLog()
    assert apply_fx_node_fixes(fix, gm, fired)
    gelus = [n for n in gm.graph.nodes if n.target is torch.ops.aten.gelu.default]
    assert len(gelus) == 1 and gelus[0].kwargs.get("approximate", "none") == "none"  # the exact one is kept
    torch.testing.assert_close(gm(x), G()(x), atol=1e-6, rtol=1e-6)
    assert fired.names() == ["fix:executorch:_fix_gelu_tanh_explicit"]


@pytest.mark.parametrize("conv", [
    dict(kernel_size=(2, 4, 4), stride=(2, 4, 4)),  # a patch embedding (Qwen2-VL, VideoMAE)
    dict(kernel_size=3, stride=(2, 1, 2), padding=(1, 2, 0), dilation=(2, 1, 1), groups=2),
], ids=["patchify", "padded-strided-dilated-grouped"])
def test_executorch_runs_3d_convolutions_as_2d(conv):
    """No ExecuTorch kernel runs a 5-D convolution; the node fix spells it as 2-D convolutions."""
    torch.manual_seed(0)
    model = torch.nn.Conv3d(4, 6, **conv).eval()
    inputs = {"input": torch.randn(2, 4, 8, 8, 12)}
    bare = et.ExecutorchExporter(registry=Registry()).export(model, inputs)
    with pytest.raises(RuntimeError, match=r"0x12; the runtime logged: .*Expect input tensor to be 3-D or 4-D"
                                           r".*KernelCall failed .* aten::convolution.out"):
        bare(**inputs)
    art = et.ExecutorchExporter().export(model, inputs)
    assert "fix:executorch:_fix_conv3d_as_conv2d" in art.workarounds_fired
    (actual,) = art(**inputs).values()
    torch.testing.assert_close(actual, model(**inputs), atol=1e-4, rtol=1e-4)


def test_executorch_runs_3d_convolutions_with_dynamic_sizes_as_2d():
    """Batch, height and width dynamic (GlmOcr's patch embedding left its width symbolic): the folded 2-D
    convolutions read those sizes back at run time."""
    torch.manual_seed(0)
    model = torch.nn.Conv3d(4, 6, kernel_size=(2, 3, 3), stride=(2, 1, 2), padding=(0, 1, 1)).eval()
    traced = {"input": torch.randn(2, 4, 4, 8, 12)}
    art = et.ExecutorchExporter().export(model, traced, et.ExecutorchConfig(dynamic=True, dynamic_shapes={
        "input": {0: torch.export.Dim("n", min=1, max=8), 3: torch.export.Dim("h", min=4, max=32),
                  4: torch.export.Dim("w", min=4, max=32)}}))
    assert "fix:executorch:_fix_conv3d_as_conv2d" in art.workarounds_fired
    for inputs in (traced, {"input": torch.randn(3, 4, 4, 10, 7)}):
        (actual,) = art(**inputs).values()
        torch.testing.assert_close(actual, model(**inputs), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("conv", [
    dict(kernel_size=(2, 4, 4), stride=(2, 4, 4)),  # VideoMAE's tubelets
    dict(kernel_size=3, stride=(2, 1, 2), padding=(1, 2, 0), dilation=(2, 1, 1)),
], ids=["tubelet", "padded-strided-dilated"])
def test_executorch_runs_3d_convolutions_with_dynamic_frames_as_2d(conv):
    """A dynamic frame count (VideoMAE's num_frames): each tap's frame slice is cut to the output's
    frame count, read back from the last tap's slice; the program runs at frame counts it was not
    traced at, odd ones included."""
    torch.manual_seed(0)
    model = torch.nn.Conv3d(4, 6, **conv).eval()
    traced = {"input": torch.randn(2, 4, 8, 8, 12)}
    art = et.ExecutorchExporter().export(model, traced, et.ExecutorchConfig(dynamic=True, dynamic_shapes={
        "input": {2: torch.export.Dim("t", min=6, max=16)}}))
    assert "fix:executorch:_fix_conv3d_as_conv2d" in art.workarounds_fired
    for frames in (8, 7, 12):
        inputs = {"input": torch.randn(2, 4, frames, 8, 12)}
        (actual,) = art(**inputs).values()
        torch.testing.assert_close(actual, model(**inputs), atol=1e-4, rtol=1e-4)


def test_executorch_runs_3d_convolutions_with_every_dim_auto_as_2d():
    """dynamic=True marks every dim Dim.AUTO; the channel dim the weight pins comes out as a SymInt
    equal to 3, not an int (VJEPA2's patch embedding), and still counts as static."""
    torch.manual_seed(0)
    model = torch.nn.Conv3d(3, 6, kernel_size=(2, 4, 4), stride=(2, 4, 4)).eval()
    traced = {"input": torch.randn(2, 3, 8, 8, 12)}
    art = et.ExecutorchExporter().export(model, traced, et.ExecutorchConfig(dynamic=True))
    assert "fix:executorch:_fix_conv3d_as_conv2d" in art.workarounds_fired
    for inputs in (traced, {"input": torch.randn(3, 3, 6, 12, 8)}):
        (actual,) = art(**inputs).values()
        torch.testing.assert_close(actual, model(**inputs), atol=1e-4, rtol=1e-4)


class _MeanOverLength(torch.nn.Module):
    """Pools each row over its own length, read from the mask (the XVector heads' statistics pooling)."""

    def forward(self, x, attention_mask):
        return torch.stack([x[i, :length].mean(dim=0) for i, length in enumerate(attention_mask.sum(-1))])


def test_executorch_slice_bound_read_from_data():
    inputs = {"x": torch.randn(2, 6, 4), "attention_mask": torch.tensor([[1] * 6, [1] * 4 + [0] * 2])}
    with pytest.raises(ExportStageError, match=r"data-dependent expression u\d+ < 0"):
        et.ExecutorchExporter(registry=Registry()).export(_MeanOverLength(), inputs)
    art = et.ExecutorchExporter().export(_MeanOverLength(), inputs)
    assert "fix:executorch:_fix_slice_bounds_checked" in art.workarounds_fired
    shorter = {"x": inputs["x"], "attention_mask": torch.tensor([[1] * 3 + [0] * 3, [1] * 5 + [0]])}
    for case in (inputs, shorter):  # the lengths are data: other values run through the same program
        (actual,) = art(**case).values()
        torch.testing.assert_close(actual, _MeanOverLength()(**case))


class _MeanAndStdOverLength(torch.nn.Module):
    """Data2VecAudioForXVector's statistics pooling: mean and std over ``x[i, :length]``, two slices
    sharing each length read from the mask."""

    def forward(self, x, attention_mask):
        rows = [(x[i, :n].mean(dim=0), x[i, :n].std(dim=0)) for i, n in enumerate(attention_mask.sum(-1))]
        return torch.stack([torch.cat(pair) for pair in rows])


def test_executorch_checked_slice_bound_is_the_slice_size():
    """The checks decide the bound, so re-tracing gives each slice the bound as its size; the traced
    meta gave it a fresh symbol, and the lowering's re-trace renamed the shared bound to the first
    slice's and failed at the second ("AssertionError: u0 -> u1", Data2VecAudioForXVector's dynamic
    export). The fix makes each fresh size equal to its bound and drops its binding."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    inputs = {"x": torch.randn(2, 6, 4), "attention_mask": torch.tensor([[1] * 6, [1] * 4 + [0] * 2])}
    program = torch.export.export(_MeanAndStdOverLength(), (), inputs)
    slices = [n for n in program.graph.nodes if n.target is torch.ops.aten.slice.Tensor]
    assert len(slices) == 4 and all(n.meta.get("unbacked_bindings") for n in slices)  # fresh sizes, as traced
    for node in slices:
        _fix_slice_bounds_checked(program.graph_module, node)
    for node in slices:
        assert not node.meta.get("unbacked_bindings")
        assert statically_known_true(node.meta["val"].shape[0] == node.args[3].meta["val"])
    art = et.ExecutorchExporter().export(_MeanAndStdOverLength(), inputs, et.ExecutorchConfig(dynamic=True))
    other = {"x": torch.randn(2, 6, 4), "attention_mask": torch.tensor([[1] * 3 + [0] * 3, [1] * 5 + [0]])}
    for case in (inputs, other):
        (actual,) = art(**case).values()
        torch.testing.assert_close(actual, _MeanAndStdOverLength()(**case))


class _PadToLongest(torch.nn.Module):
    """SuperPoint's batching: each row's kept scores (a data-dependent count) written into rows as long
    as the longest, so the slice bound u0 meets a size Max(u0, u1)."""

    def forward(self, scores):
        kept = [row[row > 0] for row in scores]
        longest = max(k.shape[0] for k in kept)
        out = torch.zeros(len(kept), longest)
        for i, k in enumerate(kept):
            out[i, : k.shape[0]] = k
        return out


def test_executorch_slice_bound_read_from_data_into_a_data_dependent_size():
    inputs = {"scores": torch.tensor([[0.5, -1.0, 2.0, 0.1], [-0.3, 0.7, -2.0, -1.0]])}
    with pytest.raises(ExportStageError, match=r"data-dependent expression u\d+ > Max\(u\d+, u\d+\)"):
        et.ExecutorchExporter(registry=Registry()).export(_PadToLongest(), inputs)
    art = et.ExecutorchExporter().export(_PadToLongest(), inputs)
    assert "fix:executorch:_fix_slice_bounds_checked" in art.workarounds_fired
    (actual,) = art(**inputs).values()
    torch.testing.assert_close(actual, _PadToLongest()(**inputs))


def test_executorch_remainder_by_a_size():
    """The floored-remainder fix compared a size divisor as a tensor (aten.lt.Scalar on a SymInt: the
    lowering failed, ReformerForQuestionAnswering executorch dynamic); a size is positive, and the
    dividend's sign alone decides."""
    inputs = {"x": torch.randn(2, 6)}
    art = et.ExecutorchExporter().export(_PositionInRound(start=-1), inputs, et.ExecutorchConfig(dynamic=True))
    assert "fix:executorch:_fix_integer_remainder_floored" in art.workarounds_fired
    for shape in ((2, 6), (3, 5)):
        x = torch.randn(shape)
        (got,) = art(x=x).values()
        torch.testing.assert_close(got, _PositionInRound(start=-1)(x))


class _Remainders(torch.nn.Module):
    """EfficientLoFTR's unmatched index -1 % width, by a tensor and a scalar, negative divisors, and
    a float remainder the runtime already gets right."""

    def forward(self, x, d):
        return (x % torch.tensor(8), torch.remainder(x, 8), torch.remainder(x, -3), x % d,
                x.to(torch.int32) % 5, x.float() % 8.0)


def test_executorch_integer_remainder_takes_the_divisors_sign():
    inputs = {"x": torch.tensor([[-1, 7, -9, 15, 0, -8]]), "d": torch.tensor([[8, -8, 5, -5, 3, -3]])}
    without = et.ExecutorchExporter(registry=DEFAULT_REGISTRY.without("fix:executorch:_fix_integer_remainder_floored"))
    expected = _Remainders()(**inputs)
    assert not torch.equal(without.export(_Remainders(), inputs)(**inputs)["0"], expected[0])  # C's sign
    art = et.ExecutorchExporter().export(_Remainders(), inputs)
    assert "fix:executorch:_fix_integer_remainder_floored" in art.workarounds_fired
    for got, want in zip(art(**inputs).values(), expected):
        assert got.dtype == want.dtype and torch.equal(got, want)


class _PadToBlocks(torch.nn.Module):
    """LongT5's local attention: pad the sequence to a multiple of the block length, (-seq) % block."""

    def forward(self, ids):
        return torch.nn.functional.pad(ids, (0, (-ids.shape[1]) % 8), value=-1)


def test_executorch_size_modulo_takes_the_divisors_sign():
    traced = {"ids": torch.arange(14).reshape(2, 7)}  # int64: the portable pad kernel, not XNNPACK's
    config = et.ExecutorchConfig(dynamic=True, dynamic_shapes={"ids": {1: torch.export.Dim("seq", min=2, max=32)}})
    name = "fix:executorch:_fix_symint_mod_floored"
    without = et.ExecutorchExporter(registry=DEFAULT_REGISTRY.without(name)).export(_PadToBlocks(), traced, config)
    with pytest.raises(RuntimeError, match=r"Padding values must be non-negative, but got pad\[1\] = -7"):
        without(**traced)
    art = et.ExecutorchExporter().export(_PadToBlocks(), traced, config)
    assert name in art.workarounds_fired
    for length in (7, 8, 13):
        inputs = {"ids": torch.arange(2 * length).reshape(2, length)}
        (got,) = art(**inputs).values()
        torch.testing.assert_close(got, _PadToBlocks()(**inputs), rtol=0, atol=0)


class _CroppedReconstruction(torch.nn.Module):
    """Swin2SR's tail: tokens back to an image, conv, pixel shuffle, conv, + mean, then a crop to the
    full size (an alias); XNNPACK returns the last convolution channels-last."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.convs = torch.nn.ModuleList([torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.Conv2d(16, 32, 3, padding=1),
                                          torch.nn.Conv2d(8, 3, 3, padding=1)])
        self.register_buffer("mean", torch.rand(1, 3, 1, 1))

    def forward(self, x):
        b, c, h, w = x.shape
        y = self.norm(x.flatten(2).transpose(1, 2)).transpose(1, 2).reshape(b, c, h, w)
        y = F.pixel_shuffle(F.leaky_relu(self.convs[1](self.convs[0](y))), 2)
        y = self.convs[2](y) / 1.0 + self.mean
        return y[:, :, : h * 2, : w * 2]


def test_executorch_alias_of_a_channels_last_delegate_output():
    _assert_fix_repairs_a_run(_CroppedReconstruction().eval(), {"x": torch.randn(2, 8, 16, 16)},
                              "tensors_have_same_dim_order", "_fix_alias_as_its_input")


class _NonzeroRows(torch.nn.Module):
    """MusicFlamingo's mask positions: nonzero's indices returned, sliced and used in arithmetic."""

    def forward(self, x):
        where = torch.nonzero(x > 0)
        return where, where[:, 1:2] * 10 + where[:, :1]


class _MaskRuns(torch.nn.Module):
    """MusicFlamingo's audio spans: where() of run starts and ends, their lengths, a range of their count."""

    def forward(self, ids):
        edges = torch.diff(torch.nn.functional.pad((ids == 7).int(), (1, 1)), dim=1)
        _, starts = torch.where(edges == 1)
        _, ends = torch.where(edges == -1)
        lengths = ends - starts
        return lengths, torch.arange(lengths.shape[0]), torch.nonzero(ids[0] == 7)


def test_executorch_nonzero_indices_are_row_major():
    """ExecuTorch's nonzero kernel writes row-major and torch declares the output column-major:
    without the fix the program is refused at the first op that checks dim order; with it every
    index matches eager."""
    x = torch.tensor([[1.0, -1, 2, 0, 3], [0, 0, 4, -2, 5], [6, 0, 0, 7, -1]])
    _assert_fix_repairs_a_run(_NonzeroRows(), {"x": x}, "different dim orders", "_fix_nonzero_as_masked_select")
    x3 = torch.randn(2, 3, 4)  # three dims: each index unravelled by its own stride
    art3 = et.ExecutorchExporter().export(_Nonzero3d(), {"x": x3})
    for probe in (x3, torch.randn(2, 3, 4), torch.zeros(2, 3, 4)):
        assert torch.equal(art3(x=probe)["output"], torch.nonzero(probe > 0))


class _Nonzero3d(torch.nn.Module):
    def forward(self, x):
        return torch.nonzero(x > 0)


class _NonzeroAndWhere(torch.nn.Module):
    def forward(self, x):
        nz = torch.nonzero(x > 0)
        rows, cols = torch.where(x < 0)
        return nz, nz[:, 1:2] * 10, rows, cols


def test_executorch_nonzero_fix_with_dynamic_sizes():
    """Both dims dynamic: the strides and sizes the indices are unravelled by are size arithmetic."""
    x = torch.randn(3, 5)
    config = et.ExecutorchConfig(dynamic_shapes={"x": {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}})
    art = et.ExecutorchExporter().export(_NonzeroAndWhere(), {"x": x}, config)
    assert "fix:executorch:_fix_nonzero_as_masked_select" in art.workarounds_fired
    for probe in (x, torch.randn(4, 7), torch.zeros(2, 6)):
        for got, want in zip(art(x=probe).values(), _NonzeroAndWhere()(probe)):
            assert torch.equal(got, want)


def test_executorch_count_of_nonzero_rows_survives_the_fix():
    """A size taken from nonzero's rows (an arange of the count) must stay the runtime count."""
    ids = torch.zeros(2, 39, dtype=torch.long)
    ids[0, 3:35] = 7
    ids[1, 5:37] = 7
    art = et.ExecutorchExporter().export(_MaskRuns(), {"ids": ids})
    for got, want in zip(art(ids=ids).values(), _MaskRuns()(ids)):
        assert torch.equal(got, want)


class _TokenShift(torch.nn.Module):
    """RWKV's token shift (a zero row in front, the last row cut) and a crop on both sides of a width."""

    def __init__(self):
        super().__init__()
        self.shift = torch.nn.ZeroPad2d((0, 0, 1, -1))

    def forward(self, x):
        return self.shift(x), torch.nn.functional.pad(x, (-1, -2), value=3.0), torch.nn.functional.pad(x, (1, 2))


def test_executorch_negative_pad_becomes_a_slice():
    _assert_fix_repairs_a_run(_TokenShift(), {"x": torch.randn(2, 5, 7)}, "Padding values must be non-negative",
                              "_fix_negative_pad_as_slice")


class _ExpandKv(torch.nn.Module):
    """DeepSeek-V3's MLA expand_kv: a new_empty of symbolic size, filled by two slice copies."""

    def forward(self, k_nope, k_rot):
        key = k_nope.new_empty(*k_nope.shape[:-1], 6)
        key[..., :4].copy_(k_nope)
        key[..., 4:].copy_(k_rot.expand(-1, k_nope.shape[1], -1, -1))
        return key


def test_executorch_symbolic_empty_keeps_the_program_dynamic():
    g = torch.Generator().manual_seed(0)
    traced = {"k_nope": torch.randn(2, 3, 5, 4, generator=g), "k_rot": torch.randn(2, 1, 5, 2, generator=g)}
    other = {"k_nope": torch.randn(3, 3, 9, 4, generator=g), "k_rot": torch.randn(3, 1, 9, 2, generator=g)}
    config = et.ExecutorchConfig(dynamic=True)
    name = "fix:executorch:_fix_symbolic_empty_as_full"
    without = et.ExecutorchExporter(registry=DEFAULT_REGISTRY.without(name)).export(_ExpandKv(), traced, config)
    with pytest.raises((RuntimeError, ValueError)):  # specialized to the traced sizes: the artifact refuses the others
        without(**other)
    art = et.ExecutorchExporter().export(_ExpandKv(), traced, config)
    assert name in art.workarounds_fired
    for inputs in (traced, other):
        (got,) = art(**inputs).values()
        torch.testing.assert_close(got, _ExpandKv()(**inputs), rtol=0, atol=0)


class _EmptyRotaryCache(torch.nn.Module):
    """Glm5Next's cache update with no rotary part: a cat of (B, 1, S, 0) keys, then joined to the rest."""

    def forward(self, past, new):
        # a cache's legacy 1-D empty start, then (B, 1, S, 0) keys: (B, 1, S1 + S2, 0)
        rot = torch.cat([past.new_zeros(0), past[..., :0], new[..., :0]], dim=2)
        return torch.cat([past, new], dim=2) + rot.sum(-1, keepdim=True)  # an empty sum is 0


def test_executorch_cat_of_empty_tensors_with_dynamic_sizes():
    g = torch.Generator().manual_seed(0)
    traced = {"past": torch.randn(2, 1, 3, 4, generator=g), "new": torch.randn(2, 1, 5, 4, generator=g)}
    dims = {"past": {0: torch.export.Dim("b", min=1, max=8), 2: torch.export.Dim("s1", min=1, max=32)},
            "new": {0: torch.export.Dim("b", min=1, max=8), 2: torch.export.Dim("s2", min=1, max=32)}}
    config = et.ExecutorchConfig(dynamic=True, dynamic_shapes=dims)
    name = "fix:executorch:_fix_empty_cat_as_full"
    with pytest.raises(ExportStageError, match="Unsupported type encountered in int list"):
        et.ExecutorchExporter(registry=DEFAULT_REGISTRY.without(name)).export(_EmptyRotaryCache(), traced, config)
    art = et.ExecutorchExporter().export(_EmptyRotaryCache(), traced, config)
    assert name in art.workarounds_fired
    other = {"past": torch.randn(3, 1, 7, 4, generator=g), "new": torch.randn(3, 1, 2, 4, generator=g)}
    for inputs in (traced, other):
        (got,) = art(**inputs).values()
        torch.testing.assert_close(got, _EmptyRotaryCache()(**inputs), rtol=0, atol=0)


class _Int32Index(torch.nn.Module):
    """Glm5Next's MoE combines expert outputs with an int32 index; eager takes it, the kernels do not."""

    def forward(self, x, index):
        index = index.int()
        picked = x.gather(1, index)
        counts = torch.zeros(3, 4).scatter_add_(1, index, picked)  # in place, as Glm5Next's indexer
        return counts, torch.zeros(3, 4).scatter(1, index, picked)


def test_executorch_int32_index_widened():
    inputs = {"x": torch.randn(3, 4), "index": torch.tensor([[0, 1], [3, 3], [2, 0]])}
    _assert_fix_repairs_a_run(_Int32Index(), inputs, "Expected dtype int64 for index", "_fix_int32_index_as_int64")


class _UnbatchedPeaks(torch.nn.Module):
    """SuperPoint's non-maximum suppression: a max pool over one image's [1, H, W] score map, and an average."""

    def forward(self, scores):
        peaks = F.max_pool2d(scores, kernel_size=3, stride=1, padding=1)
        return torch.where(scores == peaks, scores, 0.0), F.avg_pool2d(scores, 2)


def test_executorch_unbatched_pool():
    inputs = {"scores": torch.randn(1, 12, 10)}
    with pytest.raises(ExportStageError, match="ChannelsLastTaggedReshapePass"):  # "non-NHWC compatible node"
        et.ExecutorchExporter(registry=Registry()).export(_UnbatchedPeaks(), inputs)
    art = et.ExecutorchExporter().export(_UnbatchedPeaks(), inputs)
    assert "fix:executorch:_fix_unbatched_pool_as_batched" in art.workarounds_fired
    for want, got in zip(_UnbatchedPeaks()(**inputs), art(**inputs).values()):
        torch.testing.assert_close(got, want)


class _CircularConv(torch.nn.Module):
    """Autoformer's token embedding: a convolution over time with circular padding."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv1d(3, 4, kernel_size=3, padding=1, padding_mode="circular", bias=False)
        self.grid = torch.nn.Conv2d(2, 2, kernel_size=3, padding=(1, 2), padding_mode="circular")

    def forward(self, x, image):
        return self.conv(x.transpose(1, 2)).sum(dim=(1, 2)) + self.grid(image).mean(dim=(1, 2, 3))


def test_executorch_circular_padding_keeps_dynamic_sizes():
    """Lowered as the decomposition's empty + copies, the batch was specialized to its traced 2 and
    batch 3 was refused (set_inputs 0x10, AutoformerModel); as a cat of slices it stays dynamic."""
    model = _CircularConv().eval()
    traced = {"x": torch.randn(2, 7, 3), "image": torch.randn(2, 2, 5, 6)}
    without = DEFAULT_REGISTRY.without("fix:executorch:_fix_circular_pad_as_cat")
    bad = et.ExecutorchExporter(registry=without).export(model, traced, et.ExecutorchConfig(dynamic=True))
    larger = {"x": torch.randn(3, 9, 3), "image": torch.randn(3, 2, 6, 8)}
    # the artifact names the input, the dim and the plan's bound, not the runtime's set_inputs 0x10
    with pytest.raises(PlannedShapeError, match=r"input 'x' dim 0 is 3, but the ExecuTorch program was planned "
                       r"for at most 2; torch.export gave it the range \[2, \d+\]"):
        bad(**larger)
    art = et.ExecutorchExporter().export(model, traced, et.ExecutorchConfig(dynamic=True))
    assert "fix:executorch:_fix_circular_pad_as_cat" in art.workarounds_fired
    for case in (traced, larger):
        (actual,) = art(**case).values()
        torch.testing.assert_close(actual, model(**case), atol=1e-5, rtol=1e-5)


class _KeepLastPositions(torch.nn.Module):
    """RecurrentGemma's conv state: the last 3 positions of a sequence of any length, zero-padded in front where
    it is shorter (a pad of 3 - seq_len, negative for a longer sequence, positive for a shorter one)."""

    def forward(self, x):
        return torch.nn.functional.pad(x, (3 - x.shape[-1], 0))


def test_executorch_symbolic_pad_of_either_sign():
    """A pad whose sign depends on a dynamic size is cropped by max(-p, 0) and padded by max(p, 0): both signs
    run and match eager on one program (without the fix: 'Padding values must be non-negative' at 7)."""
    traced = {"x": torch.randn(2, 4, 7)}
    config = et.ExecutorchConfig(dynamic_shapes={"x": {2: torch.export.Dim("seq", min=2, max=16)}})
    name = "fix:executorch:_fix_negative_pad_as_slice"
    without = et.ExecutorchExporter(registry=DEFAULT_REGISTRY.without(name)).export(_KeepLastPositions(), traced, config)
    with pytest.raises(Exception, match="non-negative"):
        without(**traced)
    art = et.ExecutorchExporter().export(_KeepLastPositions(), traced, config)
    assert name in art.workarounds_fired
    for length in (7, 3, 2, 16):
        x = torch.randn(2, 4, length)
        (got,) = art(x=x).values()
        torch.testing.assert_close(got, _KeepLastPositions()(x), rtol=0, atol=0)
