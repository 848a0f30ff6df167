"""Selections in a quantized model (exporters/quantization/selections.py): exposed as outputs, and the
reference run with given choices."""

from __future__ import annotations

import pytest
import torch

from exporters import get_exporter
from exporters.parity import compare_quantized
from exporters.quantization import int8
from exporters.quantization.selections import choices


class Router(torch.nn.Module):
    """A linear router choosing two of four experts per token (top-k), plus an argmax, the values of the
    top-k scaling the output as an MoE's gate does."""

    def __init__(self):
        super().__init__()
        self.proj, self.router, self.out = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4), torch.nn.Linear(8, 8)
        self.experts = torch.nn.Parameter(torch.randn(4, 8))

    def forward(self, x):
        h = self.proj(x)
        scores = self.router(h)
        weights, chosen = scores.topk(2, dim=-1)
        best = scores.argmax(-1)
        mixed = (self.experts[chosen] * weights.softmax(-1).unsqueeze(-1)).sum(-2)
        return {"out": self.out(h + mixed), "best": best}


@pytest.fixture(scope="module")
def router():
    torch.manual_seed(0)
    return Router().eval(), {"x": torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))}


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_selections_are_exposed_and_the_reference_takes_the_artifacts_choices(router, backend):
    model, inputs = router
    exporter = get_exporter(backend)
    artifact = exporter.export(model, inputs, exporter.config_class(
        dynamic=False, quantization=int8(calibration=[inputs], expose_selections=True)))
    taps = artifact.extra_metadata["quantization"]["selection_outputs"]
    assert taps == ["selection.0.input", "selection.0.indices", "selection.1.input", "selection.1.indices"]
    actual = {k: torch.as_tensor(v) for k, v in artifact(**inputs).items()}
    assert set(taps) <= set(actual) and {"out", "best"} <= set(actual)
    own = artifact.reference(**inputs)
    chosen = choices(actual, taps)
    assert [tuple(c.shape) for c in chosen] == [(2, 5, 2), (2, 5)]
    # given its own choices the reference is itself; given the artifact's, it matches the artifact
    given_own = artifact.reference_given(choices(own, taps), **inputs)
    assert all(torch.equal(given_own[k], own[k]) for k in own)
    assert compare_quantized(artifact.reference_given(chosen, **inputs), actual, backend) == []
    # other choices move the outputs past the bound: the check does not accept any choice
    other = [(c + 1) % 4 for c in chosen]
    moved = artifact.reference_given(other, **inputs)
    assert torch.equal(moved["best"], other[1]) and torch.equal(moved["selection.0.indices"], other[0])
    assert compare_quantized(moved, actual, backend) != []


def test_without_the_option_the_artifact_has_only_the_models_outputs(router):
    model, inputs = router
    exporter = get_exporter("dynamo")
    artifact = exporter.export(model, inputs, exporter.config_class(quantization=int8(calibration=[inputs])))
    assert artifact.extra_metadata["quantization"]["selection_outputs"] == []
    assert set(artifact(**inputs)) == {"out", "best"}


def test_given_indices_of_the_wrong_shape_are_refused_by_selection(router):
    model, inputs = router
    exporter = get_exporter("dynamo")
    artifact = exporter.export(model, inputs, exporter.config_class(
        quantization=int8(calibration=[inputs], expose_selections=True)))
    with pytest.raises(ValueError, match=r"selection 0: given indices of shape \(2, 5, 3\)"):
        artifact.reference_given([torch.zeros(2, 5, 3, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long)],
                                 **inputs)


def test_the_rounding_spread_keeps_the_references_own_choices(router):
    model, inputs = router
    exporter = get_exporter("dynamo")
    artifact = exporter.export(model, inputs, exporter.config_class(
        quantization=int8(calibration=[inputs], expose_selections=True)))
    spread = artifact.reference_spread(**inputs)
    # the selection inputs have a spread of their own; the chosen indices are not floating outputs
    assert "selection.0.input" in spread and "selection.0.indices" not in spread
    assert all(v >= 0 for v in spread.values())
