"""exporters/workarounds/models/slanet.py: SLANet's and SLANeXt's greedy structure decode as a fixed number of
steps, cut at the step count eager reaches.

The step count must be the eager loop's for every pattern of end tokens; the two heads must export with
the patch (not without) and give eager's output, its length included; a call that asks for the per-step
lists must reach the original forward.
"""

from __future__ import annotations

import os

import pytest
import torch

from exporters import DynamoConfig, DynamoExporter
from exporters.utils import DEFAULT_REGISTRY
from exporters.workarounds.models.slanet import _patch_structure_decode_fixed_steps, steps_eager_runs

os.environ.setdefault("HF_HUB_OFFLINE", "1")
END = 6


def _eager_steps(ids: torch.Tensor) -> int:
    """The original loop's exit test, step by step."""
    for t in range(ids.shape[1]):
        if ids[:, : t + 1].eq(END).any(-1).all():
            return t + 1
    return ids.shape[1]


@pytest.mark.parametrize("rows", [
    [[END, 1, 2, 3]],                       # ends at the first step
    [[1, 2, 3, 4], [1, END, 2, 3]],          # one sample never ends: all steps
    [[1, END, 0, 0], [2, 3, 4, END]],        # the later sample decides
    [[1, END, 0, END], [END, 3, END, 0]],    # end tokens again after the stop
    [[0, 0, 0, 0, 0, 0, 0, END]],           # at the last step
])
def test_step_count_is_the_loops(rows):
    ids = torch.tensor(rows)
    assert int(steps_eager_runs(ids, END)) == _eager_steps(ids)


@pytest.fixture(scope="module", params=["SLANetForTableRecognition", "SLANeXtForTableRecognition"])
def table_model(request):
    from sweeps.runner import reference

    return request.param, reference(request.param).tiny


def test_head_exports_and_matches_eager(table_model):
    name, tiny = table_model
    model, inputs = tiny.model, tiny.inputs
    module = "slanet.modeling_slanet.SLANetSLAHead" if name.startswith("SLANet") else "slanext.modeling_slanext.SLANeXtSLAHead"
    patch = f"patch:dynamo:transformers.models.{module}.forward"
    with pytest.raises(Exception, match="(?i)data.dependent"):
        DynamoExporter(registry=DEFAULT_REGISTRY.without(patch)).export(model, inputs, DynamoConfig())
    art = DynamoExporter().export(model, inputs, DynamoConfig())
    assert patch in art.workarounds_fired
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
    got = art(**inputs)["last_hidden_state"]
    assert got.shape == expected.shape  # the cut: SLANeXt's tiny model stops after 1 of 17 steps, SLANet's runs all
    torch.testing.assert_close(got, expected)


def test_step_lists_go_to_the_original(table_model):
    _, tiny = table_model
    head = tiny.model.head
    calls = []

    def original(self, hidden_states, targets=None, **kwargs):
        calls.append(kwargs)
        return "original"

    patched = _patch_structure_decode_fixed_steps(original)
    features = torch.randn(2, 4, head.config.post_conv_out_channels)
    assert patched(head, features, output_hidden_states=True) == "original"
    assert patched(head, features, output_attentions=True) == "original"
    assert len(calls) == 2
    assert patched(head, features).last_hidden_state.shape[0] == 2


def test_scanned_decode_is_the_unrolled_one(table_model):
    from exporters.workarounds.models.slanet import decode_fixed_steps, decode_scan

    _, tiny = table_model
    head = tiny.model.head
    features = torch.randn(2, 4, head.config.post_conv_out_channels)
    with torch.no_grad():
        torch.testing.assert_close(decode_scan(head, features), decode_fixed_steps(head, features), rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["onnx", "executorch"])
def test_static_exports_the_decode_as_a_scan(table_model, backend):
    """ONNX writes an ONNX Scan. Unrolled, SLANeXt's static ExecuTorch export at its default
    max_text_length (500) grew past 21 GB; with the scan the program holds one step (issue 35)."""
    pytest.importorskip({"onnx": "onnxruntime", "executorch": "executorch"}[backend])
    from exporters import get_exporter

    name, tiny = table_model
    exporter = get_exporter(backend)
    art = exporter.export(tiny.model, tiny.inputs, exporter.config_class())
    module = "slanet.modeling_slanet.SLANetSLAHead" if name.startswith("SLANet") else "slanext.modeling_slanext.SLANeXtSLAHead"
    assert f"patch:{backend}:transformers.models.{module}.forward" in art.workarounds_fired
    if backend == "onnx":
        assert "Scan" in {node.op_type for node in art.model_proto.graph.node}
    from exporters.parity import assert_close

    with torch.no_grad():
        expected = tiny.model(**tiny.inputs).last_hidden_state
    # the sweep's rule for the backend (exporters/parity.py TOLERANCES), not torch's float32 default: since the zoo
    # builds SLANeXt's vision tower at 0.02 instead of 1e-10 (sweeps/zoo/weights.py), its features are of order 1
    # and XNNPACK's fp32 kernels differ from eager by 1.9e-5 here, inside executorch's 1e-4
    assert_close({"last_hidden_state": expected}, {"last_hidden_state": torch.as_tensor(art(**tiny.inputs)["last_hidden_state"])},
                 backend)


def test_the_trace_pt2e_prepares_keeps_the_unrolled_steps(table_model):
    """The ONNX and ExecuTorch scan patches step aside inside exporters.quantization's stage-0 trace: a
    program holding the scan fails after convert_pt2e, at the second export ("Attempting to use
    FunctionalTensor on its own"), on both backends."""
    from exporters.quantization.stage0 import tracing_for_quantization
    from exporters.workarounds.models.slanet import (
        _patch_structure_decode_scanned,
        _patch_structure_decode_scanned_executorch,
    )

    head = table_model[1].model.head
    features = torch.randn(2, 4, head.config.post_conv_out_channels)
    for factory in (_patch_structure_decode_scanned, _patch_structure_decode_scanned_executorch):
        patched = factory(lambda self, hidden_states, targets=None, **kwargs: "original")
        with tracing_for_quantization():
            assert patched(head, features) == "original"
        assert not patched.acted()
        with torch.no_grad():
            assert patched(head, features) != "original"
        assert patched.acted()
