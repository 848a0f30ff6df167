"""Model patch (UDOP): image and text embeddings combined with tensor indexing and a fixed number of
visual patches, instead of a Python loop over the OCR points and per-image boolean compaction.

Cause. ``combine_image_text_embeddings`` (models/udop/modeling_udop.py:171-252) marks the patches
under each OCR point with ``rows, cols = zip(*ind); patch_inds[rows, cols] = False``, iterating a
tensor in Python (it reads tensor data while tracing: "The tensor has a non-zero number of elements,
but its data is not allocated yet"), then keeps ``image_embeddings[i][patch_inds[i]]`` per image (a
count that depends on the bbox values) and pads each to ``max_len`` with ``pad_sequence``.

What this changes (while tracing only). The same result, with static shapes: the OCR patches are
cleared with ``scatter``; each kept patch's rank among its image's kept patches (a cumulative sum)
is its slot, and slot ``r < max_len`` gathers the image's ``r``-th kept patch (its embedding and its
visual box; attention mask 1), or zeros when the image keeps fewer: what ``pad_sequence`` gives,
truncation included. The zeroing of OCR embeddings for empty/full-page boxes is ``torch.where``.

    before: rows, cols = zip(*ind); keep[rows, cols] = False; [pad(x[i][keep[i]], max_len) for i]
    after:  keep = ones.scatter(1, ocr_points, False); rank = cumsum(keep) - 1
            order[r] = argmax(where(keep, rank, max_len) == r); out = where(r < count, x.gather(order), 0)

Remove when: ``combine_image_text_embeddings`` clears the OCR patches with tensor indexing and keeps
a fixed number of visual patches per image, without the Python loop over the OCR points and the
per-image boolean selection (transformers' modeling_udop.py).
"""

from __future__ import annotations

import torch

from exporters.utils import register_patch
from exporters.workarounds.models._compaction import gather_rows, kept_in_order


def combined(image_embeddings, inputs_embeds, bbox, visual_bbox, attention_mask=None, num_patches=14, max_len=0,
             image_size=224, patch_size=16):
    """``combine_image_text_embeddings`` with static shapes (see the module docstring)."""
    from transformers.models.udop.modeling_udop import get_visual_bbox

    sequence_length = num_patches
    ocr_points_x = torch.clip(
        torch.floor((bbox[:, :, 0] + bbox[:, :, 2]) / 2.0 * sequence_length).long(), 0, sequence_length - 1)
    ocr_points_y = torch.clip(
        torch.floor((bbox[:, :, 1] + bbox[:, :, 3]) / 2.0 * sequence_length).long(), 0, sequence_length - 1
    ) * sequence_length
    ocr_points = ocr_points_x + ocr_points_y
    dtype = torch.float32 if bbox.device.type == "mps" else torch.float64
    bbox = bbox.to(dtype)
    target_seg = (bbox.mean(-1) == 0.0) | (bbox.mean(-1) == 1.0)
    repeated_vision_embeds = torch.gather(
        image_embeddings, 1, ocr_points.unsqueeze(-1).repeat(1, 1, image_embeddings.size(-1)))
    repeated_vision_embeds = torch.where(target_seg.unsqueeze(-1), 0.0, repeated_vision_embeds)
    inputs_embeds += repeated_vision_embeds  # in place, as eager

    keep = torch.ones(image_embeddings.shape[:2], dtype=torch.bool, device=image_embeddings.device)
    keep = keep.scatter(1, ocr_points, False)
    if visual_bbox is None:
        visual_bbox = get_visual_bbox(image_size=image_size, patch_size=patch_size)
        visual_bbox = visual_bbox.unsqueeze(0).repeat(image_embeddings.size(0), 1, 1).to(image_embeddings.device)
    max_len = image_embeddings.size(1) if max_len == 0 else max_len - inputs_embeds.size(1)

    order, valid = kept_in_order(keep, max_len)
    inputs_vision_patches = gather_rows(image_embeddings, order, valid)
    visual_bbox = gather_rows(visual_bbox, order, valid)
    inputs_embeds = torch.cat([inputs_embeds, inputs_vision_patches], 1)
    bbox = torch.cat([bbox, visual_bbox], 1)
    if attention_mask is not None:
        attention_mask = torch.cat([attention_mask, valid.to(attention_mask.dtype)], 1)
    return inputs_embeds, bbox, attention_mask


@register_patch("dynamo", "transformers.models.udop.modeling_udop.combine_image_text_embeddings")
def _patch_udop_patches_static(original):
    return combined
