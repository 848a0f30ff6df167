"""The stage layout the spec documents, checked against the exporter sources, and the stage helpers.

SPEC.md's "Stage reference" is parsed for the stage names, so the spec and the sources stay in step.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest
import torch
import torch.nn.functional as F

import exporters.exporter_dynamo as dyn
import exporters.exporter_executorch as et
import exporters.exporter_onnx as onx
from exporters import ExportStageError
from exporters.utils import DEFAULT_REGISTRY, FiredLog, Registry, apply_fx_node_fixes, apply_patches, register_patch, resolve_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = os.environ.get("EXPORTERS_SPEC", "/work/shared/SPEC.md")
FILES = {
    "DynamoExporter": "exporters/exporter_dynamo.py",
    "OnnxExporter": "exporters/exporter_onnx.py",
    "ExecutorchExporter": "exporters/exporter_executorch.py",
}
_STOP = {"a", "an", "the", "and", "of", "for", "to", "in", "fx"}


def _spec_stages() -> dict[str, list[str]]:
    if not os.path.exists(SPEC):
        pytest.skip(f"spec not found at {SPEC}")
    text = open(SPEC, encoding="utf-8").read()
    section = text.split("**Stage reference.**", 1)[1].split("**Known upstream workarounds.**", 1)[0]
    stages: dict[str, list[str]] = {}
    current = None
    for line in section.splitlines():
        header = re.match(r"^(\w+Exporter) \(`(exporters/[\w.]+)`\)", line)
        if header:
            current = header.group(2)
            stages[current] = []
            continue
        item = re.match(r"^(\d)\. ([^:]+):", line)
        if item and current:
            assert int(item.group(1)) == len(stages[current]) + 1, f"spec numbering in {current}"
            stages[current].append(item.group(2).strip())
    return stages


def _source_stages(path: str) -> list[tuple[int, str]]:
    text = open(os.path.join(ROOT, path), encoding="utf-8").read()
    return [(int(n), name.strip()) for n, name in re.findall(r"^# ── Stage (\d+): (.+?) ─+\s*$", text, re.M)]


def _keywords(name: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", name.lower()) if w not in _STOP}


def test_spec_names_five_stages_for_each_exporter():
    stages = _spec_stages()
    assert set(stages) == set(FILES.values())
    for path, names in stages.items():
        assert len(names) == 5, (path, names)


@pytest.mark.parametrize("path", sorted(FILES.values()))
def test_stage_blocks_numbered_in_order_with_spec_names(path):
    spec_names = _spec_stages()[path]
    found = _source_stages(path)
    assert [n for n, _ in found] == [1, 2, 3, 4, 5], f"{path}: stage blocks {found}"
    for (n, name), expected in zip(found, spec_names):
        assert _keywords(expected) <= _keywords(name) or _keywords(name) <= _keywords(expected), (
            f"{path} stage {n} is {name!r}, the spec calls it {expected!r}"
        )


def _grep_onnx_workarounds() -> set[str]:
    out = subprocess.run(
        ["grep", "-nE", "^def (_patch_|_fix_|_aten_)", "exporters/exporter_onnx.py"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout
    return {m.group(1) for m in re.finditer(r"^\d+:def (\w+)\(", out, re.M)}


def test_onnx_grep_lists_every_registered_onnx_workaround():
    listed = _grep_onnx_workarounds()
    registered = set()
    for entry in DEFAULT_REGISTRY.patches("onnx"):
        registered.add(entry.factory)
    for kind in ("node", "program"):
        registered.update(e.fn for e in DEFAULT_REGISTRY.fixes("onnx", kind))
    registered.update(onx._IR_FIXES)
    registered.update(onx._ONNX_TRANSLATION_TABLE.values())
    in_this_file = {f.__name__ for f in registered if getattr(f, "__module__", None) == onx.__name__}
    assert in_this_file, "no ONNX workaround registered from exporters/exporter_onnx.py"
    assert in_this_file <= listed, f"not found by the spec's grep: {sorted(in_this_file - listed)}"


def test_onnx_stage_tables_exist():
    assert isinstance(onx._ONNX_TRANSLATION_TABLE, dict)
    for key, fn in onx._ONNX_TRANSLATION_TABLE.items():
        assert fn.__name__.startswith("_aten_"), key
    assert isinstance(onx._IR_FIXES, tuple) and onx._IR_FIXES
    for fix in onx._IR_FIXES:
        assert fix.__name__.startswith("_fix_ir_")


def test_every_default_onnx_and_executorch_patch_resolves():
    for entry in DEFAULT_REGISTRY.patches(*("dynamo", "onnx", "executorch")):
        if not entry.optional:
            resolve_path(entry.path)


def test_executorch_backend_prepare_table():
    assert {"xnnpack", "cuda"} <= set(et._BACKEND_PREPARE)
    for name, fn in et._BACKEND_PREPARE.items():
        assert fn.__name__ == f"prepare_for_{name}"


def test_prepare_for_xnnpack_moves_to_cpu_fp32():
    model = torch.nn.Linear(2, 2).to(torch.float64)
    m, inputs, partitioners = et._BACKEND_PREPARE["xnnpack"](model, {"x": torch.zeros(1, 2), "flag": True})
    assert next(m.parameters()).dtype == torch.float32
    assert inputs["flag"] is True and inputs["x"].device.type == "cpu"
    assert len(partitioners) == 1 and "Xnnpack" in type(partitioners[0]).__name__


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA device")
def test_prepare_for_cuda_without_gpu_says_no_cuda_device():
    with pytest.raises(RuntimeError, match=r"(?i)cuda device"):
        et._BACKEND_PREPARE["cuda"](torch.nn.Linear(2, 2), {"x": torch.zeros(1, 2)})
    from exporters import ExecutorchConfig, ExecutorchExporter

    with pytest.raises(Exception, match=r"(?i)cuda device"):
        ExecutorchExporter().export(torch.nn.Linear(2, 2), {"input": torch.zeros(1, 2)}, ExecutorchConfig(backend="cuda"))


def test_executorch_unknown_backend_lists_registered():
    from exporters import ExecutorchConfig, ExecutorchExporter

    with pytest.raises(ValueError, match="xnnpack"):
        ExecutorchExporter().export(torch.nn.Linear(2, 2), {"input": torch.zeros(1, 2)}, ExecutorchConfig(backend="vulkan9"))


def test_stateful_cache_attrs_and_context_helpers_exist():
    assert isinstance(dyn._STATEFUL_CACHE_ATTRS, tuple) and all(isinstance(a, str) for a in dyn._STATEFUL_CACHE_ATTRS)
    assert callable(dyn._flatten_to_context) and callable(dyn._unflatten_from_context)


def test_nllb_moe_cast_classifier_patch_registered_for_dynamo():
    path = "transformers.models.nllb_moe.modeling_nllb_moe.NllbMoeTop2Router._cast_classifier"
    (entry,) = [e for e in DEFAULT_REGISTRY.patches("dynamo") if e.path == path]
    assert entry.factory is dyn._patch_classifier_cast
    owner, name = resolve_path(path)
    original = owner.__dict__[name]
    with apply_patches([entry]) as fired:
        assert owner.__dict__[name] is not original
        assert getattr(owner, name)(object()) is None
    assert owner.__dict__[name] is original
    assert fired.names() == [f"patch:dynamo:{path}"]


# ── behaviour of the stage helpers ────────────────────────────────────────────


class _Kw(torch.nn.Module):
    def forward(self, input_ids=None, attention_mask=None, scale=1.0, **kwargs):
        return input_ids * attention_mask * scale


def test_stage1_flat_forward_signature_restores_forward():
    import inspect

    model = _Kw()
    assert "forward" not in model.__dict__
    with dyn.flat_forward_signature(model, ["input_ids", "attention_mask"], {"scale": 2.0}):
        assert list(inspect.signature(model.forward).parameters) == ["input_ids", "attention_mask"]
        out = model.forward(torch.ones(2), torch.full((2,), 3.0))
        assert torch.equal(out, torch.full((2,), 6.0))
    assert "forward" not in model.__dict__


def test_stage3_flatten_unflatten_round_trip():
    class Box:
        def __init__(self):
            self.a = torch.arange(3)
            self.items = [torch.ones(1), {"k": torch.zeros(2), "n": 5}, "text"]

    box = Box()
    tensors: list = []
    ctx = dyn._flatten_to_context(vars(box), tensors)
    hash(ctx)
    assert [p for p, _ in tensors] == ["a", "items.0", "items.1.k"]
    rebuilt = dyn._unflatten_from_context(ctx, iter([t * 2 for _, t in tensors]))
    assert torch.equal(rebuilt["a"], box.a * 2)
    assert rebuilt["items"][1]["n"] == 5 and rebuilt["items"][2] == "text"
    assert torch.equal(rebuilt["items"][1]["k"], torch.zeros(2))


def test_stage3_cache_leaf_names():
    from transformers import DynamicCache

    from exporters.utils import flatten_outputs

    cache = DynamicCache()
    cache.update(torch.zeros(1, 2, 3, 4), torch.ones(1, 2, 3, 4), 0)
    names = list(flatten_outputs({"past_key_values": cache}))
    assert "past_key_values.0.key" in names and "past_key_values.0.value" in names


def test_stage4_auto_dynamic_shapes_bounds():
    from torch.export import Dim

    shapes = dyn.auto_dynamic_shapes({"x": torch.zeros(2, 3000), "y": torch.zeros(5)}, max_dim=64)
    assert set(shapes) == {"x", "y"} and set(shapes["x"]) == {0, 1} and set(shapes["y"]) == {0}
    assert all(h.type == Dim.AUTO.type for dims in shapes.values() for h in dims.values())
    assert [shapes["x"][0].max, shapes["x"][1].max, shapes["y"][0].max] == [64, 3000, 64]  # never below the traced size


class _Stateful(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self._cache = None

    def forward(self, x):
        self._cache = x * 2
        return x + 1


def test_stage5_state_cleanup_after_export():
    from exporters import DynamoExporter

    model = _Stateful().eval()
    art = DynamoExporter().export(model, {"x": torch.ones(2)})
    assert model._cache is None  # not a leftover fake tensor from tracing
    assert torch.equal(art(x=torch.ones(2))["output"], torch.full((2,), 2.0))


def test_fix_dead_assertions_removes_unused_asserts():
    class M(torch.nn.Module):
        def forward(self, x):
            torch.ops.aten._assert_tensor_metadata.default(x, dtype=torch.float32)
            return x + 1

    gm = torch.export.export(M(), (torch.ones(2),)).graph_module
    targets = lambda: [n for n in gm.graph.nodes if n.target is torch.ops.aten._assert_tensor_metadata.default]
    assert targets(), "the export no longer keeps the assertion node; the fix has nothing to test"
    fired = FiredLog()
    assert apply_fx_node_fixes([e for e in DEFAULT_REGISTRY.fixes("onnx", "node") if e.fn is onx._fix_dead_assertions], gm, fired)
    assert targets() == []
    assert fired.names() == ["fix:onnx:_fix_dead_assertions"]


def test_executorch_bounds_unbounded_dims_before_tracing():
    """Memory planning needs every dynamic dim bounded when torch.export runs."""
    from torch.export import Dim

    spec = {"x": {0: Dim("n", min=2), 1: Dim("m", min=2, max=10), 2: Dim.AUTO}, "y": [None, {0: Dim.AUTO(max=5)}]}
    bounded = et.bound_dynamic_shapes(spec, 64)
    assert (bounded["x"][0].min, bounded["x"][0].max) == (2, 64)
    assert bounded["x"][1].max == 10  # already bounded: kept
    assert bounded["x"][2].max == 64
    assert bounded["y"][0] is None and bounded["y"][1][0].max == 5
    assert spec["x"][0].max != 64  # the caller's spec is not mutated


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
    assert onx._fix_ir_topk_sorted(model) is True
    topks = [n for n in onx._all_nodes(model) if n.op_type == "TopK"]
    assert len(topks) == 1 and topks[0].attributes["sorted"].as_int() == 1
    assert onx._fix_ir_topk_sorted(model) is False  # nothing left to change


def test_ir_fix_leaves_sorted_topk_alone():
    assert onx._fix_ir_topk_sorted(_topk_model(1)) is False


def test_flatten_outputs_rejects_colliding_leaf_names():
    from exporters.utils import flatten_outputs

    flat = flatten_outputs({"a": {"b": torch.zeros(1)}, "c": (torch.ones(1), 3)})
    assert list(flat) == ["a.b", "c.0"]
    with pytest.raises(ValueError, match="a.b"):
        flatten_outputs({"a": {"b": torch.zeros(1)}, "a.b": torch.ones(1)})


class _Leaky(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cached_sequence_length = "before"

    def forward(self, x):
        self.scratch = x + 0  # a new tensor attribute: a FakeTensor after tracing
        self.cached_sequence_length = x.shape[0]  # named in _STATEFUL_CACHE_ATTRS (a SymInt while tracing)
        return x * 3


def test_stage5_removes_fake_tensors_and_restores_named_state():
    from exporters import DynamoExporter
    from exporters.utils import Registry

    assert "cached_sequence_length" in dyn._STATEFUL_CACHE_ATTRS
    model = _Leaky().eval()
    art = DynamoExporter(registry=Registry()).export(model, {"x": torch.ones(2)})
    assert "scratch" not in vars(model)
    assert model.cached_sequence_length == "before"
    assert torch.equal(model(torch.ones(2)), torch.full((2,), 3.0))  # eager still works
    assert torch.equal(art(x=torch.ones(2))["output"], torch.full((2,), 3.0))


def _node_fix(fn):
    """The registered executorch node fix whose function is ``fn``, as apply_fx_node_fixes takes it."""
    return [e for e in DEFAULT_REGISTRY.fixes("executorch", "node") if e.fn is fn]


def test_executorch_gelu_tanh_is_spelled_out():
    """XNNPACK computes gelu(approximate='tanh') as the erf GELU; the node fix rewrites it, exactly."""
    class G(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.gelu(x, approximate="tanh") + torch.nn.functional.gelu(x)

    x = torch.linspace(-4, 4, 64).reshape(2, 32)
    gm = torch.export.export(G(), (x,)).module()
    fix = _node_fix(et._fix_gelu_tanh_explicit)
    fired = FiredLog()
    assert apply_fx_node_fixes(fix, gm, fired)
    gelus = [n for n in gm.graph.nodes if n.target is torch.ops.aten.gelu.default]
    assert len(gelus) == 1 and gelus[0].kwargs.get("approximate", "none") == "none"  # the exact one is kept
    torch.testing.assert_close(gm(x), G()(x), atol=1e-6, rtol=1e-6)
    assert fired.names() == ["fix:executorch:_fix_gelu_tanh_explicit"]


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
    fix = _node_fix(et._fix_bucketize_as_comparisons)
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
    fix = _node_fix(et._fix_bucketize_as_comparisons)
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
    fix = _node_fix(et._fix_bucketize_as_comparisons)
    assert not apply_fx_node_fixes(fix, gm, FiredLog())


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
    assert et._patch_dim_order_positive_strides(dim_order_from_stride)(strides()) == (0, 1, 2, 3)
    assert et._patch_dim_order_positive_strides(dim_order_from_stride)((12, 4, 1)) == (0, 1, 2)
    assert et._patch_dim_order_positive_strides(dim_order_from_stride)((1, 3)) == (1, 0)  # permuted

    def undecidable():
        with FakeTensorMode(shape_env=ShapeEnv()):
            n = torch.ones(10, dtype=torch.bool).nonzero().shape[0]
            torch._check(n <= 10)
            return (n * (8 // n), n, 1)  # n*(8//n) < n cannot be decided

    assert et._patch_dim_order_positive_strides(dim_order_from_stride)(undecidable()) == (0, 1, 2)


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
        assert et._patch_dim_order_positive_strides(dim_order_from_stride)(stride) == (0, 1, 2)

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
    with pytest.raises(RuntimeError, match=r"0x12; the runtime logged: .*Expect input tensor to be 3-D or 4-D.*KernelCall failed .* aten::convolution.out"):
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
        et._fix_slice_bounds_checked(program.graph_module, node)
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


class _ReassignsItsBuffer(torch.nn.Module):
    """Reassigns its buffer in forward, as CTRL does with ``self.pos_encoding = self.pos_encoding.to(...)``."""

    def __init__(self):
        super().__init__()
        self.pos_encoding = torch.nn.Buffer(torch.randn(16, 8), persistent=False)

    def forward(self, x):
        self.pos_encoding = self.pos_encoding.to(device=x.device, dtype=x.dtype)
        return x + self.pos_encoding[: x.shape[0]]


def test_executorch_buffers_keep_their_values():
    """After to_edge the reassignment is a buffer mutation, and ExecuTorch saves a mutated buffer
    without its values unless told to: the program read zeros for the position encodings."""
    torch.manual_seed(0)
    model, inputs = _ReassignsItsBuffer().eval(), {"x": torch.randn(3, 8)}
    expected = model(**inputs)
    (actual,) = et.ExecutorchExporter().export(model, inputs)(**inputs).values()
    torch.testing.assert_close(actual, expected)


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
    et._patch_xnnpack_pass_through_outputs(lambda ep, module: seen.append(module) or {})(None, gm)
    (out,) = [n for n in seen[0].graph.nodes if n.op == "output"]
    first, second, third = out.args[0]
    assert first.target is exir_ops.edge.aten.clone.default and first.args == (a,)
    assert second is doubled and third.target is exir_ops.edge.aten.clone.default and third.args == (doubled,)
    assert first.meta["val"].shape == (2, 3)


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


def _assert_fix_supplies_missing_kernel(model, inputs, kernel: str, fix: str) -> None:
    """Without any workaround the program fails to load naming ``kernel``; with them ``fix`` fires
    and every output matches eager."""
    with pytest.raises(ExportStageError, match=f"no kernel for {re.escape(kernel)}"):
        et.ExecutorchExporter(registry=Registry()).export(model, inputs)
    art = et.ExecutorchExporter().export(model, inputs)
    assert f"fix:executorch:{fix}" in art.workarounds_fired
    expected = model(**inputs)
    for got, want in zip(art(**inputs).values(), expected if isinstance(expected, tuple) else (expected,)):
        torch.testing.assert_close(got, want)


def _assert_fix_repairs_a_run(model, inputs, error: str, fix: str) -> None:
    """Without any workaround the program lowers but its run fails with ``error``; with them ``fix``
    fires and every output matches eager."""
    bare = et.ExecutorchExporter(registry=Registry()).export(model, inputs)
    with pytest.raises(RuntimeError, match=error):
        bare(**inputs)
    art = et.ExecutorchExporter().export(model, inputs)
    assert f"fix:executorch:{fix}" in art.workarounds_fired
    expected = model(**inputs)
    for got, want in zip(art(**inputs).values(), expected if isinstance(expected, tuple) else (expected,)):
        torch.testing.assert_close(got, want)


class _NormalQuantile(torch.nn.Module):
    def forward(self, x):
        return torch.distributions.Normal(0, 1).icdf(x) * 2 + torch.erfinv(x * 0.999)


def test_executorch_erfinv_without_its_kernel():
    """Gemma 3n's Normal(0, 1).icdf needs erfinv, which the runtime has no kernel for."""
    inputs = {"x": torch.linspace(0.001, 0.999, 64).reshape(4, 16)}
    _assert_fix_supplies_missing_kernel(_NormalQuantile(), inputs, "aten::erfinv.out", "_fix_erfinv_as_polynomial")


