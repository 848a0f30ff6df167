"""ONNX workarounds: torch ops and torch.onnx / onnxscript internals patched, FX node fixes, the
translation table (translations.py) and the IR fixes (ir_fixes.py)."""
