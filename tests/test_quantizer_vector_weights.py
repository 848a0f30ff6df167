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


class TwiceConv(torch.nn.Module):
    """One convolution module called twice (a patch merger run per image), between quantized layers."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.merge = torch.nn.Conv2d(4, 4, 2, stride=2)

    def forward(self, a, b):
        return self.merge(self.stem(a)) + self.merge(self.stem(b))


def test_a_convolution_called_twice_is_quantized_both_times_and_runs_on_executorch():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    model, inputs = TwiceConv().eval(), {"a": torch.randn(1, 3, 8, 8, generator=g), "b": torch.randn(1, 3, 8, 8, generator=g)}
    exporter = get_exporter("executorch")
    artifact = exporter.export(model, inputs, exporter.config_class(dynamic=False, quantization=int8(calibration=[inputs])))
    meta = artifact.extra_metadata["quantization"]
    assert meta["separated_conv_weights"] == 4  # the second call of each module: weight and bias
    from exporters.parity import assert_close_quantized

    assert_close_quantized(artifact.reference(**inputs), artifact(**inputs), "executorch")