class _TimeGrid(torch.nn.Module):
    """MusicFlamingo's lookup of each frame's time in a sorted grid."""

    def forward(self, grid, t):
        return torch.searchsorted(grid, t, right=True) * 2


def test_executorch_searchsorted_without_its_kernel():
    inputs = {"grid": torch.linspace(0, 1, 9), "t": torch.tensor([[0.0, 0.125, 0.3], [0.999, 1.0, 1.5]])}
    _assert_fix_supplies_missing_kernel(_TimeGrid(), inputs, "aten::searchsorted.Tensor_out",
                                        "_fix_bucketize_as_comparisons")


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


def test_executorch_runtime_error_codes_are_named():
    assert "MemoryAllocationFailed" in et.runtime_error_name("Failed to load method forward, error: 0x:21")
    assert "OperatorMissing" in et.runtime_error_name("error: 0x14")
    assert "unknown" in et.runtime_error_name("no code here")


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
    with pytest.raises(Exception):  # specialized to the traced sizes: the runtime refuses the others
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


class _DataDependentLength(torch.nn.Module):
    """A length read from data (Siglip2's patch grid, Lfm2-VL's image token count)."""

    def forward(self, x, counts):
        n = counts.sum().item()
        torch._check(n >= 0)
        return torch.arange(n, dtype=x.dtype) * x.sum()  # a length bounded by nothing but the data


