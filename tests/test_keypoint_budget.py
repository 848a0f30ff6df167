"""exporters/workarounds/models/superpoint.py: SuperPoint's keypoint budget without a branch on the count, and the
matchers' "no keypoints" branch decided by a runtime assertion.

The branchless top-k must give the original's keypoints and scores in the original's order on both sides
of the budget; an exported program must refuse an input with no keypoints by name; SuperGlue must export
with the patches (not without) and match eager.
"""

from __future__ import annotations

import os

import pytest
import torch

from exporters import DynamoConfig, DynamoExporter
from exporters.utils import DEFAULT_REGISTRY
from exporters.workarounds.models.superpoint import NO_KEYPOINTS, at_least_one_keypoint, top_k_without_branch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TOP_K = "patch:dynamo:transformers.models.superpoint.modeling_superpoint.top_k_keypoints"
MATCH = "patch:dynamo:transformers.models.superglue.modeling_superglue.SuperGlueForKeypointMatching._match_image_pair"


@pytest.mark.parametrize("count,k", [(5, 8), (8, 8), (9, 8), (20, 3), (0, 4)])
def test_same_keypoints_as_the_branch(count, k):
    from transformers.models.superpoint.modeling_superpoint import top_k_keypoints

    g = torch.Generator().manual_seed(count)
    keypoints = torch.randint(0, 64, (count, 2), generator=g)
    scores = torch.rand(count, generator=g)
    expected = top_k_keypoints(keypoints, scores, k)
    got = top_k_without_branch(keypoints, scores, k)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


class _Detections(torch.nn.Module):
    """Keypoints from a threshold (a data-dependent count), then a ``[:, :, 0:1]`` slice broadcast against
    all of them, as the matchers' mask construction does."""

    def forward(self, x):
        kept = torch.nonzero(x > 0)[:, :1].float()  # (count, 1)
        keypoints = kept[None, None].expand(1, 2, -1, 2)  # (1, 2, count, 2)
        (keypoints,), _ = at_least_one_keypoint(keypoints.shape[2], (keypoints,), {})
        return keypoints + keypoints[:, :, 0:1]


def test_no_keypoints_is_refused():
    program = torch.export.export(_Detections(), (torch.randn(16),), strict=False).module()
    x = torch.tensor([1.0, -1.0, 2.0] * 5 + [0.5])
    torch.testing.assert_close(program(x), _Detections()(x))
    # refused, not answered with empty or garbage keypoints; torch names the expression, not NO_KEYPOINTS
    with pytest.raises(RuntimeError, match=r"Runtime assertion failed for expression u\d+ >= 1"):
        program(-torch.ones(16))
    assert "at least one keypoint" in NO_KEYPOINTS


@pytest.fixture(scope="module")
def superglue():
    from sweeps.runner import reference

    return reference("SuperGlueForKeypointMatching").tiny


def test_superglue_exports_and_matches_eager(superglue):
    model, inputs = superglue.model, superglue.inputs
    for name in (TOP_K, MATCH):
        with pytest.raises(Exception, match="(?i)data.dependent"):
            DynamoExporter(registry=DEFAULT_REGISTRY.without(name)).export(model, inputs, DynamoConfig())
    art = DynamoExporter().export(model, inputs, DynamoConfig())
    assert {TOP_K, MATCH} <= set(art.workarounds_fired)
    with torch.no_grad():
        expected = model(**inputs)
    got = art(**inputs)
    assert expected.matches.shape[-1] > 1  # more than one keypoint: the slice really broadcasts
    torch.testing.assert_close(got["matches"], expected.matches)
    torch.testing.assert_close(got["matching_scores"], expected.matching_scores)
