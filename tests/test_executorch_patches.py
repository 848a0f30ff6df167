"""ExecutorchExporter's patches of ExecuTorch internals: the exir passes' dim order and view copies,
and the XNNPACK partitioner's constraints (exporters/workarounds/executorch/exir_passes.py,
xnnpack_partitioner.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import exporters.exporter_executorch as et
from exporters import ExportStageError
from exporters.utils import DEFAULT_REGISTRY, Registry, register_patch
from exporters.workarounds.executorch.exir_passes import _patch_dim_order_positive_strides
from exporters.workarounds.executorch.xnnpack_partitioner import _patch_xnnpack_pass_through_outputs


def test_executorch_dim_order_of_data_dependent_strides():
    """A tensor with a data-dependent size u0 has strides like 32*u0; ExecuTorch's dim-order sort asks
    ``32*u0 < 32`` and cannot guard on it. The patch records that a nonzero stride's sizes are >= 1,
    and the sort then decides it."""
    from executorch.exir.tensor import dim_order_from_stride
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, ShapeEnv

    def strides():
        with FakeTensorMode(shape_env=ShapeEnv()):
            n = torch.ones(10, dtype=torch.bool).nonzero().shape[0]  # unbacked u0
            torch._check(n <= 10)
            return torch.empty_strided((2, n, 4, 8), (32 * n, 32, 8, 1)).stride()

    with pytest.raises(GuardOnDataDependentSymNode):
        dim_order_from_stride(strides())
    assert _patch_dim_order_positive_strides(dim_order_from_stride)(strides()) == (0, 1, 2, 3)
    assert _patch_dim_order_positive_strides(dim_order_from_stride)((12, 4, 1)) == (0, 1, 2)
    assert _patch_dim_order_positive_strides(dim_order_from_stride)((1, 3)) == (1, 0)  # permuted

    def undecidable():
        with FakeTensorMode(shape_env=ShapeEnv()):
            n = torch.ones(10, dtype=torch.bool).nonzero().shape[0]
            torch._check(n <= 10)
            return (n * (8 // n), n, 1)  # n*(8//n) < n cannot be decided

    assert _patch_dim_order_positive_strides(dim_order_from_stride)(undecidable()) == (0, 1, 2)


class _NormalizeKept(torch.nn.Module):
    """SuperPoint's descriptors at its kept keypoints: [1, C, u0], normalized over C."""

    def forward(self, x, scores):
        return F.normalize(x[:, :, scores > 0], p=2, dim=1)


def test_executorch_dim_order_of_equal_strides_spelled_differently():
    """The keepdim sum over [1, C, u0] has strides (Max(1, u0), u0, 1); ExecuTorch's sort put dim 1
    first (dim order (1, 0, 2)) and the portable sum kernel refused that output at run time
    ("Check failed (tensor_is_default_or_channels_last_dim_order(out))")."""
    from executorch.exir.tensor import dim_order_from_stride
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    with FakeTensorMode(shape_env=ShapeEnv()):
        n = torch.ones(10, dtype=torch.bool).nonzero().shape[0]
        torch._check(n <= 10)
        stride = (torch.sym_max(1, n), n, 1)
        assert _patch_dim_order_positive_strides(dim_order_from_stride)(stride) == (0, 1, 2)

    inputs = {"x": torch.randn(1, 8, 6), "scores": torch.tensor([0.5, -1.0, 2.0, 0.1, -0.2, 0.3])}
    art = et.ExecutorchExporter().export(_NormalizeKept(), inputs)
    for scores in (inputs["scores"], torch.tensor([0.5, -1.0, -2.0, 0.1, -0.2, -0.3])):
        (actual,) = art(x=inputs["x"], scores=scores).values()
        torch.testing.assert_close(actual, _NormalizeKept()(inputs["x"], scores))


def test_executorch_dim_order_patch_covers_every_binding():
    """executorch imports dim_order_from_stride by name into several modules; a binding the patch
    misses keeps the original (the view-copy pass of to_executorch did, and Glm4v failed there)."""
    import importlib
    import sys

    import executorch.exir.passes.replace_view_copy_with_view_pass  # noqa: F401  (to_executorch's passes)
    import executorch.exir.program  # noqa: F401
    from executorch.exir.tensor import dim_order_from_stride

    importlib.import_module("executorch.exir.emit._emitter")
    bound = {f"{name}.dim_order_from_stride" for name, mod in list(sys.modules.items())
             if name.startswith("executorch.exir") and getattr(mod, "dim_order_from_stride", None)
             is dim_order_from_stride}
    patched = {entry.path for entry in DEFAULT_REGISTRY.patches("executorch")}
    assert bound and bound <= patched, sorted(bound - patched)