def test_executorch_unbacked_size_bounded_by_its_traced_value(monkeypatch):
    inputs = {"x": torch.randn(8, 3), "counts": torch.tensor([2, 1, 2])}
    with monkeypatch.context() as m:
        m.setattr(et, "bound_unbacked_sizes_by_trace", lambda program, inputs: False)
        with pytest.raises(ExportStageError, match="Cannot evaluate a finite upper bound"):
            et.ExecutorchExporter().export(_DataDependentLength(), inputs)
    art = et.ExecutorchExporter().export(_DataDependentLength(), inputs)
    assert "fix:executorch:bound_unbacked_sizes_by_trace" in art.workarounds_fired
    for counts in ([2, 1, 2], [1, 1, 1]):  # the traced length and a shorter one
        feed = {"x": inputs["x"], "counts": torch.tensor(counts)}
        torch.testing.assert_close(next(iter(art(**feed).values())), _DataDependentLength()(**feed))
    with pytest.raises(RuntimeError, match="resize"):  # longer than planned: refused, not wrong
        art(x=inputs["x"], counts=torch.tensor([3, 3, 1]))


class _LengthFromMask(torch.nn.Module):
    """Longformer's padded length / JetMoE's expert counts: a size read from data that grows with the
    (dynamic) sequence."""

    def forward(self, x, mask):
        n = mask.sum().item()
        torch._check(n >= 0)
        return torch.arange(n, dtype=x.dtype) * x.amax()  # amax: exact, whatever the order


