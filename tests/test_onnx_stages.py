"""OnnxExporter's stages: FX node fixes, ONNX translations, torch and onnxscript patches, and ONNX IR
fixes (exporters/workarounds/onnx/)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _stage_helpers import _PositionInRound

import exporters.exporter_onnx as onx
from exporters import ExportStageError
from exporters.utils import DEFAULT_REGISTRY, FiredLog, Registry, apply_fx_node_fixes, apply_patches
from exporters.workarounds.onnx.ir_fixes import _all_nodes, _fix_ir_topk_sorted
from exporters.workarounds.onnx.node_fixes import _fix_dead_assertions
from exporters.workarounds.onnx.translations import _ONNX_TRANSLATION_TABLE


def test_fix_dead_assertions_removes_unused_asserts():
    class M(torch.nn.Module):
        def forward(self, x):
            torch.ops.aten._assert_tensor_metadata.default(x, dtype=torch.float32)
            return x + 1

    gm = torch.export.export(M(), (torch.ones(2),)).graph_module

    def targets():
        return [n for n in gm.graph.nodes if n.target is torch.ops.aten._assert_tensor_metadata.default]

    assert targets(), "the export no longer keeps the assertion node; the fix has nothing to test"
    fired = FiredLog()
    assert apply_fx_node_fixes([e for e in DEFAULT_REGISTRY.fixes("onnx", "node") if e.fn is _fix_dead_assertions], gm, fired)
    assert targets() == []
    assert fired.names() == ["fix:onnx:_fix_dead_assertions"]


def _topk_model(sorted_value: int, in_function: bool = False):
    import onnx_ir as ir
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])
    k = helper.make_tensor("k", TensorProto.INT64, [1], [3])
    outs = [helper.make_tensor_value_info("v", TensorProto.FLOAT, [2, 3]), helper.make_tensor_value_info("i", TensorProto.INT64, [2, 3])]
    topk = helper.make_node("TopK", ["x", "k"], ["v", "i"], sorted=sorted_value)
    opsets = [helper.make_opsetid("", 18)]
    functions = []
    if in_function:
        functions = [helper.make_function("custom", "F", ["x", "k"], ["v", "i"], [topk], opsets)]
        topk = helper.make_node("F", ["x", "k"], ["v", "i"], domain="custom")
        opsets = opsets + [helper.make_opsetid("custom", 1)]
    graph = helper.make_graph([topk], "g", [x], outs, initializer=[k])
    return ir.serde.deserialize_model(helper.make_model(graph, opset_imports=opsets, functions=functions))


@pytest.mark.parametrize("in_function", [False, True], ids=["graph", "function"])
def test_ir_fix_forces_topk_sorted(in_function):
    model = _topk_model(0, in_function)
    assert _fix_ir_topk_sorted(model) is True
    topks = [n for n in _all_nodes(model) if n.op_type == "TopK"]
    assert len(topks) == 1 and topks[0].attributes["sorted"].as_int() == 1
    assert _fix_ir_topk_sorted(model) is False  # nothing left to change


def test_ir_fix_leaves_sorted_topk_alone():
    assert _fix_ir_topk_sorted(_topk_model(1)) is False


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_onnx_scalar_minus_tensor_exports_and_matches(dtype):
    """``1.0 - mask`` (aten.rsub.Scalar, decomposed by torch.onnx into sub(1.0, mask)) has no overload
    torch.onnx's type promotion can match; the node fix rewrites it and the ONNX model agrees with
    eager, including the int -> float promotion."""
    from exporters import OnnxExporter

    class R(torch.nn.Module):
        def forward(self, mask):
            return (1.0 - mask) * 2, 3 - mask

    from exporters import ExportStageError
    from exporters.utils import Registry

    mask = torch.tensor([[0, 1, 1], [1, 0, 0]], dtype=dtype)
    if dtype == torch.int64:  # an int mask is what fails without the workarounds (Mllama's)
        with pytest.raises(ExportStageError, match="lower"):
            OnnxExporter(registry=Registry()).export(R(), {"mask": mask})
    art = OnnxExporter().export(R(), {"mask": mask})
    out = art(mask=mask)
    want = R()(mask)
    got = list(out.values())
    assert [g.dtype for g in got] == [w.dtype for w in want]
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert "fix:onnx:_fix_scalar_minus_tensor" in art.workarounds_fired


def test_onnx_squeeze_of_a_dim_that_is_not_one():
    """torch's ``squeeze(d)`` leaves a dim of size != 1 alone; ONNX Squeeze refuses it when the
    session loads (Mistral 3's projector, the RNNT decoders). The node fix drops such dims, keeps
    the size-1 ones, and the model matches eager."""
    from exporters import ExportStageError, OnnxExporter
    from exporters.utils import Registry

    class S(torch.nn.Module):
        def forward(self, x, y):
            return x.squeeze(0) * 2, y.squeeze((0, 1, 2)) + 1

    x, y = torch.randn(8, 4), torch.randn(1, 3, 1, 5)
    with pytest.raises(ExportStageError, match="Squeeze"):
        OnnxExporter(registry=Registry()).export(S(), {"x": x, "y": y})
    art = OnnxExporter().export(S(), {"x": x, "y": y})
    got = list(art(x=x, y=y).values())
    want = S()(x, y)
    assert [tuple(g.shape) for g in got] == [(8, 4), (3, 5)]
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert "fix:onnx:_fix_noop_squeeze" in art.workarounds_fired


def test_onnx_unsqueeze_of_a_complex_tensor():
    """torchlib has no complex ``unsqueeze``; the complex translation inserts the axis before the
    trailing (real, imag) axis, for positive and negative dims, and matches eager."""
    from exporters import ExportStageError, OnnxExporter
    from exporters.utils import Registry

    class Rope(torch.nn.Module):  # the complex rotary embedding of Llama 4 / DeepSeek-V2
        def forward(self, x, angles):
            z = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
            freqs = torch.polar(torch.ones_like(angles), angles)
            rotated = z * freqs.unsqueeze(0)
            return torch.view_as_real(rotated).flatten(-2), torch.view_as_real(freqs.unsqueeze(-1))

    x, angles = torch.randn(2, 5, 8), torch.randn(5, 4)
    with pytest.raises(ExportStageError, match="aten.unsqueeze"):
        OnnxExporter(registry=Registry()).export(Rope(), {"x": x, "angles": angles})
    art = OnnxExporter().export(Rope(), {"x": x, "angles": angles})
    got = art(x=x, angles=angles)
    for name, want in zip(art.output_names, Rope()(x, angles)):
        torch.testing.assert_close(got[name], want, atol=1e-5, rtol=1e-5)
    assert "translation:onnx:_aten_unsqueeze_complex" in art.workarounds_fired


def test_onnx_erfinv_translation_matches_torch(monkeypatch):
    """``Normal(0, 1).icdf`` (Gemma 3n) lowers to prims.erf_inv, which has no ONNX function; the
    translation follows torch within float32 precision across the range, tails included."""
    from exporters import ExportStageError, OnnxExporter

    class Icdf(torch.nn.Module):  # as Gemma 3n: the icdf of a tensor built in forward
        def forward(self, x):
            p = torch.cat([torch.linspace(1e-6, 1 - 1e-6, 501), torch.tensor([0.5, 0.999999, 1e-7])])
            return x * torch.distributions.normal.Normal(0, 1).icdf(p)

    x = torch.full((504,), 2.0)
    art = OnnxExporter().export(Icdf(), {"x": x})
    torch.testing.assert_close(art(x=x)["output"], Icdf()(x), atol=1e-5, rtol=1e-4)
    assert "translation:onnx:_aten_erfinv" in art.workarounds_fired
    for target in (torch.ops.aten.erfinv.default, torch.ops.prims.erf_inv.default):
        monkeypatch.delitem(_ONNX_TRANSLATION_TABLE, target)
    with pytest.raises(ExportStageError, match="erf_inv"):  # without the translation
        OnnxExporter().export(Icdf(), {"x": x})


def test_onnx_cummax_cummin_translation_matches_torch(monkeypatch):
    """ONNX has no CumMax / CumMin and torchlib no function for them (Grounding DINO's delimiter
    search); the Scan translations follow torch's index rule (ties and NaNs go to the latest index),
    keep the values bit for bit (-0.0 included), take bool and int inputs, any dim, and dynamic sizes."""
    from exporters import ExportStageError, OnnxExporter
    from exporters.exporter_onnx import OnnxConfig

    class Cum(torch.nn.Module):
        def forward(self, x, ids, mask):
            prev = torch.cummax(torch.where(mask, ids, -1), dim=1)  # as Grounding DINO
            low = torch.cummin(x, dim=-1)
            high = torch.cummax(x, dim=0)
            flags = torch.cummax(mask, dim=1)
            return (*prev, *low, *high, *flags)

    def check(art, x, ids, mask):
        got = art(x=x, ids=ids, mask=mask)
        for name, want in zip(art.output_names, Cum()(x, ids, mask)):
            assert got[name].dtype == want.dtype and got[name].shape == want.shape
            if want.is_floating_point():
                assert torch.equal(got[name].isnan(), want.isnan())
                assert torch.equal(torch.signbit(got[name]), torch.signbit(want))
                want, got[name] = want.nan_to_num(), got[name].nan_to_num()
            assert torch.equal(got[name], want), name

    nan, inf = float("nan"), float("inf")
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, nan, 5.0, nan, 7.0],
                      [-0.0, 0.0, -0.0, 1.0, 1.0, 0.0, 2.0, 2.0],
                      [-inf, -inf, 4.0, 4.0, inf, inf, -1.0, nan]])
    ids = torch.arange(8).expand(3, 8)
    mask = torch.tensor([[0, 1, 0, 0, 1, 1, 0, 1], [1, 0, 0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    art = OnnxExporter().export(Cum(), {"x": x, "ids": ids, "mask": mask})
    check(art, x, ids, mask)
    assert {"translation:onnx:_aten_cummax", "translation:onnx:_aten_cummin"} <= set(art.workarounds_fired)

    dynamic = OnnxExporter().export(Cum(), {"x": x, "ids": ids, "mask": mask}, OnnxConfig(dynamic=True))
    x2 = torch.randint(-2, 3, (5, 13)).float()
    check(dynamic, x2, torch.arange(13).expand(5, 13), torch.rand(5, 13) > 0.6)

    for target in (torch.ops.aten.cummax.default, torch.ops.aten.cummin.default):
        monkeypatch.delitem(_ONNX_TRANSLATION_TABLE, target)
    with pytest.raises(ExportStageError, match="aten.cummax"):  # without the translations
        OnnxExporter().export(Cum(), {"x": x, "ids": ids, "mask": mask})


def test_onnx_searchsorted_as_comparisons():
    """``torch.searchsorted`` has no ONNX function (MusicFlamingo); the node fix counts the boundaries
    before each value and matches eager for left/right/side, out_int32, a sorter, a Python scalar,
    NaN values, mixed dtypes, row-wise N-D sequences, and a searchsorted from torch.onnx's own
    decomposition of ``isin`` under dynamic shapes."""
    from exporters import ExportStageError, OnnxExporter
    from exporters.exporter_onnx import OnnxConfig
    from exporters.utils import Registry

    class Search(torch.nn.Module):
        def forward(self, seq, values, rows, row_values):
            shuffled = seq[torch.tensor([3, 0, 2, 1, 4])]
            return (
                torch.searchsorted(seq, values),  # int64 boundaries, float values: as MusicFlamingo
                torch.searchsorted(seq, values, right=True),
                torch.searchsorted(seq, values, side="right", out_int32=True),
                torch.searchsorted(shuffled, values, sorter=torch.tensor([1, 3, 2, 0, 4])),
                torch.searchsorted(rows, row_values),
                torch.searchsorted(rows, row_values, right=True),
                torch.searchsorted(seq, 3),
                torch.searchsorted(seq, 2.5, right=True),
            )

    inputs = {
        "seq": torch.tensor([1, 3, 3, 5, 8]),
        "values": torch.tensor([[0.0, 3.0, 3.5, float("nan"), 9.0], [8.0, 8.5, 1.0, 1.0, -1.0]]),
        "rows": torch.tensor([[1, 2, 2, 4], [0, 0, 5, 5]]),
        "row_values": torch.tensor([[2, 3, 0], [5, 0, 6]]),
    }
    with pytest.raises(ExportStageError, match="aten.searchsorted"):
        OnnxExporter(registry=Registry()).export(Search(), inputs)
    art = OnnxExporter().export(Search(), inputs)
    got = art(**inputs)
    for name, want in zip(art.output_names, Search()(**inputs)):
        assert got[name].dtype == want.dtype and torch.equal(got[name], want), name
    assert "fix:onnx:_fix_searchsorted_as_comparisons" in art.workarounds_fired

    class Isin(torch.nn.Module):  # Grounding DINO's delimiter mask: with dynamic sizes, torch.onnx's
        def forward(self, ids):  # decomposition of isin brings in a searchsorted after the first fixes
            return torch.isin(ids, torch.tensor([101, 102, 1012, 1029]))

    ids = torch.tensor([[101, 5, 1012, 7, 8, 102, 3], [3, 101, 4, 4, 1029, 9, 102]])
    art = OnnxExporter().export(Isin(), {"ids": ids}, OnnxConfig(dynamic=True))
    for x in (ids, torch.randint(1000, 1030, (3, 11))):
        assert torch.equal(art(ids=x)["output"], Isin()(x))
    assert "fix:onnx:_fix_searchsorted_as_comparisons" in art.workarounds_fired


def test_onnx_sym_numel_of_a_data_dependent_size():
    """``repeat_interleave`` by a constant count tensor has a data-dependent size whose ``numel``
    torch.onnx's decomposition checks with ``aten.sym_numel``, which has no ONNX function (Inkling 2's
    patch index). The node fix spells it as the product of ``sym_size``; the model matches eager."""
    from exporters import ExportStageError, OnnxExporter
    from exporters.utils import Registry

    class Patches(torch.nn.Module):  # as Inkling 2's vision model
        def forward(self, x):
            per_image = torch.tensor([[1, 2, 2], [1, 1, 2]]).prod(-1)
            index = torch.arange(x.shape[0]) + torch.repeat_interleave(torch.arange(1, 3), per_image)
            return x.repeat(2, 1)[index] * 2, index

    x = torch.randn(6, 3)
    with pytest.raises(ExportStageError, match="aten.sym_numel"):
        OnnxExporter(registry=Registry()).export(Patches(), {"x": x})
    art = OnnxExporter().export(Patches(), {"x": x})
    got = list(art(x=x).values())
    assert all(torch.equal(g, w) for g, w in zip(got, Patches()(x)))
    assert "fix:onnx:_fix_sym_numel_as_sizes" in art.workarounds_fired


def test_node_fixes_give_every_new_node_a_fake_val():
    """torch.onnx's lowering reads each node's meta['val'] (CHMv2 failed with KeyError: 'val'):
    replace_node computes it for every node a fix adds, not just the one that takes the old node's place."""
    from exporters.utils import FiredLog, FixEntry, apply_fx_node_fixes
    from exporters.workarounds.onnx.node_fixes import _fix_scalar_minus_tensor

    class R(torch.nn.Module):
        def forward(self, mask):
            return (1.0 - mask) * 2

    ep = torch.export.export(R(), (torch.ones(2, 3, dtype=torch.int64),))
    ep = ep.run_decompositions()
    entry = FixEntry(backend="onnx", kind="node", fn=_fix_scalar_minus_tensor)
    assert apply_fx_node_fixes([entry], ep.graph_module, FiredLog())
    nodes = [n for n in ep.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.mul.Tensor in {n.target for n in nodes}   # the fix's intermediate node
    missing = [n.name for n in nodes if "val" not in n.meta]
    assert not missing, missing
    mul = next(n for n in nodes if n.target is torch.ops.aten.mul.Tensor and n.args[1] == -1)
    assert tuple(mul.meta["val"].shape) == (2, 3)


class _PyramidPool(torch.nn.Module):
    """UperNet's pyramid pooling (BEiT, Data2VecVision segmentation): adaptive pools to 6 and 3 bins, 2-D
    and 1-D, average and max; and a global pool, which torch.onnx already got right."""

    def forward(self, x):
        return (F.adaptive_avg_pool2d(x, 6), F.adaptive_avg_pool2d(x, (3, None)), F.adaptive_max_pool2d(x, (3, 2)),
                F.adaptive_avg_pool1d(x[:, 0], 3), F.adaptive_max_pool1d(x[:, 0], 3), F.adaptive_avg_pool2d(x, 1))


def test_onnx_adaptive_avg_pool_at_sizes_other_than_the_traced_one():
    def run_at_sizes(art):
        for size in (12, 8, 9, 5, 3):  # 12 is traced; the others do not divide into 6 bins as 12 does
            x = torch.randn(2, 4, size, size + 1)
            want, got = _PyramidPool()(x), list(art(x=x).values())
            for w, g in zip(want, got):
                torch.testing.assert_close(g, w)

    inputs = {"x": torch.randn(2, 4, 12, 12)}
    bare = onx.OnnxExporter(registry=Registry()).export(_PyramidPool(), inputs, onx.OnnxConfig(dynamic=True))
    with pytest.raises((RuntimeError, AssertionError)):  # a wrong shape, or wrong values
        run_at_sizes(bare)
    art = onx.OnnxExporter().export(_PyramidPool(), inputs, onx.OnnxConfig(dynamic=True))
    for op in ("adaptive_avg_pool2d", "adaptive_max_pool2d", "adaptive_avg_pool1d", "adaptive_max_pool1d"):
        assert f"patch:onnx:torch.nn.functional.{op}" in art.workarounds_fired
    run_at_sizes(art)


class _ScaledPositions(torch.nn.Module):
    """DeepseekOcr2's resize arithmetic: integer positions times a ratio of two dynamic sizes (a SymFloat)."""

    def forward(self, x):
        ratio = x.shape[1] / x.shape[2]
        return x * ratio, torch.arange(x.shape[1])[:, None] * ratio


def test_onnx_tensor_times_a_symbolic_float():
    inputs = {"x": torch.randn(2, 6, 4)}
    with pytest.raises(ExportStageError, match="not 'SymbolicTensor'"):
        onx.OnnxExporter(registry=Registry()).export(_ScaledPositions(), inputs, onx.OnnxConfig(dynamic=True))
    art = onx.OnnxExporter().export(_ScaledPositions(), inputs, onx.OnnxConfig(dynamic=True))
    assert "fix:onnx:_fix_symbolic_float_operand" in art.workarounds_fired
    for shape in ((2, 6, 4), (3, 5, 7)):
        x = torch.randn(shape)
        for want, got in zip(_ScaledPositions()(x), art(x=x).values()):
            torch.testing.assert_close(got, want)


def test_onnx_remainder_by_a_symbolic_int():
    inputs = {"x": torch.randn(2, 6)}
    with pytest.raises(ExportStageError, match="not 'SymbolicTensor'"):
        onx.OnnxExporter(registry=Registry()).export(_PositionInRound(), inputs, onx.OnnxConfig(dynamic=True))
    art = onx.OnnxExporter().export(_PositionInRound(), inputs, onx.OnnxConfig(dynamic=True))
    assert "fix:onnx:_fix_symbolic_float_operand" in art.workarounds_fired
    for shape in ((2, 6), (3, 5)):
        x = torch.randn(shape)
        (got,) = art(x=x).values()
        torch.testing.assert_close(got, _PositionInRound()(x))


class _CeilFrames(torch.nn.Module):
    """Encodec's conv padding: frames = ceil((L - k) / s) written -((k - L) // s), a floor division
    of a size expression that is negative for L > k."""

    def forward(self, x):
        frames = -((7 - x.shape[1]) // 3)
        return torch.nn.functional.pad(x, (0, frames * 3 + 7 - x.shape[1]))


def test_onnx_floor_division_of_a_negative_size_expression():
    inputs = {"x": torch.randn(2, 40)}
    bare = onx.OnnxExporter(registry=Registry()).export(_CeilFrames(), inputs, onx.OnnxConfig(dynamic=True))
    art = onx.OnnxExporter().export(_CeilFrames(), inputs, onx.OnnxConfig(dynamic=True))
    assert "fix:onnx:_fix_symbolic_floordiv_floors" in art.workarounds_fired
    x = torch.randn(2, 41)  # 41 - 7 = 34 is not a multiple of 3: truncation and floor differ
    with pytest.raises(AssertionError):
        torch.testing.assert_close(next(iter(bare(x=x).values())), _CeilFrames()(x))
    for length in (40, 41, 42, 64):
        x = torch.randn(2, length)
        torch.testing.assert_close(next(iter(art(x=x).values())), _CeilFrames()(x))


def _split_by_unknown_size():
    """An ONNX model splitting x into chunks of a size given as a graph input (value unknown)."""
    import onnx
    import onnx.helper as h
    import onnx_ir as ir

    x = h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 3])
    size = h.make_tensor_value_info("s", onnx.TensorProto.INT64, [])
    y = h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    graph = h.make_graph([h.make_node("SplitToSequence", ["x", "s"], ["seq"], axis=0),
                          h.make_node("SequenceAt", ["seq", "zero"], ["y"])], "g", [x, size], [y],
                         initializer=[h.make_tensor("zero", onnx.TensorProto.INT64, [], [0])])
    return ir.from_proto(h.make_model(graph, opset_imports=[h.make_opsetid("", 18)]))


