"""Model patch (HunYuan-VL): the placeholder count check from the mask's sum, a runtime assertion in
the graph, instead of a Python check on a boolean-mask selection.

Cause. ``HunYuanVLModel.get_placeholder_mask`` checks its image-token count in Python with a
boolean-mask selection, ``if inputs_embeds[special_image_mask].numel() != image_features.numel():
raise``: the selection has a data-dependent size, and torch.export cannot take the branch ("Could
not guard on data-dependent expression Ne(u0, 640)").

What this changes (while tracing only). The mask comes from the original method, called without the
features (so it checks nothing); the same count is then checked as the other VLMs do, with
``torch_compilable_check`` (a runtime assertion in the graph) on the mask's sum times the hidden
size.

    before: if x[mask].numel() != features.numel(): raise ValueError
    after:  torch_compilable_check(mask.sum() * hidden == features.numel())

Remove when: ``HunYuanVLModel.get_placeholder_mask`` checks the count with
``torch_compilable_check`` from the mask's sum, as the other VLMs' ``get_placeholder_mask`` do
(transformers' modeling_hunyuan_vl.py).
"""

from __future__ import annotations

from exporters.utils import register_patch


@register_patch("dynamo", "transformers.models.hunyuan_vl.modeling_hunyuan_vl.HunYuanVLModel.get_placeholder_mask")
def _patch_placeholder_count_check(original):
    """HunYuanVL checks its image-token count in Python with a boolean-mask selection,
    ``if inputs_embeds[special_image_mask].numel() != image_features.numel(): raise`` (a data-dependent
    size: "Could not guard on data-dependent expression Ne(u0, 640)"). Check the same count as the
    other VLMs do, with ``torch_compilable_check`` (a runtime assertion in the graph), from the mask's sum.

    before: if x[mask].numel() != features.numel(): raise ValueError
    after:  torch_compilable_check(mask.sum() * hidden == features.numel())
    """
    from transformers.utils.import_utils import torch_compilable_check

    def get_placeholder_mask(self, input_ids, inputs_embeds, image_features=None):
        mask = original(self, input_ids, inputs_embeds, None)  # the mask alone: no check
        if image_features is not None:
            tokens = mask[..., 0].sum()
            torch_compilable_check(
                tokens * inputs_embeds.shape[-1] == image_features.numel(),
                lambda: f"Image features and image tokens do not match: features {image_features.shape[0]}",
            )
        return mask

    return get_placeholder_mask
