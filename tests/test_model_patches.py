"""DynamoExporter's model patches (stage 2), in exporters/workarounds/models/: each replacement
matches the original and traces where the original does not."""

from __future__ import annotations

import pytest
import torch

from exporters.utils import DEFAULT_REGISTRY, apply_patches, resolve_path
from exporters.workarounds.models.hunyuan_vl import _patch_placeholder_count_check
from exporters.workarounds.models.moe_experts import _patch_experts_batched_mm
from exporters.workarounds.models.nllb_moe import _patch_classifier_cast
from exporters.workarounds.models.pixel_shuffle import _patch_pixel_shuffle_int


def test_nllb_moe_cast_classifier_patch_registered_for_dynamo():
    path = "transformers.models.nllb_moe.modeling_nllb_moe.NllbMoeTop2Router._cast_classifier"
    (entry,) = [e for e in DEFAULT_REGISTRY.patches("dynamo") if e.path == path]
    assert entry.factory is _patch_classifier_cast
    owner, name = resolve_path(path)
    original = owner.__dict__[name]
    with apply_patches([entry]) as fired:
        assert owner.__dict__[name] is not original
        assert getattr(owner, name)(object()) is None
    assert owner.__dict__[name] is original
    assert fired.names() == [f"patch:dynamo:{path}"]


def test_stage2_experts_eager_and_grouped_mm_trace_as_batched_mm():
    from transformers.integrations import moe

    get_interface = _patch_experts_batched_mm(moe.ExpertsInterface.get_interface)

    def own_eager_loop(self, *args):  # a decorated class's own forward: 'for expert_idx in expert_hit'
        raise AssertionError("the data-dependent loop must not be traced")

    for requested in ("eager", "grouped_mm", "batched_mm"):
        assert get_interface(moe.ALL_EXPERTS_FUNCTIONS, requested, own_eager_loop) is moe.batched_mm_experts_forward


def test_stage2_pixel_shuffle_int_matches_internvl_and_exports_dynamic():
    from transformers.models.internvl.modeling_internvl import InternVLModel

    patched = _patch_pixel_shuffle_int(InternVLModel.pixel_shuffle)
    x = torch.randn(2, 6, 4, 8)
    for scale in (0.5, 0.25):
        y = torch.randn(2, 8, 8, 16)
        torch.testing.assert_close(patched(None, y, scale), InternVLModel.pixel_shuffle(None, y, scale), rtol=0, atol=0)
    torch.testing.assert_close(patched(None, x), InternVLModel.pixel_shuffle(None, x), rtol=0, atol=0)

    class Shuffle(torch.nn.Module):
        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def forward(self, v):
            return self.fn(None, v)

    dims = {"v": {1: torch.export.Dim.AUTO, 2: torch.export.Dim.AUTO}}
    with pytest.raises(Exception, match="Invalid ranges|ValueRange"):
        torch.export.export(Shuffle(InternVLModel.pixel_shuffle), (), {"v": x}, dynamic_shapes=dims)
    torch.export.export(Shuffle(patched), (), {"v": x}, dynamic_shapes=dims)


def test_stage2_placeholder_count_check_exports_and_still_refuses_a_mismatch():
    from transformers.models.hunyuan_vl.modeling_hunyuan_vl import HunYuanVLModel

    patched = _patch_placeholder_count_check(HunYuanVLModel.get_placeholder_mask)
    config = type("Config", (), {"image_token_id": 9})()
    owner = type("Owner", (), {"config": config})()
    ids = torch.tensor([[1, 9, 9, 2], [9, 3, 4, 5]])
    embeds, features = torch.randn(2, 4, 8), torch.randn(3, 8)
    expected = HunYuanVLModel.get_placeholder_mask(owner, ids, embeds, features)
    assert torch.equal(patched(owner, ids, embeds, features), expected)
    with pytest.raises(ValueError, match="do not match"):
        patched(owner, ids, embeds, torch.randn(2, 8))

    class Scatter(torch.nn.Module):
        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def forward(self, ids, embeds, features):
            return embeds.masked_scatter(self.fn(owner, ids, embeds, features), features)

    inputs = {"ids": ids, "embeds": embeds, "features": features}
    with pytest.raises(Exception, match="data-dependent"):
        torch.export.export(Scatter(HunYuanVLModel.get_placeholder_mask), (), inputs)
    program = torch.export.export(Scatter(patched), (), inputs)
    torch.testing.assert_close(program.module()(**inputs), Scatter(HunYuanVLModel.get_placeholder_mask)(**inputs))
