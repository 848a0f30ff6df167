"""exporters/workarounds/models/hiera.py: Hiera's MAE path keeps the visible mask units with a static
count, the same tokens in the same order as boolean indexing, and the model exports with a dynamic
batch and image size (it does not without the patch)."""

from __future__ import annotations

import os

import pytest
import torch

from exporters import DynamoConfig, DynamoExporter
from exporters.utils import DEFAULT_REGISTRY
from exporters.workarounds.models.hiera import _patch_hiera_kept_units_static, kept_tokens

os.environ.setdefault("HF_HUB_OFFLINE", "1")
NAME = "patch:dynamo:transformers.models.hiera.modeling_hiera.HieraModel.forward"


@pytest.mark.parametrize("seed", range(5))
def test_kept_tokens_equals_boolean_indexing(seed):
    g = torch.Generator().manual_seed(seed)
    batch, windows, area, hidden, keep = 3, 8, 4, 5, 3
    noise = torch.rand(batch, windows, generator=g)
    mask = torch.zeros(batch, windows)
    mask[:, :keep] = 1
    mask = mask.gather(1, noise.argsort(1).argsort(1)).bool()  # what random_masking does
    states = torch.randn(batch, windows * area, hidden, generator=g)
    positions = mask.unsqueeze(-1).tile(1, area, hidden)
    expected = states[positions].view(batch, -1, hidden)
    assert torch.equal(kept_tokens(states, mask, area, keep), expected)


@pytest.fixture(scope="module")
def tiny():
    from sweeps.runner import reference

    return reference("HieraForPreTraining").tiny


def test_patched_forward_equals_eager(tiny):
    from transformers.models.hiera.modeling_hiera import HieraModel

    model = tiny.model.hiera
    inputs = {"pixel_values": tiny.inputs["pixel_values"], "noise": tiny.inputs["noise"]}
    patched = _patch_hiera_kept_units_static(HieraModel.forward)
    with torch.no_grad():
        expected = HieraModel.forward(model, **inputs)
        got = patched(model, **inputs)
    assert torch.equal(got.bool_masked_pos, expected.bool_masked_pos)
    torch.testing.assert_close(got.last_hidden_state, expected.last_hidden_state, rtol=0, atol=0)


def test_exports_with_dynamic_sizes(tiny):
    # without the patch, under torch's 0/1 specialization, the boolean indexing's count meets a guard.
    # (Under accept_size_one, the default, this tiny model exports without the patch too: whether the
    # patch is still needed is for sweeps.recheck to say per backend.)
    with pytest.raises(Exception, match="(?i)data.dependent"):
        DynamoExporter(registry=DEFAULT_REGISTRY.without(NAME)).export(
            tiny.model, tiny.inputs, DynamoConfig(dynamic=True, accept_size_one=False))
    art = DynamoExporter().export(tiny.model, tiny.inputs, DynamoConfig(dynamic=True))
    assert NAME in art.workarounds_fired
    noise = torch.rand(3, tiny.inputs["noise"].shape[1], generator=torch.Generator().manual_seed(1))
    inputs = {"pixel_values": tiny.inputs["pixel_values"][torch.tensor([0, 1, 0])], "noise": noise}
    with torch.no_grad():
        expected = tiny.model(**inputs).logits
    torch.testing.assert_close(art(**inputs)["logits"], expected)
