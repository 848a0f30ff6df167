"""The quantized rule's units: the grid an output lies on (exporters/quantization/grid.py) and the rounding spread
measured in two parts (exporters/quantization/rounding.py)."""

from __future__ import annotations

import pytest
import torch

from exporters.quantization import int8


def test_an_output_leaving_a_quantize_is_measured_in_that_quantizes_steps():
    """exporters/quantization/grid.py: a Linear's output is quantized (XNNPACK annotates it); for a small output far
    from zero the observer's range holds zero and its scale has a floor (2**-12), so the output's grid is coarser
    than its range. The step is that scale: one rounding flip there is one step, not hundreds."""
    from exporters.parity import compare_quantized, quantization_step, steps_off
    from exporters.quantization import quantize
    from exporters.quantization.grid import reference_and_scales

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 8, generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    with torch.no_grad():  # logits about -6e-4, within 1e-5 of each other: SEW's classifier at its tiny size
        model[2].weight.mul_(1e-4)
        model[2].bias.fill_(-6e-4)
    quantized = quantize(model, {"input": x}, int8(calibration=[{"input": x}]), "executorch").module
    ref = quantized(input=x)
    (scale,) = reference_and_scales(quantized, {"input": x})[1].values()
    assert scale == pytest.approx(2 ** -12)  # XNNPACK's observers' floor
    assert quantization_step(ref, scale) == scale > 100 * quantization_step(ref)
    flipped = ref.clone()
    flipped[0, 0] += scale  # the backend rounds one logit the other way at the output quantize
    assert steps_off(ref, flipped, scale) == pytest.approx(1.0)
    assert compare_quantized({"y": ref}, {"y": flipped}, "executorch", scales={"y": scale}) == []
    assert compare_quantized({"y": ref}, {"y": flipped}, "executorch")  # in range steps it is far past the bound
    (problem,) = compare_quantized({"y": ref}, {"y": ref + 9 * scale}, "executorch", scales={"y": scale})
    assert "9.0 quantization steps" in problem

    class IntoBuffer(torch.nn.Module):  # a recurrent state written into a zeroed buffer (copy_), as KimiLinear's cache
        def __init__(self):
            super().__init__()
            self.linear = model

        def forward(self, input):
            state = torch.zeros(1, 4)
            state.copy_(self.linear(input).to(torch.float32))
            return state

    quantized = quantize(IntoBuffer().eval(), {"input": x}, int8(calibration=[{"input": x}]), "executorch").module
    assert reference_and_scales(quantized, {"input": x})[1] == {"output": pytest.approx(2 ** -12)}

    unquantized = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Softmax(-1)).eval()  # softmax leaves none
    quantized = quantize(unquantized, {"input": x}, int8(calibration=[{"input": x}]), "executorch").module
    assert reference_and_scales(quantized, {"input": x})[1] == {}


def test_the_spread_measured_in_two_parts_is_the_spread_of_all_seeds():
    """The sweep measures rounding.FIRST_SEEDS and the other seeds only where an output is past the first ones'
    bound: the maximum over the two parts is the spread of all of SEEDS, and never below the first part's."""
    from exporters.quantization import quantize
    from exporters.quantization.rounding import FIRST_SEEDS, SEEDS, rounding_spread

    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 8, generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    quantized = quantize(model, {"input": x}, int8(calibration=[{"input": x}]), "dynamo").module
    first = rounding_spread(quantized, {"input": x}, seeds=FIRST_SEEDS)
    rest = rounding_spread(quantized, {"input": x}, seeds=SEEDS[len(FIRST_SEEDS):])
    whole = rounding_spread(quantized, {"input": x})
    assert len(SEEDS) == 12 and SEEDS[:len(FIRST_SEEDS)] == FIRST_SEEDS
    assert whole == {k: max(first[k], rest[k]) for k in whole}
    assert all(whole[k] >= first[k] for k in first)
