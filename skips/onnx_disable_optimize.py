"""ONNX_DISABLE_OPTIMIZE: models exported to ONNX with onnxscript optimization turned off.

Only for confirmed bugs in the onnxscript graph optimizer (e.g. a constant-folding crash
on ``SplitToSequence``, initializers dropped). Each entry must cite the specific upstream
bug in ``upstream`` (an http(s) link to the issue or pull request); never disable
optimization at will. Remove the entry when the upstream fix lands: the list should shrink.

How to add an entry (keyword arguments only)::

    OnnxDisableOptimize(
        classes=("SomeModelForObjectDetection",),   # or model_types=("some-family",)
        reason="constant folding crashes on SplitToSequence produced by the FPN neck",
        upstream="https://github.com/microsoft/onnxscript/issues/NNNN",
    )

The sweep sets ``optimize=False`` for matching ONNX exports and reports the link.
"""

from __future__ import annotations

from skips.records import OnnxDisableOptimize

ONNX_DISABLE_OPTIMIZE: tuple[OnnxDisableOptimize, ...] = ()
