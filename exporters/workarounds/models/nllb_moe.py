"""Model patch (NLLB-MoE): the router's classifier cast is a no-op while tracing.

Cause. ``NllbMoeTop2Router._cast_classifier`` (called from the router's forward) casts the
classifier to the router's dtype, ``self.classifier = self.classifier.to(self.dtype)``, which
torch.export cannot trace: it would swap the classifier's parameters in place.

What this changes (while tracing only). The cast is replaced with a no-op (the tiny models are fp32
already: the classifier keeps the dtype it has).

    before: router.forward -> self.classifier = self.classifier.to(self.dtype)
    after:  router.forward -> (nothing)

Remove when: ``NllbMoeTop2Router`` stops casting its classifier in forward (transformers'
modeling_nllb_moe.py).
"""

from __future__ import annotations

from exporters.utils import register_patch


@register_patch("dynamo", "transformers.models.nllb_moe.modeling_nllb_moe.NllbMoeTop2Router._cast_classifier")
def _patch_classifier_cast(_original):
    """NLLB-MoE's router casts its classifier weights to another dtype, which torch.export cannot
    trace; replace the cast with a no-op during export (the tiny models are fp32 already)."""
    return lambda self, *args, **kwargs: None
