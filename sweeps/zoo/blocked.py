"""Model types that need a package we cannot install in this environment.

Data only: model type -> reason.  ``catalog()`` copies the reason into
``CatalogEntry.blocked_by``; ``build_tiny`` raises ``BlockedByPackage`` for them, and
also detects other cases at build time from transformers' ``requires_backends``
ImportError.  Keep each reason one line naming the package and why it is missing.
"""

from __future__ import annotations

_TIMM = "needs timm (timm needs torchvision, which has no build for the pinned torch 2.13.0 here)"

BLOCKED_BY_MODEL_TYPE: dict[str, str] = {
    "timm_backbone": _TIMM,
    "timm_wrapper": _TIMM,
    "dinat": "needs natten (neighborhood-attention CUDA/C++ extension; no wheel for torch 2.13.0 CPU)",
    "layoutlmv2": "needs detectron2 for the visual backbone (no wheel for torch 2.13.0; built from source only)",
    "layoutxlm": "needs detectron2 for the visual backbone (no wheel for torch 2.13.0; built from source only)",
    "higgs_audio_v2_tokenizer": "needs torchaudio at import (no torchaudio build installed for the pinned torch 2.13.0 CPU)",
    # vision towers built as TimmWrapperModel / TimmBackbone (seen at build time, recorded here so
    # catalog() knows without building)
    "edgetam": _TIMM + "; its vision tower is a TimmWrapperModel",
    "edgetam_vision_model": _TIMM + "; its vision tower is a TimmWrapperModel",
    "fast_vlm": _TIMM + "; its vision tower is a TimmWrapperModel",
    "perception_lm": _TIMM + "; its vision tower is a TimmWrapperModel",
    "pe_video": _TIMM + "; its video tower is a TimmWrapperForImageClassification",
    "pe_video_encoder": _TIMM + "; its video tower is a TimmWrapperForImageClassification",
    "pe_audio_video": _TIMM + "; its video tower is a TimmWrapperForImageClassification",
    "pe_audio_video_encoder": _TIMM + "; its video tower is a TimmWrapperForImageClassification",
    "omdet-turbo": _TIMM + "; its default backbone is a timm Swin (only timm ResNet backbones are swapped)",
}

# Class-name specific reasons (rare; the model type is usually enough).
BLOCKED_BY_CLASS: dict[str, str] = {
    # Gemma3n's text-only classes build; the multimodal ones hold a timm vision tower
    "Gemma3nModel": _TIMM + "; its vision tower is a TimmWrapperModel",
    "Gemma3nForConditionalGeneration": _TIMM + "; its vision tower is a TimmWrapperModel",
}


def blocked_reason(model_type: str, class_name: str) -> str | None:
    return BLOCKED_BY_CLASS.get(class_name) or BLOCKED_BY_MODEL_TYPE.get(model_type)
