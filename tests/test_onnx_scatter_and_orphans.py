"""ONNX workarounds, each checked against the bug it works around.

- ``_aten_scatter_reduce``: torchlib lowers ``scatter_reduce(reduce="mean")`` to ``ScatterElements(reduction="none")``
  (ONNX has no mean reduction, onnx/onnx#5100): the last scattered value instead of the mean (TAPAS' segmented means).
- ``_fix_ir_register_orphan_constants``: onnxscript's ``FuseMaxMinToClip`` names its bounds after the clamped tensor,
  and the rewriter's initializer registration overwrites same-name entries (microsoft/onnxscript#2945), so two clamps
  of one tensor leave a Clip bound unregistered and ONNX Runtime refuses the model (Gemma 4's audio encoder).
- ``_aten_repeat_interleave_self_int``: torchlib puts a symbolic repeat count one axis too early in its Expand target
  (InstructBlipVideo's ``repeat_interleave(frames, dim=0)``: unrepeated rows, or 'invalid expand shape').
"""

from __future__ import annotations

import pytest
import torch


def _export(model, inputs, optimize=True):
    from exporters import OnnxConfig, OnnxExporter

    return OnnxExporter().export(model, inputs, OnnxConfig(optimize=optimize))


class _ScatterReduce(torch.nn.Module):
    def __init__(self, reduce, include_self, dim):
        super().__init__()
        self.reduce, self.include_self, self.dim = reduce, include_self, dim

    def forward(self, base, index, src):
        return base.scatter_reduce(self.dim, index, src, reduce=self.reduce, include_self=self.include_self)


@pytest.mark.parametrize("reduce", ["mean", "sum", "amax"])
@pytest.mark.parametrize("include_self", [False, True])
@pytest.mark.parametrize("dim", [0, 1])
def test_scatter_reduce_matches_torch(reduce, include_self, dim):
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 5, generator=g)
    src = torch.randn(6, 5, generator=g)
    # repeated targets (a real mean) and positions nothing is scattered to (keep base)
    index = torch.randint(0, 3, (6, 5), generator=g)
    model = _ScatterReduce(reduce, include_self, dim)
    art = _export(model, {"base": base, "index": index, "src": src})
    (got,) = art(base=base, index=index, src=src).values()
    torch.testing.assert_close(got, model(base, index, src), rtol=1e-5, atol=1e-6)
    assert "translation:onnx:_aten_scatter_reduce" in art.workarounds_fired


class _TwoClamps(torch.nn.Module):
    """Two clamps of one tensor by tensor bounds (Gemma 4 audio's clipped linears: ``input_min`` / ``input_max``
    buffers), lowered to Max -> Min; FuseMaxMinToClip names both pairs of bounds ``<x>_min`` / ``<x>_max``."""

    def __init__(self):
        super().__init__()
        for name, value in {"lo1": -1.0, "hi1": 1.0, "lo2": -0.5, "hi2": 3.0}.items():
            self.register_buffer(name, torch.tensor(value))

    def forward(self, x):
        y = x * 2.0
        return y.clamp(self.lo1, self.hi1) + y.clamp(self.lo2, self.hi2)


def test_two_clamps_of_one_tensor_load_and_match():
    x = torch.linspace(-4, 4, 24).reshape(2, 12)
    model = _TwoClamps()
    art = _export(model, {"x": x})
    (got,) = art(x=x).values()
    torch.testing.assert_close(got, model(x), rtol=0, atol=0)
    assert "fix:onnx:_fix_ir_register_orphan_constants" in art.workarounds_fired


def test_orphan_constant_is_registered():
    import numpy as np
    import onnx_ir as ir
    import onnxruntime as ort
    from onnx import TensorProto, helper
    from onnxscript import rewriter
    from onnxscript.rewriter.rules.common import _min_max_to_clip

    from exporters.workarounds.onnx.ir_fixes import _fix_ir_register_orphan_constants

    def scalar(name, v):
        return helper.make_tensor(name, TensorProto.FLOAT, [], [v])

    nodes = [helper.make_node("Max", ["x", "lo1"], ["a1"]), helper.make_node("Min", ["a1", "hi1"], ["y1"]),
             helper.make_node("Max", ["x", "lo2"], ["a2"]), helper.make_node("Min", ["a2", "hi2"], ["y2"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y1", TensorProto.FLOAT, [4]), helper.make_tensor_value_info("y2", TensorProto.FLOAT, [4])],
        [scalar("lo1", -1.0), scalar("hi1", 1.0), scalar("lo2", -2.0), scalar("hi2", 2.0)])
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    rewriter.RewritePass([_min_max_to_clip.max_min_rule])(model)
    x = np.array([-3, -1.5, 0.5, 3], np.float32)

    def run():
        proto = ir.serde.serialize_model(model)
        return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})

    # the upstream bug: if this stops raising, onnxscript registers colliding initializers correctly now
    # and the fix can go (it then returns False here)
    with pytest.raises(Exception, match="is not a graph input, initializer, or output"):
        run()
    assert _fix_ir_register_orphan_constants(model)
    y1, y2 = run()
    np.testing.assert_array_equal(y1, np.clip(x, -1, 1))
    np.testing.assert_array_equal(y2, np.clip(x, -2, 2))
    assert not _fix_ir_register_orphan_constants(model)  # nothing left to do


class _RepeatByCount(torch.nn.Module):
    """InstructBlipVideo's ``qformer_input_ids.repeat_interleave(frames, dim=0)``: the count is another input's size."""

    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, ids, frames):
        return ids.repeat_interleave(frames.shape[1], dim=self.dim)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_repeat_interleave_by_a_symbolic_count_matches_torch_at_other_sizes(dim):
    """torchlib puts a symbolic count one axis too early in its Expand target: exported at count 1, a count of 2 kept
    the rows unrepeated and a batch of 3 refused the Expand ('invalid expand shape'). Exported at count 1, batch 2,
    the artifact is run at other counts and batches."""
    from torch.export import Dim

    from exporters import OnnxConfig, OnnxExporter

    ids = torch.arange(8).reshape(2, 4)
    frames = torch.zeros(2, 1)
    config = OnnxConfig(dynamic_shapes={"ids": {0: Dim("b", min=1, max=8)}, "frames": {0: Dim("b", min=1, max=8),
                                                                                      1: Dim("n", min=1, max=8)}})
    model = _RepeatByCount(dim)
    art = OnnxExporter().export(model, {"ids": ids, "frames": frames}, config)
    for batch, count in [(2, 2), (3, 2), (3, 3), (1, 1)]:
        ids2, frames2 = torch.arange(batch * 4).reshape(batch, 4), torch.zeros(batch, count)
        (got,) = art(ids=ids2, frames=frames2).values()
        assert torch.equal(torch.as_tensor(got), model(ids2, frames2)), (batch, count)
    assert "translation:onnx:_aten_repeat_interleave_self_int" in art.workarounds_fired
