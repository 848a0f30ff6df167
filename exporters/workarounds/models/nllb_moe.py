"""Model patch (NLLB-MoE): the router's classifier cast.
"""

from __future__ import annotations



from exporters.utils import (register_patch)


@register_patch("dynamo", "transformers.models.nllb_moe.modeling_nllb_moe.NllbMoeTop2Router._cast_classifier")
def _patch_classifier_cast(_original):
    """NLLB-MoE's router casts its classifier weights to another dtype, which torch.export cannot
    trace; replace the cast with a no-op during export (the tiny models are fp32 already)."""
    return lambda self, *args, **kwargs: None