def test_onnx_split_to_sequence_by_an_unknown_size_is_not_folded():
    import onnxscript.optimizer

    name = "patch:onnx:onnxscript.optimizer._constant_folding.PartialEvaluatorRegistry.lookup_evaluators"
    with pytest.raises(RuntimeError, match="constant folding for node .*SplitToSequence"):
        onnxscript.optimizer.fold_constants(_split_by_unknown_size())
    fired = FiredLog()
    with apply_patches([p for p in DEFAULT_REGISTRY.patches("onnx") if p.name == name], fired):
        model = _split_by_unknown_size()
        onnxscript.optimizer.fold_constants(model)
    assert [n.op_type for n in model.graph] == ["SplitToSequence", "SequenceAt"]
    assert name in fired.names()


def test_rewrite_rules_tried_by_root_op_type_give_the_same_graph():
    """exporters/workarounds/onnx/onnxscript_optimizer.py: trying only the rules whose root op type is the node's
    changes no rewrite: the optimized graph of a tiny Llama, fp32 and int8, is the same text with the patch and
    without it; a rule rooted at one op type names it, and the patch is recorded on the export."""
    import onnx.printer
    from _tiny_llama import tiny_llama
    from onnxscript import rewriter

    from exporters.quantization import int8
    from exporters.workarounds.onnx.onnxscript_optimizer import root_op_type

    name = "patch:onnx:onnxscript.rewriter._rewrite_rule.RewriteRule.try_rewrite"
    roots = {root_op_type(rule) for rule in rewriter.pattern.RewriteRuleSet(rewriter._DEFAULT_REWRITE_RULES).rules}
    assert {"Reshape", "Cast", "Transpose"} <= roots
    model = tiny_llama()
    ids = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    for extra in ({}, {"quantization": int8(calibration=[inputs])}):
        patched = onx.OnnxExporter().export(model, inputs, onx.OnnxConfig(**extra))
        plain = onx.OnnxExporter(registry=DEFAULT_REGISTRY.without(name)).export(model, inputs, onx.OnnxConfig(**extra))
        assert name in patched.workarounds_fired and name not in plain.workarounds_fired
        assert onnx.printer.to_text(patched.model_proto.graph) == onnx.printer.to_text(plain.model_proto.graph)
