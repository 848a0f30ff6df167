"""Model patch (SuperPoint, as SuperGlue's and LightGlue's detector): the keypoint budget without a branch
on the keypoint count.

Cause. SuperPoint keeps ``torch.nonzero(scores > keypoint_threshold)`` keypoints, a data-dependent count
(an unbacked ``u0``), and with a budget (``max_keypoints >= 0``, which SuperGlue's and LightGlue's
detector configs set) ``top_k_keypoints`` (models/superpoint/modeling_superpoint.py:47) branches on it:

    if k >= len(keypoints): return keypoints, scores      # all of them, in detection order
    scores, indices = torch.topk(scores, k, dim=0)        # else the k best, by score
    return keypoints[indices], scores

so torch.export stops ("Could not guard on data-dependent expression u0 <= k").

What this changes (while tracing only, and only for a data-dependent count). Both branches become index
vectors of the same length ``m = min(k, u0)``: ``arange(m)`` (detection order) and the top-``m`` indices
by score; a tensor comparison of the count with ``k`` picks one with ``torch.where``. When all keypoints
fit, m = u0 and ``arange`` returns them as they were; otherwise m = k and the top-k order is topk's,
the same keypoints and scores in the same order as the original.

    before: if k >= n: (kp, s) else: s, i = topk(s, k); (kp[i], s)
    after:  m = min(k, n); i = where(n <= k, arange(m), topk(s, m).indices); (kp[i], s[i])

The matchers then test ``if keypoints.shape[2] == 0`` (no keypoints: SuperGlue's and LightGlue's
``_match_image_pair``, models/superglue/modeling_superglue.py:565, models/lightglue/modeling_lightglue.py:698),
again on the data-dependent count. While tracing, that method first states ``torch._check(count != 0)``:
the exported program covers images with at least one keypoint and refuses others with a runtime
assertion (torch.export keeps it in the graph; torch reports it by its expression, "Runtime assertion
failed for expression u0 >= 1", not by this message), instead of tracing the empty branch.

    before: if keypoints.shape[2] == 0: return empty matches          (guard on u0)
    after:  torch._check(keypoints.shape[2] != 0, "...")  then the same method (branch decided: False)

Remove when: SuperPoint's ``top_k_keypoints`` keeps a fixed budget with a validity mask instead of a
branch on the keypoint count (transformers' modeling_superpoint.py), and SuperGlue's and LightGlue's
``_match_image_pair`` stop branching on an empty keypoint set (modeling_superglue.py,
modeling_lightglue.py): check with
``python -m sweeps.recheck workarounds --only
patch:dynamo:transformers.models.superpoint.modeling_superpoint.top_k_keypoints``.
"""

from __future__ import annotations

import functools

import torch

from exporters.utils import data_dependent_size, register_patch


def top_k_without_branch(keypoints: torch.Tensor, scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``top_k_keypoints`` as one index selection: all keypoints in order when they fit in ``k``, else the
    ``k`` best by score (topk's order)."""
    count = keypoints.shape[0]
    kept = torch.sym_min(k, count)
    best = torch.topk(scores, kept, dim=0).indices
    in_order = torch.arange(kept, device=scores.device, dtype=best.dtype)
    all_fit = torch.full((), count, dtype=torch.long, device=scores.device) <= k
    indices = torch.where(all_fit, in_order, best)
    return keypoints[indices], scores[indices]


@register_patch("dynamo", "transformers.models.superpoint.modeling_superpoint.top_k_keypoints")
def _patch_keypoint_budget_without_branch(original):
    """SuperPoint's ``top_k_keypoints`` branches on a data-dependent keypoint count: both branches as index
    vectors of length min(k, count), one picked by a tensor comparison.

    before: if k >= len(kp): return kp, s  /  else topk(s, k)
    after:  i = where(len(kp) <= k, arange(m), topk(s, m).indices), m = min(k, len(kp))
    """

    @functools.wraps(original)
    def top_k_keypoints(keypoints, scores, k):
        if not data_dependent_size(keypoints.shape[0]):
            return original(keypoints, scores, k)
        return top_k_without_branch(keypoints, scores, k)

    return top_k_keypoints


MATCHER_PATHS: tuple[str, ...] = (
    "transformers.models.superglue.modeling_superglue.SuperGlueForKeypointMatching._match_image_pair",
    "transformers.models.lightglue.modeling_lightglue.LightGlueForKeypointMatching._match_image_pair",
)

NO_KEYPOINTS = ("this exported matcher needs at least one keypoint per image: the detector found none "
                "(exporters/workarounds/models/superpoint.py traced the matching branch only; eager returns empty matches)")


def at_least_one_keypoint(count, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Every tensor argument whose dim 2 is the padded keypoint ``count``, narrowed to that count read back
    as one fresh size known to be >= 1 (asserted at run time, with ``NO_KEYPOINTS``).

    The count arrives as ``min(k, max(u1, u2, ...))`` over the images; a check on that expression does not
    bound the symbols in it, so later ``x[:, 0:1]`` slices keep a size ``min(1, ...)`` that broadcasting
    cannot prove is 1. The fresh size has a checked range, so that slice is 1; at run time it equals the
    count (asserted), so the narrowing keeps every keypoint."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    fresh = torch.full((), count, dtype=torch.long).item()
    torch._check(fresh >= 1, lambda: NO_KEYPOINTS)  # at run time torch names the expression (u >= 1), not this
    torch._check(fresh <= count)
    torch._check(fresh == count)

    def narrow(value):
        if isinstance(value, torch.Tensor) and value.dim() >= 3 and statically_known_true(value.shape[2] == count):
            return value.narrow(2, 0, fresh)
        return value

    return tuple(narrow(a) for a in args), {k: narrow(v) for k, v in kwargs.items()}


@register_patch("dynamo", *MATCHER_PATHS)
def _patch_matcher_needs_a_keypoint(original):
    """SuperGlue/LightGlue ``_match_image_pair`` branches on a data-dependent keypoint count being 0: the
    export states it is not (a runtime assertion) and traces the matching branch.

    before: if keypoints.shape[2] == 0: return empty    (guard on u0)
    after:  torch._check(keypoints.shape[2] != 0) first
    """

    @functools.wraps(original)
    def _match_image_pair(self, keypoints, *args, **kwargs):
        count = keypoints.shape[2]
        if data_dependent_size(count):
            (keypoints, *args), kwargs = at_least_one_keypoint(count, (keypoints, *args), kwargs)
        return original(self, keypoints, *args, **kwargs)

    return _match_image_pair
