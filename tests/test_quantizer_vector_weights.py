"""A linear whose weight is a vector (D-FINE's distribution integral) stays float instead of failing
calibration in a per-channel observer (exporters/quantization/xnnpack.py)."""

from __future__ import annotations

import torch

from exporters import get_exporter
from exporters.quantization import int8


class Integral(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 16)
        self.register_buffer("project", torch.linspace(0, 1, 4))

    def forward(self, x):
        probs = self.proj(x).reshape(2, 3, 4, 4).softmax(-1)
        return torch.nn.functional.linear(probs, self.project)  # a 1-D weight: output [2, 3, 4]


def test_a_vector_weight_stays_float_and_the_rest_is_quantized():
    torch.manual_seed(0)
    model, x = Integral().eval(), torch.randn(2, 3, 8)
    exporter = get_exporter("dynamo")
    artifact = exporter.export(model, {"x": x}, exporter.config_class(quantization=int8(calibration=[{"x": x}])))
    meta = artifact.extra_metadata["quantization"]
    assert len(meta["vector_weights"]) == 1 and meta["quantize_ops"] > 0  # the 2-D linear is still quantized
    assert torch.equal(artifact(x=x)["output"], artifact.reference(x=x)["output"])
    assert (artifact(x=x)["output"] - model(x)).abs().max() < 0.05
