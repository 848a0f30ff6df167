"""Model types that need a package we cannot install in this environment, and classes that
cannot be run through a tensor forward at all (untestable for export).

Data only: model type / class name -> reason.  ``catalog()`` copies the reason into
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


# Classes with no tensor forward: exporting traces ``forward(**tensors)``, and these have none to
# trace.  Listed (never silently dropped) through the same ``blocked_by`` path: ``catalog()`` copies
# the reason, ``build_tiny`` raises ``NoTensorForward`` (a ``BlockedByPackage``), the sweep marks them
# strict xfails.  Every reason starts with "needs" (the sweep prints "build: <reason>").
_GENERATE_ONLY = "needs a tensor forward(): generate-only wrapper, defines no forward() (untestable for export)"
_SESSION = ("needs a tensor forward(): forward takes a stateful Python {} (per-video frame store, "
            "prompts and memory caches mutated across calls), not tensors (untestable for export)")
_ASSISTANT = ("needs flat tensor inputs: forward takes shared_kv_states, a dict of per-layer-type (key, value) pairs "
              "produced by a separate {target} target model, plus that model's inputs_embeds (exporters take flat keyword "
              "tensors; untestable for export); besides, {config_note}")
NO_TENSOR_FORWARD_BY_CLASS: dict[str, str] = {
    "BarkModel": _GENERATE_ONLY + "; its sub-models (semantic/coarse/fine/codec) are catalogued separately",
    "Qwen2_5OmniForConditionalGeneration": _GENERATE_ONLY + "; thinker and talker are catalogued separately",
    "Qwen3OmniMoeForConditionalGeneration": _GENERATE_ONLY + "; thinker and talker are catalogued separately",
    "GlmImageVQVAE": "needs a tensor forward(): encode-only VQ-VAE, defines no forward() (untestable for export)",
    "Sam2VideoModel": _SESSION.format("Sam2VideoInferenceSession"),
    "Sam3TrackerVideoModel": _SESSION.format("Sam3TrackerVideoInferenceSession"),
    "Sam3VideoModel": _SESSION.format("Sam3VideoInferenceSession"),
    "EdgeTamVideoModel": _SESSION.format("EdgeTamVideoInferenceSession"),
    "Gemma4AssistantForCausalLM": _ASSISTANT.format(target="Gemma4", config_note=(
        "no config with any layer builds in transformers 5.23.0: validate_architecture demands num_kv_shared_layers == num_hidden_layers "
        "(every layer reuses KV), and then Gemma4TextConfig.kv_sharing_modes raises at model init because no layer "
        "produces a cache (configuration_gemma4.py:239-242)")),
    "Gemma4UnifiedAssistantForCausalLM": _ASSISTANT.format(target="Gemma4Unified", config_note=(
        "its default config does not build in transformers 5.23.0: __post_init__ sets num_kv_shared_layers = "
        "num_hidden_layers, and Gemma4UnifiedTextConfig.kv_sharing_modes then raises at model init because no layer "
        "produces a cache (configuration_gemma4_unified.py:207-210)")),
    "VoxtralRealtimeTextModel": ("needs a model class: listed in the auto mappings (voxtral_realtime_text) but "
                                 "transformers defines no VoxtralRealtimeTextModel (only its config and layers)"),
}


def untestable_reason(class_name: str) -> str | None:
    """Why a class has no tensor forward to export, or None."""
    return NO_TENSOR_FORWARD_BY_CLASS.get(class_name)


def blocked_reason(model_type: str, class_name: str) -> str | None:
    return (BLOCKED_BY_CLASS.get(class_name) or BLOCKED_BY_MODEL_TYPE.get(model_type)
            or untestable_reason(class_name))
