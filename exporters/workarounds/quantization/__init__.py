"""Workarounds for PT2E quantization (stage 0: ``prepare_pt2e`` / calibration / ``convert_pt2e``):
torchao's PT2E utilities and ExecuTorch's XNNPACK quantizer. Registered under "dynamo" (every backend
quantizes the same way); installed only around stage 0 (``exporters.quantization.quantize``), never
around a trace or a lowering (``QUANTIZATION_INTERNALS`` in exporters/utils.py)."""
