"""exporters/workarounds/models/udop.py: UDOP's image/text combination with static shapes gives eager's
three outputs exactly (empty and full-page boxes, given or default visual boxes, padding and
truncation), and UdopModel exports (it does not without the patch)."""

from __future__ import annotations

import os

import pytest
import torch

from exporters import DynamoExporter
from exporters.utils import DEFAULT_REGISTRY
from exporters.workarounds.models.udop import combined

os.environ.setdefault("HF_HUB_OFFLINE", "1")
NAME = "patch:dynamo:transformers.models.udop.modeling_udop.combine_image_text_embeddings"


@pytest.mark.parametrize("seed", range(8))
def test_equals_eager(seed):
    from transformers.models.udop.modeling_udop import combine_image_text_embeddings

    g = torch.Generator().manual_seed(seed)
    image, text = torch.randn(2, 16, 3, generator=g), torch.randn(2, 5, 3, generator=g)
    bbox = torch.rand(2, 5, 4, generator=g)
    bbox[0, 1], bbox[1, 2] = 0.0, 1.0  # empty and full-page boxes: their OCR embedding is zeroed
    mask = torch.ones(2, 5, dtype=torch.long)
    visual = None if seed % 2 else torch.rand(2, 16, 4, generator=g)
    max_len = (0, 5 + 10, 5 + 20)[seed % 3]  # default, truncated, padded
    expected = combine_image_text_embeddings(image, text.clone(), bbox, visual, mask, 4, max_len, 64, 16)
    got = combined(image, text.clone(), bbox, visual, mask, 4, max_len, 64, 16)
    for want, have in zip(expected, got):
        assert have.shape == want.shape and have.dtype == want.dtype and torch.equal(have, want)


def test_exports():
    from sweeps.runner import reference

    tiny = reference("UdopModel").tiny
    with pytest.raises(Exception, match="data is not allocated"):
        DynamoExporter(registry=DEFAULT_REGISTRY.without(NAME)).export(tiny.model, tiny.inputs)
    art = DynamoExporter().export(tiny.model, tiny.inputs)
    assert NAME in art.workarounds_fired
    inputs = dict(tiny.inputs, bbox=tiny.inputs["bbox"].flip(1))  # other OCR points, other kept patches
    with torch.no_grad():
        expected = tiny.model(**inputs).last_hidden_state
    torch.testing.assert_close(art(**inputs)["last_hidden_state"], expected)
