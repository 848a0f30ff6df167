"""Every registered workaround with its backend and stage, for reports and re-checks.

    >>> from exporters.inventory import list_workarounds
    >>> any(w["name"].startswith("patch:dynamo:") for w in list_workarounds())
    True
"""

from __future__ import annotations

from .utils import DEFAULT_REGISTRY, FixEntry, PatchEntry, Registry


def _stage(entry: PatchEntry | FixEntry) -> str:
    from .exporter_executorch import _EXECUTORCH_INTERNALS
    from .exporter_onnx import _ONNX_INTERNALS

    if isinstance(entry, PatchEntry):
        if entry.backend == "dynamo":
            return "2: Model patches"
        if entry.backend == "onnx":
            return "2: ONNX patches" if entry.path.startswith(_ONNX_INTERNALS) else "1: Torch patches"
        return "3: ExecuTorch patches" if entry.path.startswith(_EXECUTORCH_INTERNALS) else "2: Torch patches"
    if entry.backend == "onnx":
        return "3: FX node fixes"
    return "4: FX program fixes" if entry.kind == "program" else "5: FX node fixes"


def _doc(obj) -> str:
    return ((obj.__doc__ or "").strip().splitlines() or [""])[0]


def list_workarounds(registry: Registry | None = None) -> list[dict[str, str]]:
    """``[{"name", "backend", "stage", "doc"}]`` for patches, fixes, ONNX translations, IR fixes and
    the ExecuTorch export loop's retries (``LOWERING_RETRIES``), and stage 1's baked-mask rule (exporters/specialize.py)."""
    from . import exporter_onnx
    from .executorch.lowering import retry_fixes
    from .specialize import BAKED_MASK_DOC, BAKED_MASK_FIX

    reg = registry if registry is not None else DEFAULT_REGISTRY
    rows = []
    for entry in reg.all_workarounds():
        fn = entry.factory if isinstance(entry, PatchEntry) else entry.fn
        rows.append({"name": entry.name, "backend": entry.backend, "stage": _stage(entry), "doc": _doc(fn)})
    translations = [*exporter_onnx._ONNX_TRANSLATION_TABLE.values(), *exporter_onnx._ONNX_COMPLEX_TRANSLATION_TABLE.values()]
    for fn in dict.fromkeys(translations):
        rows.append({"name": f"translation:onnx:{fn.__name__}", "backend": "onnx",
                     "stage": "4: ONNX translations", "doc": _doc(fn)})
    for fn in exporter_onnx._IR_FIXES:
        rows.append({"name": f"fix:onnx:{fn.__name__}", "backend": "onnx", "stage": "5: ONNX IR fixes",
                     "doc": _doc(fn)})
    rows.append({"name": BAKED_MASK_FIX, "backend": "dynamo", "stage": "1: Forward-signature patch", "doc": BAKED_MASK_DOC})
    for name, doc in retry_fixes().items():
        rows.append({"name": name, "backend": "executorch", "stage": "export loop: retries", "doc": doc})
    return rows
