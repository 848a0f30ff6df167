"""exporters/workarounds/models/ovis2.py: Ovis2's visual indicator write without the branch gives
eager's outputs with indicator tokens present or absent, and the model exports."""

from __future__ import annotations

import os

import pytest
import torch

from exporters import DynamoExporter
from exporters.utils import DEFAULT_REGISTRY
from exporters.workarounds.models.ovis2 import _patch_visual_indicators_without_branch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
NAME = "patch:dynamo:transformers.models.ovis2.modeling_ovis2.Ovis2Model.forward"


@pytest.fixture(scope="module")
def tiny():
    from sweeps.runner import reference

    return reference("Ovis2Model").tiny


def _with_indicator(inputs, model, present: bool):
    inputs = dict(inputs)
    ids = inputs["input_ids"].clone()
    tokens = model.visual_indicator_token_ids
    ids[ids == tokens[0]] = 1  # start from none
    if present:
        free = (ids != model.config.image_token_id).nonzero()[-1]  # a text position
        ids[free[0], free[1]] = tokens[0]
    inputs["input_ids"] = ids
    return inputs


@pytest.mark.parametrize("present", [True, False], ids=["indicator", "no-indicator"])
def test_equals_eager(tiny, present):
    from transformers.models.ovis2.modeling_ovis2 import Ovis2Model

    inputs = _with_indicator(tiny.inputs, tiny.model, present)
    patched = _patch_visual_indicators_without_branch(Ovis2Model.forward)
    with torch.no_grad():
        expected = Ovis2Model.forward(tiny.model, **inputs)
        got = patched(tiny.model, **inputs)
    torch.testing.assert_close(got.last_hidden_state, expected.last_hidden_state)
    torch.testing.assert_close(got.image_hidden_states, expected.image_hidden_states)
    assert tiny.model.visual_indicator_token_ids  # restored after the call


def test_exports_and_runs_either_case(tiny):
    with pytest.raises(Exception, match="(?i)data.dependent"):
        DynamoExporter(registry=DEFAULT_REGISTRY.without(NAME)).export(tiny.model, tiny.inputs)
    art = DynamoExporter().export(tiny.model, _with_indicator(tiny.inputs, tiny.model, True))
    assert NAME in art.workarounds_fired
    for present in (True, False):
        inputs = _with_indicator(tiny.inputs, tiny.model, present)
        with torch.no_grad():
            expected = tiny.model(**inputs).last_hidden_state
        torch.testing.assert_close(art(**inputs)["last_hidden_state"], expected)
