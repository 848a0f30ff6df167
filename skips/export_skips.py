"""EXPORT_SKIPS: model classes that cannot be exported as they are.

Each entry becomes ``pytest.mark.xfail(reason=..., strict=True)`` on the matching sweep
items, so its reason shows in every report and an entry whose model starts passing turns
the run red (XPASS strict): the list can only shrink.

Rule: every entry names the real cause (data-dependent control flow that cannot be
vectorized, a module passed as a forward argument, ...) AND the model-side change that
would remove it. "fails", "TODO", "flaky" are rejected at collection time. Fix the model
(or add a workaround in ``exporters``) instead of growing this list.

How to add an entry (keyword arguments only)::

    ExportSkip(
        classes=("SomeModelForCausalLM",),        # class names, or model_types=("some-family",)
        backends="all",                           # or ("onnx",), ("dynamo", "executorch")
        variants="all",                           # or ("dynamic",) / ("static",)
        stage="export",                           # where it is expected to fail (optional)
        reason="router loops over experts with a data-dependent count; vectorize the "
               "dispatch with a one-hot mask in the model to remove this entry",
        upstream="https://github.com/huggingface/transformers/issues/NNNNN",   # optional
    )

Unknown names, meaningless scopes, vague reasons and overlapping entries stop collection
(see ``skips.validate``).
"""

from __future__ import annotations

from skips.records import ExportSkip

EXPORT_SKIPS: tuple[ExportSkip, ...] = (
    ExportSkip(
        classes=("Aimv2Model",),
        stage="compare",
        reason="eager is wrong, not the export: with sdpa and an attention_mask without padding, "
               "create_causal_mask skips the mask and Aimv2Attention has is_causal=False, so the eager "
               "text tower attends bidirectionally while every export (mask kept) is causal; eager sdpa vs "
               "eager 'eager' attention differ by 1.29 on the tiny model. Remove when Aimv2's text "
               "attention sets is_causal=True (or the mask skip is disabled for it) in transformers",
    ),
    ExportSkip(
        classes=("Wav2Vec2ForCTC",),
        backends=("executorch",),
        variants=("dynamic",),
        stage="lower",
        reason="XNNPACK's reshape supports a single dynamic dimension and the conv feature encoder's "
               "output reshape has two (batch and frames); lowering raises 'XNNPACK reshape only supports "
               "1 dynamic dimension'. Remove when XNNPACK's partitioner leaves such reshapes to the "
               "portable kernels (or the model reshapes with one dynamic dim)",
    ),
)
