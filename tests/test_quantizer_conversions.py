"""A ``.to()`` that changes nothing is taken out before XNNPACK's quantizer annotates the graph, so the op after
it shares its producer's grid instead of requantizing (exporters/quantization/xnnpack.py,
``fold_same_type_conversions``: ONNX Runtime merges such a requantization into one rounding, which Mamba2's scan
carried to 43 steps)."""

from __future__ import annotations

import torch

from exporters.quantization import int8, quantize
from exporters.quantization.xnnpack import fold_same_type_conversions


class CastAfterSlice(torch.nn.Module):
    """Mamba2's pattern: a slice of a quantized output, cast to the type it has, into a quantized mul."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 16)
        self.out = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.proj(x)
        gate = h[..., :8].to(torch.float32)
        return self.out(gate * h[..., 8:])


def _params(gm, node):
    return tuple(getattr(gm, a.target).flatten()[0].item() if isinstance(a, torch.fx.Node) else a for a in node.args[1:3])


def requantizations(gm: torch.fx.GraphModule) -> list[str]:
    """Quantize nodes whose input is a dequantize (directly or through ops that move values only) of another grid."""
    moves = {torch.ops.aten.slice.Tensor, torch.ops.aten.to.dtype, torch.ops.aten.reshape.default, torch.ops.aten.view.default}
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or "quantize_per_tensor" not in str(node.target) or "dequantize" in str(node.target):
            continue
        source = node.args[0]
        while isinstance(source, torch.fx.Node) and source.target in moves:
            source = source.args[0]
        if isinstance(source, torch.fx.Node) and "dequantize_per_tensor" in str(source.target) \
                and _params(gm, source) != _params(gm, node):
            found.append(node.name)
    return found


def test_a_same_type_conversion_does_not_requantize():
    torch.manual_seed(0)
    model, x = CastAfterSlice().eval(), torch.randn(2, 5, 8)
    quantized = quantize(model, {"x": x}, int8(calibration=[{"x": x}]), "onnx")
    assert requantizations(quantized.module.converted) == []
    assert quantized.metadata["folded_conversions"] == 1
    # the reference still computes the model, on one grid
    (out,) = [v for v in _leaves(quantized.module(x=x))]
    assert (out - model(x)).abs().max() < 0.1


def _leaves(result):
    return list(result.values()) if isinstance(result, dict) else list(result) if isinstance(result, (tuple, list)) else [result]


def test_the_fold_keeps_real_conversions():
    class Casts(torch.nn.Module):
        def forward(self, x):
            return x.to(torch.float32) + x.to(torch.float64).to(torch.float32) + x.to(torch.float32, copy=True)

    gm = torch.export.export(Casts(), (torch.randn(3),), strict=False).module()
    before = [n.name for n in gm.graph.nodes if n.target == torch.ops.aten.to.dtype]
    folded = fold_same_type_conversions(gm)
    after = [n.name for n in gm.graph.nodes if n.target == torch.ops.aten.to.dtype]
    assert folded == ["to"]  # only the plain same-type cast (export made one node of the two x.to(float32))
    assert len(after) == len(before) - 1  # the float64 round trip and the copy=True cast stay
    x = torch.randn(3)
    assert torch.equal(gm(x), Casts()(x))
