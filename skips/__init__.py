"""The skip and disable lists as data, their validation and lookup helpers.

- ``EXPORT_SKIPS`` (:mod:`skips.export_skips`): models that cannot be exported as they are;
  each becomes a strict xfail carrying its reason (:func:`xfail_marker`).
- ``ONNX_DISABLE_OPTIMIZE`` (:mod:`skips.onnx_disable_optimize`): models whose ONNX export
  runs with ``optimize=False`` because of a cited upstream optimizer bug.

Lookups take the list as a keyword argument so tests can inject their own; nothing here
mutates module state.
"""

from __future__ import annotations

from collections.abc import Sequence

from skips.export_skips import EXPORT_SKIPS
from skips.onnx_disable_optimize import ONNX_DISABLE_OPTIMIZE
from skips.records import BACKENDS, STAGES, TESTS, VARIANTS, ExportSkip, OnnxDisableOptimize, SkipListError
from skips.validate import installed_names, validate_lists

__all__ = [
    "BACKENDS", "EXPORT_SKIPS", "ONNX_DISABLE_OPTIMIZE", "STAGES", "TESTS", "VARIANTS", "ExportSkip",
    "OnnxDisableOptimize", "SkipListError", "find_export_skip", "find_onnx_disable_optimize",
    "installed_names", "validate_lists", "xfail_marker", "marker_reason",
]


def find_export_skip(class_name: str | None, model_type: str | None, backend: str,
                     variant: str, *, test: str = "export", entries: Sequence[ExportSkip] = EXPORT_SKIPS
                     ) -> ExportSkip | None:
    """The EXPORT_SKIPS entry covering this sweep item, or None.

    Matches by class name or by model type (``nllb-moe`` == ``nllb_moe``), within the
    entry's backends and variants. Lists are validated to have no overlaps, so the first
    match is the only one.
    """
    for entry in entries:
        if entry.matches(class_name, model_type, backend, variant, test):
            return entry
    return None


def find_onnx_disable_optimize(class_name: str | None, model_type: str | None,
                               variant: str | None = None, *,
                               entries: Sequence[OnnxDisableOptimize] = ONNX_DISABLE_OPTIMIZE
                               ) -> OnnxDisableOptimize | None:
    """The ONNX_DISABLE_OPTIMIZE entry for this model (and variant, if given), or None."""
    for entry in entries:
        if entry.matches(class_name, model_type, "onnx", variant):
            return entry
    return None


def marker_reason(entry: ExportSkip | OnnxDisableOptimize) -> str:
    """The text pytest prints for an entry: its reason, then its stage and upstream link if any."""
    notes = []
    if getattr(entry, "stage", None):
        notes.append(f"expected to fail at stage {entry.stage}")
    if entry.upstream:
        notes.append(f"upstream: {entry.upstream}")
    reason = entry.reason.strip()
    return f"{reason} ({'; '.join(notes)})" if notes else reason


def xfail_marker(entry: ExportSkip):
    """``pytest.mark.xfail(reason=..., strict=True)`` for an EXPORT_SKIPS entry.

    Strict: when the model starts passing the item fails (XPASS strict), so the entry
    has to be removed.
    """
    import pytest

    return pytest.mark.xfail(reason=marker_reason(entry), strict=True)
