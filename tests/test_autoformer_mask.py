"""exporters/workarounds/models/autoformer.py: Autoformer's all-keep mask, which eager drops and the export
used to apply (and fail on), is checked and dropped; the model exports and matches eager."""

from __future__ import annotations

import os

import pytest
import torch

from exporters import DynamoExporter
from exporters.utils import DEFAULT_REGISTRY
from exporters.workarounds.models.autoformer import keeps_everything

os.environ.setdefault("HF_HUB_OFFLINE", "1")
NAME = "patch:dynamo:transformers.models.autoformer.modeling_autoformer.AutoformerAttention.forward"


def test_keeps_everything():
    assert keeps_everything(torch.ones(2, 1, 4, 4, dtype=torch.bool))
    assert not keeps_everything(torch.tensor([[True, False]]))
    assert keeps_everything(torch.zeros(2, 1, 4, 4))
    assert not keeps_everything(torch.tensor([0.0, torch.finfo(torch.float32).min]))


def test_autoformer_exports_and_matches_eager():
    from sweeps.runner import reference

    ref = reference("AutoformerModel")
    with pytest.raises(Exception, match="is invalid for input of size"):
        DynamoExporter(registry=DEFAULT_REGISTRY.without(NAME)).export(ref.tiny.model, ref.tiny.inputs)
    art = DynamoExporter().export(ref.tiny.model, ref.tiny.inputs)
    assert NAME in art.workarounds_fired
    got = art(**ref.tiny.inputs)
    for name, expected in ref.expected.items():
        torch.testing.assert_close(got[name], expected)