class _UnpadToGrid(torch.nn.Module):
    """Lfm2Vl's image features: the first ``mask.sum()`` rows viewed as the (h, w) grid read from
    data, then pairs of columns folded into channels. The view's element count and its base's are
    different expressions of data-dependent values."""

    def forward(self, x, mask, hw):
        h, w = hw
        grid = x[: mask.sum()].reshape(1, h, w, -1)
        folded = grid.reshape(1, h, w // 2, -1)
        return folded.reshape(-1, folded.shape[-1]) * 2


def test_executorch_view_of_a_data_dependent_grid():
    inputs = {"x": torch.randn(16, 4), "mask": torch.tensor([1] * 12 + [0] * 4), "hw": torch.tensor([2, 6])}
    without = DEFAULT_REGISTRY.without("patch:executorch:executorch.exir.passes.replace_view_copy_with_view_pass._is_view_copy")
    with pytest.raises(ExportStageError, match=r"data-dependent expression Ne\("):
        et.ExecutorchExporter(registry=without).export(_UnpadToGrid(), inputs)
    art = et.ExecutorchExporter().export(_UnpadToGrid(), inputs)
    # the lowering needed the sizes bounded, on a fresh export: the failed one left the program's
    # unbacked symbols renamed ("possible memo disaster" when the same program was lowered again)
    assert "fix:executorch:bound_unbacked_sizes_by_trace" in art.workarounds_fired
    smaller = {"x": torch.randn(16, 4), "mask": torch.tensor([1] * 8 + [0] * 8), "hw": torch.tensor([2, 4])}
    for case in (inputs, smaller):
        (actual,) = art(**case).values()
        torch.testing.assert_close(actual, _UnpadToGrid()(**case))


def _symbolic_fake(env, mode, shape_of):
    """A fake tensor whose shape is ``shape_of(L)`` for a size ``L`` in [4, 67] (traced at 16)."""
    from torch._dynamo.source import ConstantSource

    symbol = env.create_symbol(16, ConstantSource("L"))
    env.constrain_symbol_range(symbol, compiler_min=4, compiler_max=67)
    length = env.create_symintnode(symbol, hint=16)
    with mode:
        return torch.empty(shape_of(length))


def test_executorch_view_larger_than_its_base_stays_a_copy():
    """Reformer's LSH chunks (and FastSpeech2's mel frames) view a padded length L as (L // (L // 4),
    L // 4): the view's declared capacity, its dims' separate upper bounds multiplied (67 * 16), is
    larger than its base's (67), and the runtime refused to load the program (0x21). Such a view
    must stay a copy; a view whose capacity fits its base still becomes a view."""
    import types

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from exporters.workarounds.executorch.exir_passes import _patch_view_copy_keeps_dynamism

    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    base = _symbolic_fake(env, mode, lambda n: (2, 4, n, 8))
    length = base.shape[2]
    with mode:
        chunks = torch.empty((2, 4, length // (length // 4), length // 4, 8))
        flat = torch.empty((2, 4 * length * 8))
    graph = torch.fx.Graph()
    base_node = graph.placeholder("base")
    base_node.meta.update(val=base, spec=types.SimpleNamespace(shape_dynamism=1))

    def view_of(val):
        node = graph.call_function(torch.ops.aten.view_copy.default, (base_node, []))  # the patch reads meta only
        node.meta["val"] = val
        return node

    is_view_copy = _patch_view_copy_keeps_dynamism(lambda node: True)
    assert not is_view_copy(view_of(chunks))
    assert is_view_copy(view_of(flat))


class _MaxOver(torch.nn.Module):
    def __init__(self, dim: int, keepdim: bool):
        super().__init__()
        self.dim, self.keepdim = dim, keepdim

    def forward(self, x):
        return torch.max(x, dim=self.dim, keepdim=self.keepdim).values * 2


@pytest.mark.parametrize("dim, keepdim", [(-1, False), (1, True), (3, True)])
def test_executorch_max_dim_outside_what_xnnpack_lowers(dim, keepdim):
    """XNNPACK's partitioner took every 4-D max.dim, and its visitor then refused all but dim 2/3 with
    keepdim=True, failing the lowering; the patched constraint leaves those to the portable kernel."""
    model, inputs = _MaxOver(dim, keepdim), {"x": torch.randn(2, 3, 4, 5)}
    if (dim, keepdim) != (3, True):
        with pytest.raises(ExportStageError, match="amax.default only supports"):
            et.ExecutorchExporter(registry=Registry()).export(model, inputs)
    (actual,) = et.ExecutorchExporter().export(model, inputs)(**inputs).values()
    torch.testing.assert_close(actual, model(**inputs))


class _LinearPReLU(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.act = torch.nn.Linear(8, 8), torch.nn.PReLU()

    def forward(self, x):
        return self.act(self.fc(x))


def test_executorch_prelu_that_is_not_4d():
    """XNNPACK's partitioner took a 3-D prelu its channels-last pass cannot convert (DAB-DETR)."""
    torch.manual_seed(0)
    model, inputs = _LinearPReLU().eval(), {"x": torch.randn(2, 3, 8)}
    with pytest.raises(ExportStageError, match="ChannelsLastTaggedReshapePass"):
        et.ExecutorchExporter(registry=Registry()).export(model, inputs)
    (actual,) = et.ExecutorchExporter().export(model, inputs)(**inputs).values()
    torch.testing.assert_close(actual, model(**inputs))


def test_xnnpack_partition_pass_through_outputs_get_copies():
    """A delegated partition returning its input (or one value twice) was refused by XNNPACK
    ("Output node ... is already in the inputs"); each such output gets its own clone."""
    from executorch.exir.dialects._ops import ops as exir_ops

    graph = torch.fx.Graph()
    a = graph.placeholder("a")
    a.meta["val"] = torch.empty(2, 3)
    doubled = graph.call_function(torch.ops.aten.mul.Tensor, (a, 2))
    graph.output((a, doubled, doubled))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    seen = []
    _patch_xnnpack_pass_through_outputs(lambda ep, module: seen.append(module) or {})(None, gm)
    (out,) = [n for n in seen[0].graph.nodes if n.op == "output"]
    first, second, third = out.args[0]
    assert first.target is exir_ops.edge.aten.clone.default and first.args == (a,)
    assert second is doubled and third.target is exir_ops.edge.aten.clone.default and third.args == (doubled,)
    assert first.meta["val"].shape == (2, 3)


class _ConvAndRouter(torch.nn.Module):
    """Wav2Vec2's conv feature encoder (conv1d over a dynamic batch and length) and a router's
    ``max(...).values.unsqueeze(-1)`` over a dynamic batch and sequence (SwitchTransformers)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(3, 4, 3)

    def forward(self, audio, logits):
        return self.conv(audio), logits.max(dim=-1).values.unsqueeze(-1) * logits


@pytest.mark.parametrize("patch", ["gemm_configs.ConvolutionConfig", "generic_node_configs.UnsqueezeCopyConfig"])
def test_executorch_reshapes_with_two_dynamic_dims_stay_outside_xnnpack(patch):
    model = _ConvAndRouter()
    inputs = {"audio": torch.randn(2, 3, 11), "logits": torch.randn(2, 5, 6)}
    auto = torch.export.Dim.AUTO
    config = et.ExecutorchConfig(dynamic_shapes={"audio": {0: auto, 2: auto}, "logits": {0: auto, 1: auto}})
    name = f"patch:executorch:executorch.backends.xnnpack.partition.config.{patch}.check_constraints"
    with pytest.raises(ExportStageError, match="only supports 1 dynamic dimension"):
        et.ExecutorchExporter(registry=DEFAULT_REGISTRY.without(name)).export(model, inputs, config)
    art = et.ExecutorchExporter().export(model, inputs, config)
    assert name in art.workarounds_fired
    for batch, length in ((2, 11), (3, 8), (4, 14)):
        probe = {"audio": torch.randn(batch, 3, length), "logits": torch.randn(batch, length, 6)}
        for got, want in zip(art(**probe).values(), model(**probe)):
            torch.testing.assert_close(got, want)


def test_executorch_batch_norm_1d_with_two_dynamic_dims_stays_outside_xnnpack():
    """FastSpeech2Conformer's BatchNorm1d over a dynamic batch and length: XNNPACK decomposes it into a
    depthwise conv1d, run as a 2-D conv between single-dynamic-dim reshapes."""
    model = torch.nn.BatchNorm1d(4).eval()
    with torch.no_grad():
        model.running_mean.uniform_(-1, 1)
        model.running_var.uniform_(0.5, 2)
    inputs = {"input": torch.randn(2, 4, 11)}
    auto = torch.export.Dim.AUTO
    config = et.ExecutorchConfig(dynamic_shapes={"input": {0: auto, 2: auto}})
    name = "patch:executorch:executorch.backends.xnnpack.partition.config.node_configs.BatchNormConfig.check_constraints"
    with pytest.raises(ExportStageError, match="only supports 1 dynamic dimension"):
        et.ExecutorchExporter(registry=DEFAULT_REGISTRY.without(name)).export(model, inputs, config)
    art = et.ExecutorchExporter().export(model, inputs, config)
    assert name in art.workarounds_fired
    for batch, length in ((2, 11), (3, 7)):
        probe = torch.randn(batch, 4, length)
        (got,) = art(input=probe).values()
        torch.testing.assert_close(got, model(probe))


class _NormedEmbedding(torch.nn.Module):
    """PatchTST's encoder: a linear, then BatchNorm1d over its channels (a standalone batch norm)."""

    def __init__(self):
        super().__init__()
        self.proj, self.norm, self.head = torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.norm(self.proj(x).transpose(1, 2)).transpose(1, 2))


def test_int8_standalone_batch_norm_stays_outside_xnnpack():
    """Over a dequantized input XNNPACK's decomposed batch norm is a float depthwise convolution beside an int8
    input, which its convolution refuses ("Weight and Input should both be quantized"); kept out, the program
    lowers and computes the quantized reference."""
    from exporters.parity import assert_close_quantized
    from exporters.pytrees import flatten_outputs
    from exporters.quantization import int8

    torch.manual_seed(0)
    model = _NormedEmbedding().eval()
    with torch.no_grad():
        model.norm.running_mean.uniform_(-1, 1)
        model.norm.running_var.uniform_(0.5, 2)
    inputs = {"x": torch.randn(2, 5, 8)}
    config = et.ExecutorchConfig(quantization=int8(calibration=[inputs]))
    name = "patch:executorch:executorch.backends.xnnpack.partition.config.node_configs.BatchNormConfig.check_constraints"
    with pytest.raises(ExportStageError, match="Weight and Input should both be quantized"):
        et.ExecutorchExporter(registry=DEFAULT_REGISTRY.without(name)).export(model, inputs, config)
    art = et.ExecutorchExporter().export(model, inputs, config)
    assert name in art.workarounds_fired
    got = {k: torch.as_tensor(v) for k, v in flatten_outputs(art(**inputs)).items()}
    assert_close_quantized(art.reference(**inputs), got, "executorch", art.reference_spread(**inputs))  # the sweep's rule


class _EightDims(torch.nn.Module):
    """Inkling's 8-D reshape and permute between two linear layers."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(18, 18)

    def forward(self, x):
        y = self.proj(x).reshape(2, 2, 1, 1, 3, 1, 3, 2).permute(0, 1, 2, 3, 5, 4, 6, 7)
        return self.proj(y.reshape(2, 2, 18) * 2.0)


def test_executorch_tensors_over_six_dims_stay_out_of_xnnpack():
    inputs, model = {"x": torch.randn(2, 2, 18)}, _EightDims()
    no_rank_limit = Registry()
    for entry in DEFAULT_REGISTRY.patches("executorch"):  # every patch but the rank limit
        if not entry.path.endswith("XNNPartitionerConfig.check_common_constraints"):
            register_patch("executorch", entry.path, registry=no_rank_limit)(entry.factory)
    with pytest.raises(ExportStageError, match="Failed to load method forward"):
        et.ExecutorchExporter(registry=no_rank_limit).export(model, inputs)
    art = et.ExecutorchExporter().export(model, inputs)
    torch.testing.assert_close(art(**inputs)["output"], model(**inputs))


def test_channels_last_copies_carry_their_value():
    """XNNPACK's ChannelsLastTaggedReshapePass creates memory-format copies without ``meta["val"]``, yet reads
    the value of a graph output it rewired to one (KeyError 'val': int8 ZoeDepth, MaskFormer). Patched, a copy
    it creates carries ``_to_copy``'s value on its input's (the new memory format); a copy of an input without a
    value is left as before."""
    from executorch.backends.xnnpack._passes.channels_last_tagged_reshape_pass import ChannelsLastTaggedReshapePass
    from executorch.exir.dialects._ops import ops as exir_ops
    from torch._subclasses.fake_tensor import FakeTensorMode

    from exporters.workarounds.executorch.xnnpack_passes import _patch_channels_last_copies_carry_val

    gm = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    x, bare = gm.graph.placeholder("x"), gm.graph.placeholder("bare")
    with FakeTensorMode():
        x.meta["val"] = torch.empty(1, 4, 3, 3)
    create = _patch_channels_last_copies_carry_val(ChannelsLastTaggedReshapePass.create_call_function_node)
    copy_op = exir_ops.edge.aten._to_copy.default
    copy = create(None, gm, copy_op, (x,), torch.channels_last)
    assert copy.meta["val"].shape == (1, 4, 3, 3)
    assert copy.meta["val"].is_contiguous(memory_format=torch.channels_last)
    assert "val" not in create(None, gm, copy_op, (bare,), torch.channels_last).meta
    assert ChannelsLastTaggedReshapePass.create_call_function_node(None, gm, copy_op, (x,), torch.channels_last).meta == {}


def test_an_op_asked_to_change_the_quantization_grid_stays_out_of_xnnpack():
    """XNNPACK runs a static reshape or a concatenation of int8 values on one grid only and refuses, at load,
    one whose inputs and output carry other scales or zero points (int8 Inkling2's unsqueeze: 'Failed to create
    squeeze node'; D-FINE's cat: 'Failed to create cat2 node'); the partition constraint leaves such a node
    out, and a reshape on one grid in."""
    from executorch.exir.dialects._ops import ops as exir_ops

    from exporters.workarounds.executorch.xnnpack_partitioner import _regrids

    q, dq = exir_ops.edge.quantized_decomposed.quantize_per_tensor.default, \
        exir_ops.edge.quantized_decomposed.dequantize_per_tensor.default

    def graph(op, out_grid, second_grid=None):
        g = torch.fx.Graph()
        x = g.placeholder("x")
        a = g.call_function(dq, (x, 0.002, 8, -128, 127, torch.int8))
        args = ([a, g.call_function(dq, (x, *second_grid, -128, 127, torch.int8))], 0) if second_grid else (a, -1)
        node = g.call_function(op, args)
        g.output(g.call_function(q, (node, *out_grid, -128, 127, torch.int8)))
        return node

    unsqueeze, cat = exir_ops.edge.aten.unsqueeze_copy.default, exir_ops.edge.aten.cat.default
    assert _regrids(graph(unsqueeze, (1.3e36, 127)))
    assert not _regrids(graph(unsqueeze, (0.002, 8)))
    assert _regrids(graph(cat, (0.002, 8), second_grid=(0.5, 0)))
    assert not _regrids(graph(cat, (0.002, 8), second_grid=(0.002, 8)))
    assert not _regrids(graph(exir_ops.edge.aten.permute_copy.default, (1.3e36, 127)))  # not a one-grid op


def test_a_quantized_conv1d_whose_users_do_not_quantize_on_one_grid_stays_out_of_xnnpack():
    """XNNPACK's Conv1dUnsqueezePass gives the squeeze after a quantized conv1d one quantize-dequantize pair, the
    first user's grid, and only where every user quantizes: a conv1d feeding a slice (int8 Mimi's codec) or two
    grids made a squeeze XNNPACK refuses at load; such a conv1d is left out, one quantized on one grid is kept. A relu
    that is its only user is fused into it first (FuseActivationPass), so its users are the ones that count: int8
    FastSpeech2Conformer's feed-forward conv1d -> relu -> quantize is kept (left out, its relu was delegated alone,
    float in and int8 out, and the program failed to load)."""
    from executorch.exir.dialects._ops import ops as exir_ops

    from exporters.workarounds.executorch.xnnpack_partitioner import _patch_conv1d_dynamic_dims_constraint

    check = _patch_conv1d_dynamic_dims_constraint(lambda self, node, ep: True)
    q, dq = exir_ops.edge.quantized_decomposed.quantize_per_tensor.default, \
        exir_ops.edge.quantized_decomposed.dequantize_per_tensor.default

    def conv1d(*users, relu=False):
        g = torch.fx.Graph()
        x, w = g.placeholder("x"), g.placeholder("w")
        x.meta["val"], w.meta["val"] = torch.empty(1, 4, 8), torch.empty(4, 4, 3)
        conv = g.call_function(exir_ops.edge.aten.convolution.default,
                               (g.call_function(dq, (x, 0.1, 0, -128, 127, torch.int8)), w, None, [1], [0], [1], False, [0], 1))
        conv.args[0].meta["val"], conv.meta["val"] = torch.empty(1, 4, 8), torch.empty(1, 4, 6)
        out = g.call_function(exir_ops.edge.aten.relu.default, (conv,)) if relu else conv
        for user in users:
            g.call_function(q, (out, *user, -128, 127, torch.int8)) if user else \
                g.call_function(exir_ops.edge.aten.slice_copy.Tensor, (out, 2, 0, 5))
        return conv

    assert check(None, conv1d((0.2, 3)), None)
    assert check(None, conv1d((0.2, 3), (0.2, 3)), None)
    assert not check(None, conv1d(None), None)  # a slice, not a quantize
    assert not check(None, conv1d((0.2, 3), (0.5, 0)), None)  # two grids
    assert check(None, conv1d((0.2, 3), relu=True), None)  # the relu is fused: its quantize is the user
    assert not check(None, conv1d(None, relu=True), None)
    assert not check(None, conv1d((0.2, 3), (0.5, 0), relu=True), None)


class _ConvSoftmax(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 1)

    def forward(self, x):
        return torch.softmax(self.conv(x), dim=-1)


def test_a_softmax_after_an_nhwc_node_normalizes_its_own_last_dim():
    """XNNPACK's channels-last pass ran a softmax in the layout of its input: after a convolution (NHWC) it
    normalized over the channels instead of the last dim (int8 Musicgen's T5 encoder: a channels-last position
    bias constant made the attention scores NHWC, the softmax ran over the heads)."""
    torch.manual_seed(0)
    model, inputs = _ConvSoftmax().eval(), {"x": torch.randn(1, 3, 5, 6)}
    name = ("patch:executorch:executorch.backends.xnnpack._passes.channels_last_tagged_reshape_pass."
            "ChannelsLastTaggedReshapePass.requires_nchw_inputs")
    (before,) = et.ExecutorchExporter(registry=DEFAULT_REGISTRY.without(name)).export(model, inputs)(**inputs).values()
    assert not torch.allclose(before, model(**inputs), atol=1e-3)  # normalized over the 4 channels
    art = et.ExecutorchExporter().export(model, inputs)
    (actual,) = art(**inputs).values()
    torch.testing.assert_close(actual, model(**inputs))
    assert name in art.workarounds_fired


def test_int8_users_laid_out_before_a_format_copy_keep_their_format():
    """XNNPACK's ChannelsLastTaggedReshapePass, converting a dequantized NHWC convolution output to NCHW for the
    partition's output, moved every user of that dequantize to the NCHW copy, the batch slices of ``unbind`` it had
    already laid out as NHWC among them (int8 SuperPoint, SuperGlue: 'Attempted to resize a static tensor. Expected
    shape (1, 16, 4, 4), but received (1, 4, 4, 4)'). Patched, those slices keep a dequantize of their own."""
    from exporters.quantization import int8

    class ConvThenUnbind(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)  # channels != spatial size: a misread layout shows

        def forward(self, x):
            y = torch.relu(self.conv(x))
            first, second = y.unbind(0)
            return y, first.unsqueeze(0) * 2, second.unsqueeze(0) * 3

    torch.manual_seed(0)
    model, inputs = ConvThenUnbind().eval(), {"x": torch.randn(2, 3, 4, 4)}
    config = et.ExecutorchConfig(quantization=int8(calibration=[inputs]))
    name = ("patch:executorch:executorch.backends.xnnpack._passes.channels_last_tagged_reshape_pass."
            "ChannelsLastTaggedReshapePass.insert_copy_q_dq")
    unpatched = et.ExecutorchExporter(registry=DEFAULT_REGISTRY.without(name)).export(model, inputs, config)
    with pytest.raises(RuntimeError, match="Attempted to resize a static tensor"):
        unpatched(**inputs)
    art = et.ExecutorchExporter().export(model, inputs, config)
    assert name in art.workarounds_fired
    expected = art.reference(**inputs)
    for key, value in art(**inputs).items():
        torch.testing.assert_close(torch.as_tensor(value), expected[key], rtol=0, atol=0)


def test_a_refused_gemm_leaves_its_quantizes_explicit():
    """XNNPACK's GEMM configs tag a pattern's quantize / dequantize nodes implicit before they know the pattern is
    valid and keep the tags when it is not; the refused GEMM's output quantize, partitioned alone, was then defined as
    nothing and its output never written (int8 Flava's contrastive logits read stale bytes). Patched, a refused
    GEMM's call takes back the tags it added; tags set before it, and those of a valid pattern, stay."""
    from executorch.backends.xnnpack.utils.quant_utils import is_tagged_as_implicit_q_dq, tag_as_implicit_q_dq
    from executorch.exir.dialects._ops import ops as exir_ops

    from exporters.workarounds.executorch.xnnpack_partitioner import _patch_rejected_gemm_leaves_its_quantizes_explicit

    q, dq = exir_ops.edge.quantized_decomposed.quantize_per_tensor.default, \
        exir_ops.edge.quantized_decomposed.dequantize_per_tensor.default

    def graph():
        g = torch.fx.Graph()
        a, w = g.placeholder("a"), g.placeholder("w")
        weight = g.call_function(dq, (w, 0.003, 8, -128, 127, torch.int8))
        mm = g.call_function(exir_ops.edge.aten.mm.default, (a, weight))
        out = g.call_function(q, (mm, 0.0011, -32, -128, 127, torch.int8))
        g.output(out)
        return mm, weight, out

    def get_deps(valid):
        def original(self, node, ep):  # what GEMMConfig.get_deps does with the tags, valid or not
            deps = [node.args[1], next(iter(node.users))]
            for dep in deps:
                tag_as_implicit_q_dq(dep)
            return valid, deps
        return _patch_rejected_gemm_leaves_its_quantizes_explicit(original)

    mm, weight, out = graph()
    tag_as_implicit_q_dq(weight)  # tagged by another pattern before this call: kept
    assert get_deps(False)(None, mm, None)[0] is False
    assert not is_tagged_as_implicit_q_dq(out) and is_tagged_as_implicit_q_dq(weight)
    mm, weight, out = graph()
    assert get_deps(True)(None, mm, None)[0] is True
    assert is_tagged_as_implicit_q_dq(out) and is_tagged_as_implicit_q_dq(weight)


class _SharedBias(torch.nn.Module):
    """One linear applied to two inputs on other quantization grids, as Videomt's per-frame heads: one bias
    parameter read by two GEMMs of one XNNPACK partition."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        with torch.no_grad():
            self.fc.bias.uniform_(2.0, 3.0)  # large against the outputs' step

    def forward(self, x, y):
        return self.fc(x), self.fc(y)


def test_int8_bias_shared_by_gemms_on_other_grids_is_defined_per_grid():
    """XNNPACK defined the shared bias once, as int32 on the first linear's (weight scale x input scale), and the
    second linear read it on its own grid: its output 199 steps off the quantized reference, and int8 Videomt's
    masks 17 (bound 12). Patched, the bias is defined again for the second grid and the program computes the
    reference."""
    from exporters.parity import assert_close_quantized
    from exporters.pytrees import flatten_outputs
    from exporters.quantization import int8

    torch.manual_seed(0)
    model = _SharedBias().eval()
    inputs = {"x": torch.randn(4, 16), "y": 4 * torch.randn(4, 16)}
    config = et.ExecutorchConfig(quantization=int8(calibration=[inputs]))
    name = "patch:executorch:executorch.backends.xnnpack.operators.node_visitor.NodeVisitor.define_tensor"

    def check(art):
        got = {k: torch.as_tensor(v) for k, v in flatten_outputs(art(**inputs)).items()}
        assert_close_quantized(art.reference(**inputs), got, "executorch", art.reference_spread(**inputs))

    with pytest.raises(AssertionError):
        check(et.ExecutorchExporter(registry=DEFAULT_REGISTRY.without(name)).export(model, inputs, config))
    art = et.ExecutorchExporter().export(model, inputs, config)
    assert name in art.workarounds_fired
    check(art)  # the sweep's rule
