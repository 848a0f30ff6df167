"""sweeps.runner: the sweep's eager reference is the zoo's validated model and inputs."""

from __future__ import annotations

import pytest
import torch

from exporters.utils import flatten_outputs


@pytest.mark.parametrize("class_name", ["ClapModel", "ColPaliForRetrieval"])
def test_reference_uses_the_layout_and_placeholders_the_zoo_validated(class_name):
    """ClapModel takes its spectrogram only in a layout alternative, ColPali only once the image
    placeholders are recounted from the model: the sweep once ran the generic layout itself and
    failed at 'eager' on classes the zoo reports as built."""
    from sweeps.runner import _build_reference
    from sweeps.zoo import build_tiny

    zoo = build_tiny(class_name)
    ref = _build_reference(class_name, seed=0)
    assert sorted(ref.tiny.inputs) == sorted(zoo.inputs)
    for name, value in zoo.inputs.items():
        assert torch.equal(ref.tiny.inputs[name], value), name
    expected = flatten_outputs(zoo.outputs)
    assert sorted(ref.expected) == sorted(expected)
    for name, value in expected.items():
        assert torch.equal(ref.expected[name], value), name


def test_an_item_leaves_no_generated_graph_source_behind():
    """torch.fx keeps the source of every recompiled GraphModule forever (eval_cache + linecache):
    a sweep item drops what it generated, or each export adds to the worker's resident memory."""
    import linecache

    from torch.fx import graph_module

    from sweeps.repro import parse_item
    from sweeps.runner import run_case

    case = parse_item("dynamo-static-BertModel")
    record = {}
    run_case(case, record.__setitem__)  # warm: builds the reference
    before = set(graph_module._loader.eval_cache)
    run_case(case, record.__setitem__)
    assert record["stage"] == "done"
    assert set(graph_module._loader.eval_cache) == before
    assert not [k for k in linecache.cache if k.startswith("<eval_with_key>") and k not in before]


def test_a_timeout_inside_the_exporter_is_recorded_at_the_stage_it_interrupted(monkeypatch):
    """pytest-timeout's Failed passes through run_stage untagged (it is no Exception), so a lowering
    that ran out of time was reported at stage 'export' (ExecuTorch's XNNPACK partitioner on Glm5Next)."""
    from _pytest.outcomes import Failed

    from exporters import exporter_executorch
    from sweeps.repro import parse_item
    from sweeps.runner import run_case

    def out_of_time(*args, **kwargs):
        raise Failed("Timeout (>300.0s) from pytest-timeout.")

    monkeypatch.setattr(exporter_executorch.ExecutorchExporter, "_lower", out_of_time)
    record = {}
    with pytest.raises(Failed):
        run_case(parse_item("executorch-static-BertModel"), record.__setitem__)
    assert record["stage"] == "lower"