def test_executorch_unbacked_size_bounded_at_the_largest_inputs():
    inputs = {"x": torch.randn(2, 7), "mask": torch.ones(2, 7, dtype=torch.long)}
    seq = torch.export.Dim("seq", min=2, max=32)
    art = et.ExecutorchExporter().export(_LengthFromMask(), inputs, et.ExecutorchConfig(
        dynamic=True, dynamic_shapes={"x": {1: seq}, "mask": {1: seq}}))
    assert "fix:executorch:bound_unbacked_sizes_by_trace" in art.workarounds_fired
    for length in (7, 12, 32):  # bounded at the traced 14 only, 24 and 64 were refused
        feed = {"x": torch.randn(2, length), "mask": torch.ones(2, length, dtype=torch.long)}
        torch.testing.assert_close(next(iter(art(**feed).values())), _LengthFromMask()(**feed))


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


def test_executorch_missing_kernel_is_named():
    """A program that calls an op the runtime has no kernel for fails to load with the op's name,
    not an error code."""
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    class B(torch.nn.Module):
        def forward(self, x):
            return torch.bucketize(x, torch.tensor([0.1, 0.5]), right=True)

    program = torch.export.export(B(), (torch.rand(4),))
    buffer = to_edge_transform_and_lower(program, compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_executorch().buffer
    assert et.missing_kernels(buffer, ["dim_order_ops::_clone_dim_order.out"]) == ["aten::bucketize.Tensor_out"]
    with pytest.raises(RuntimeError, match=r"no kernel for aten::bucketize.Tensor_out, which the program calls"):
        et.load_forward(buffer)


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
        monkeypatch.delitem(onx._ONNX_TRANSLATION_TABLE, target)
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
        monkeypatch.delitem(onx._ONNX_TRANSLATION_TABLE, target)
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
    from exporters.workarounds.onnx.node_fixes import _fix_scalar_minus_tensor
    from exporters.utils import FiredLog, FixEntry, apply_fx_node_fixes

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


class _CausalPadConv(torch.nn.Module):
    """Encodec's causal conv in small: stride/kernel/padding as 0-dim int64 non-persistent buffers, and
    the right padding computed from them as a tensor (models/encodec/modeling_encodec.py:122-135)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(2, 3, kernel_size=4, stride=2)
        self.stride = torch.nn.Buffer(torch.tensor(2), persistent=False)
        self.kernel_size = torch.nn.Buffer(torch.tensor(4), persistent=False)
        self.padding_total = torch.nn.Buffer(torch.tensor(2), persistent=False)
        self.steps = torch.nn.Buffer(torch.tensor(0))  # persistent: saved state, not baked
        self.scale = torch.nn.Buffer(torch.tensor(0.5), persistent=False)  # float: not baked

    def forward(self, x):
        length = x.shape[-1]
        n_frames = torch.ceil((length - self.kernel_size + self.padding_total) / self.stride + 1).to(torch.int64) - 1
        extra = n_frames * self.stride + self.kernel_size - self.padding_total - length
        padded = torch.nn.functional.pad(x, (self.padding_total, extra))
        if padded.shape[-1] <= 4:  # a branch on the padded length, like _pad1d's 'if length <= max_pad'
            padded = torch.nn.functional.pad(padded, (0, 1))
        return self.conv(padded) * self.scale


def test_stage1_scalar_int_buffers_are_baked_while_tracing_and_restored():
    from exporters import DynamoConfig, DynamoExporter
    from exporters.specialize import constant_buffers

    model = _CausalPadConv().eval()
    x = torch.randn(1, 2, 9)
    assert sorted(n for _, n in constant_buffers(model)) == ["kernel_size", "padding_total", "stride"]
    with pytest.raises(Exception, match="(?i)data.dependent|unbacked|guard"):
        torch.export.export(model, (x,))  # the failure the bake removes
    artifact = DynamoExporter().export(model, {"x": x}, DynamoConfig())
    (out,) = artifact(x=x).values()
    torch.testing.assert_close(out, model(x))
    assert {n for n, _ in model.named_buffers()} == {"stride", "kernel_size", "padding_total", "steps", "scale"}
    assert model._non_persistent_buffers_set == {"stride", "kernel_size", "padding_total", "scale"}
    assert "stride" not in model.__dict__


class _AnnealedBlocks(torch.nn.Module):
    """EoMT's masked-attention annealing: per block, a probability kept in a persistent float buffer,
    read in Python to decide whether the block masks at all."""

    def __init__(self, buffer_name: str):
        super().__init__()
        self.buffer_name = buffer_name
        self.register_buffer(buffer_name, torch.tensor([1.0, 0.0, 1.0]))
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        probs = getattr(self, self.buffer_name)
        for i in range(3):
            x = self.proj(x)
            if self.training or probs[i] > 0:
                x = x.masked_fill(x < 0, 0.0)
        return x


def test_stage1_named_constant_buffers_are_baked():
    from exporters import DynamoExporter

    x = torch.randn(2, 4)
    with pytest.raises(ExportStageError, match="(?i)data.dependent"):
        DynamoExporter().export(_AnnealedBlocks("probs").eval(), {"x": x})  # a name the bake does not know
    model = _AnnealedBlocks("attn_mask_probs").eval()
    (out,) = DynamoExporter().export(model, {"x": x})(x=x).values()
    torch.testing.assert_close(out, model(x))
    assert "attn_mask_probs" in model._buffers and "attn_mask_probs" not in model.__dict__


def test_stage2_experts_eager_and_grouped_mm_trace_as_batched_mm():
    from transformers.integrations import moe

    get_interface = dyn._patch_experts_batched_mm(moe.ExpertsInterface.get_interface)

    def own_eager_loop(self, *args):  # a decorated class's own forward: 'for expert_idx in expert_hit'
        raise AssertionError("the data-dependent loop must not be traced")

    for requested in ("eager", "grouped_mm", "batched_mm"):
        assert get_interface(moe.ALL_EXPERTS_FUNCTIONS, requested, own_eager_loop) is moe.batched_mm_experts_forward


def test_stage2_pixel_shuffle_int_matches_internvl_and_exports_dynamic():
    from transformers.models.internvl.modeling_internvl import InternVLModel

    patched = dyn._patch_pixel_shuffle_int(InternVLModel.pixel_shuffle)
    x = torch.randn(2, 6, 4, 8)
    for scale in (0.5, 0.25):
        y = torch.randn(2, 8, 8, 16)
        torch.testing.assert_close(patched(None, y, scale), InternVLModel.pixel_shuffle(None, y, scale), rtol=0, atol=0)
    torch.testing.assert_close(patched(None, x), InternVLModel.pixel_shuffle(None, x), rtol=0, atol=0)

    class Shuffle(torch.nn.Module):
        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def forward(self, v):
            return self.fn(None, v)

    dims = {"v": {1: torch.export.Dim.AUTO, 2: torch.export.Dim.AUTO}}
    with pytest.raises(Exception, match="Invalid ranges|ValueRange"):
        torch.export.export(Shuffle(InternVLModel.pixel_shuffle), (), {"v": x}, dynamic_shapes=dims)
    torch.export.export(Shuffle(patched), (), {"v": x}, dynamic_shapes=dims)


def test_stage2_placeholder_count_check_exports_and_still_refuses_a_mismatch():
    from transformers.models.hunyuan_vl.modeling_hunyuan_vl import HunYuanVLModel

    patched = dyn._patch_placeholder_count_check(HunYuanVLModel.get_placeholder_mask)
    config = type("Config", (), {"image_token_id": 9})()
    owner = type("Owner", (), {"config": config})()
    ids = torch.tensor([[1, 9, 9, 2], [9, 3, 4, 5]])
    embeds, features = torch.randn(2, 4, 8), torch.randn(3, 8)
    expected = HunYuanVLModel.get_placeholder_mask(owner, ids, embeds, features)
    assert torch.equal(patched(owner, ids, embeds, features), expected)
    with pytest.raises(ValueError, match="do not match"):
        patched(owner, ids, embeds, torch.randn(2, 8))

    class Scatter(torch.nn.Module):
        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def forward(self, ids, embeds, features):
            return embeds.masked_scatter(self.fn(owner, ids, embeds, features), features)

    inputs = {"ids": ids, "embeds": embeds, "features": features}
    with pytest.raises(Exception, match="data-dependent"):
        torch.export.export(Scatter(HunYuanVLModel.get_placeholder_mask), (), inputs)
    program = torch.export.export(Scatter(patched), (), inputs)
    torch.testing.assert_close(program.module()(**inputs), Scatter(HunYuanVLModel.get_placeholder_mask)(**inputs))


def test_executorch_partition_cycle_lowers_again_per_op(monkeypatch):
    """FlavaForPreTraining: fusing XNNPACK's partitions found a dependency cycle between two of them. The
    exporter lowers again with one partition per op, and names that in the workarounds fired."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    real, seen = et._lower_program, []

    def cyclic_unless_per_op(program, partitioners, et_patches, fired):
        seen.append([getattr(p, "per_op_mode", None) for p in partitioners])
        if not all(p.per_op_mode for p in partitioners if isinstance(p, XnnpackPartitioner)):
            raise AssertionError("Invalid partition, found dependency cycles")
        return real(program, partitioners, et_patches, fired)

    monkeypatch.setattr(et, "_lower_program", cyclic_unless_per_op)
    inputs = {"input": torch.randn(2, 5)}
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    art = et.ExecutorchExporter().export(model, inputs)
    assert seen == [[False], [True]]
    assert "fix:executorch:per_op_partitions_on_cycle" in art.workarounds_fired
    torch.testing.assert_close(art(**inputs)["output"], model(inputs["input"]))
    assert et.per_op_partitioners([]) is None  # no XNNPACK partitioner: the error is raised as it is
    monkeypatch.setattr(et, "_lower_program", lambda *a: (_ for _ in ()).throw(AssertionError("something else")))
    with pytest.raises(ExportStageError, match="something else"):
        et.ExecutorchExporter().export(model, inputs)


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


class _PositionInRound(torch.nn.Module):
    """Reformer's LSH sort: flat indices over hash rounds taken modulo the (dynamic) sequence length;
    ``start=-1`` begins one before the first, a negative dividend."""

    def __init__(self, start: int = 0):
        super().__init__()
        self.start = start

    def forward(self, x):
        flat = torch.arange(3 * x.shape[1]).expand(x.shape[0], -1) + self.start
        return x.gather(1, flat % x.shape[1])


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


class _DataDependent(torch.nn.Module):
    def forward(self, x):
        return x * 2 if x.sum() > 0 else x  # a data-dependent branch: the export fails


def test_failed_dynamic_export_leaves_inputs_unmarked():
    """torch.export leaves dynamic-dim marks on its input tensors when it fails; a later static export
    of the same tensors (the sweep's cached inputs) must stay static."""
    x = torch.randn(3, 4)
    with pytest.raises(ExportStageError):
        dyn.DynamoExporter().export(_DataDependent(), {"x": x}, dyn.DynamoConfig(dynamic=True))
    assert not [a for a in vars(x) if a.startswith("_dynamo_")]
    art = dyn.DynamoExporter().export(torch.nn.Linear(4, 2), {"input": x})
    assert art.dynamic_dims == {"input": {}} or not any(art.dynamic_dims.values())


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
    with pytest.raises(et.PlannedShapeError, match=r"input 'x' dim 0 is 3, but the ExecuTorch program was planned "
                       r"for at most 2; torch.export gave it the range \[2, \d+\]"):
        bad(**larger)
    art = et.ExecutorchExporter().export(model, traced, et.ExecutorchConfig(dynamic=True))
    assert "fix:executorch:_fix_circular_pad_as_cat" in art.workarounds_fired
    for case in (traced, larger):
        (actual,) = art(**case).values()
        torch.testing.assert_close(actual, model(**case), atol=1e-5, rtol=1e-5)


class _PairConv(torch.nn.Module):
    """EfficientLoFTR's backbone: image pairs folded into the conv batch, an unstrided 3x3 conv."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, kernel_size=3, padding=1)

    def forward(self, pixel_values):
        b, pair, c, h, w = pixel_values.shape
        return self.conv(pixel_values.reshape(b * pair, c, h, w))


def test_executorch_conv_batch_not_narrowed_by_cpu_kernel_choice():
    """ATen's CPU conv choice reads batch >= 16; the lowering must not keep that as a bound on the batch."""
    model = _PairConv().eval()
    batch = torch.export.Dim("batch", min=2, max=32)
    art = et.ExecutorchExporter().export(model, {"pixel_values": torch.randn(2, 2, 3, 8, 8)}, et.ExecutorchConfig(
        dynamic=True, dynamic_shapes={"pixel_values": {0: batch}}))
    assert art._planned_input_sizes()[0][0] == 32  # narrowed to 7 (2*b < 16) before cpu_conv_heuristics_off
    feed = torch.randn(20, 2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(next(iter(art(pixel_values=feed).values())), model(feed), rtol=1e-4, atol=1e-4)
    assert torch.backends.mkldnn.enabled  # restored after the lowering
