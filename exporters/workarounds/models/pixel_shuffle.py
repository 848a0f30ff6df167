"""Model patch (InternVL-style pixel shuffle): the shuffle's sizes in integer arithmetic.

Cause. ``pixel_shuffle`` of InternVL and QianfanOCR checks ``height % scale_factor != 0`` with a
float ``scale_factor`` (0.5) and sizes its views with ``int(height * scale_factor)``. With a dynamic
height, torch.export computes the value range of a float modulus of a symbol and fails
(``ValueRangeError: Invalid ranges [0.5:-0.5]``).

What this changes (while tracing only). For ``scale_factor = 1/n`` the check holds for every integer
size (it never raises) and ``int(h * scale) == h // n``: the same views are traced with that integer
arithmetic. Other factors run the original.

    before: if h % 0.5 != 0: raise; view(b, w, int(h * 0.5), int(c / 0.5))
    after:  view(b, w, h // 2, c * 2)

Remove when: InternVL's and QianfanOCR's ``pixel_shuffle`` size their views with integer arithmetic
(``h // n``) instead of a float ``scale_factor`` (transformers' modeling_internvl.py,
modeling_qianfan_ocr.py).
"""

from __future__ import annotations

from exporters.utils import register_patch


@register_patch("dynamo", "transformers.models.internvl.modeling_internvl.InternVLModel.pixel_shuffle",
                "transformers.models.qianfan_ocr.modeling_qianfan_ocr.QianfanOCRModel.pixel_shuffle")
def _patch_pixel_shuffle_int(original):
    """InternVL's pixel shuffle checks ``height % scale_factor != 0`` with a float ``scale_factor`` (0.5)
    and sizes its views with ``int(height * scale_factor)``. With a dynamic height, torch.export computes
    the value range of a float modulus of a symbol and fails (``ValueRangeError: Invalid ranges
    [0.5:-0.5]``). For ``scale_factor = 1/n`` the check holds for every integer size (it never raises)
    and ``int(h * scale) == h // n``; trace that integer arithmetic instead. Other factors run the original.

    before: if h % 0.5 != 0: raise; view(b, w, int(h * 0.5), int(c / 0.5))
    after:  view(b, w, h // 2, c * 2)
    """

    def pixel_shuffle(self, vision_features, scale_factor=0.5):
        n = round(1 / scale_factor)
        if abs(n * scale_factor - 1) > 1e-12:
            return original(self, vision_features, scale_factor)
        batch_size, width, height, channels = vision_features.size()
        vision_features = vision_features.view(batch_size, width, height // n, channels * n)
        vision_features = vision_features.permute(0, 2, 1, 3).contiguous()
        vision_features = vision_features.view(batch_size, height // n, width // n, channels * n * n)
        return vision_features.permute(0, 2, 1, 3).contiguous()

    return pixel_shuffle
