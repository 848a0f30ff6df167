"""exporters/workarounds/models/sdpa_attention.py: sdpa's query-length tests that cannot change its result are
answered for a data-dependent query length, and only those: VideoMAE's pre-training model exports
(not without the patch) and matches eager for other masks; a causal call without a mask still
refuses to guess."""

from __future__ import annotations

import os

import pytest
import torch

from exporters import DynamoExporter
from exporters.utils import DEFAULT_REGISTRY
from exporters.workarounds.models.sdpa_attention import _patch_sdpa_lookup_sees_the_patch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
NAME = "patch:dynamo:transformers.integrations.sdpa_attention.sdpa_attention_forward"


class _Kept(torch.nn.Module):
    """Attention over the tokens a boolean mask keeps (a data-dependent query length)."""

    def __init__(self, causal: bool, with_mask: bool):
        super().__init__()
        self.is_causal, self.with_mask = causal, with_mask

    def forward(self, x, keep):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        h = x[keep].view(1, 1, -1, x.shape[-1])  # (batch, heads, kept, dim)
        torch._check(h.shape[2] >= 1)  # torch's SDPA kernel itself guards on an empty query; 'q_length > 1' stays open
        mask = torch.ones(1, 1, h.shape[2], h.shape[2], dtype=torch.bool) if self.with_mask else None
        attend = ALL_ATTENTION_FUNCTIONS.get_interface("sdpa", None)
        return attend(self, h, h, h, mask, scaling=0.5)[0]


@pytest.mark.parametrize("causal,with_mask", [(False, False), (True, True)])
def test_answered_where_it_cannot_matter(causal, with_mask):
    x, keep = torch.randn(1, 6, 4), torch.tensor([[True, False, True, True, False, True]])
    model = _Kept(causal, with_mask)
    with pytest.raises(Exception, match="(?i)data.dependent"):
        DynamoExporter(registry=DEFAULT_REGISTRY.without(NAME)).export(model, {"x": x, "keep": keep})
    art = DynamoExporter().export(model, {"x": x, "keep": keep})
    assert NAME in art.workarounds_fired
    for probe in (keep, torch.tensor([[False, True, True, False, False, False]])):
        (got,) = art(x=x, keep=probe).values()
        torch.testing.assert_close(got, model(x, probe))


def test_causal_without_mask_still_refuses():
    x, keep = torch.randn(1, 6, 4), torch.tensor([[True, False, True, True, False, True]])
    with pytest.raises(Exception, match="(?i)data.dependent"):
        DynamoExporter().export(_Kept(causal=True, with_mask=False), {"x": x, "keep": keep})


def test_other_lookups_unchanged():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    get_interface = _patch_sdpa_lookup_sees_the_patch(AttentionInterface.get_interface)
    eager = object()
    assert get_interface(ALL_ATTENTION_FUNCTIONS, "eager", eager) is eager
    assert get_interface(ALL_ATTENTION_FUNCTIONS, "sdpa", eager) is sdpa_attention_forward  # nothing installed
    assert not get_interface.acted()


def test_videomae_pretraining_exports():
    from sweeps.runner import reference

    tiny = reference("VideoMAEForPreTraining").tiny
    with pytest.raises(Exception, match="(?i)data.dependent"):
        DynamoExporter(registry=DEFAULT_REGISTRY.without(NAME)).export(tiny.model, tiny.inputs)
    art = DynamoExporter().export(tiny.model, tiny.inputs)
    assert NAME in art.workarounds_fired
    inputs = dict(tiny.inputs, bool_masked_pos=tiny.inputs["bool_masked_pos"].flip(-1))  # other patches, same count
    with torch.no_grad():
        expected = tiny.model(**inputs).logits
    torch.testing.assert_close(art(**inputs)["logits"], expected)
