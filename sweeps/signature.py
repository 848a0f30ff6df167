"""Normalized error signatures: failures that share a cause share a signature.

    >>> error_signature(ValueError("Expected size 7 but got 12 for 'input_ids' at 0x7f3a"))
    "ValueError: Expected size N but got N for 'X' at 0xN"
    >>> error_signature(RuntimeError("no lowering for 'aten.histc.default' (12 nodes)"))
    "RuntimeError: no lowering for 'aten.histc.default' (N nodes)"

Operator names (aten.*, prims.*, ...) are kept: they are the cause.
"""

from __future__ import annotations

import re

# operator names are the cause itself (aten.histc, transformers.grouped_mm_fallback): kept
_OPERATOR = re.compile(r"'(torch\.ops\.)?(aten|prims|quantized|transformers|torchvision|executorch\w*|llama)[.:]")

_PATTERNS = (
    (re.compile(r"\x1b\[[0-9;]*m"), ""),  # terminal colours (torch.onnx prints them)
    (re.compile(r"0x[0-9a-fA-F]+"), "0xN"),
    (re.compile(r"(/[\w.\-]+)+\.(py|so|cpp|h)(:\d+)?"), "<path>"),
    (re.compile(r"(?<!\w)'[^'\n]{1,120}'"), lambda m: m.group(0) if _OPERATOR.match(m.group(0)) else "'X'"),
    (re.compile(r'"[^"\n]{1,120}"'), '"X"'),
    (re.compile(r"\bs\d+\b"), "sN"),  # torch symbols
    (re.compile(r"\bu\d+\b"), "uN"),  # unbacked symbols
    (re.compile(r"\b\d+(\.\d+)?(e[-+]?\d+)?\b"), "N"),
    (re.compile(r"\s+"), " "),
)


def normalize_message(message: str, limit: int = 160) -> str:
    lines = [ln.strip() for ln in str(message).splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# Wrappers whose own message is generic ("Failed to convert the exported program to an ONNX
# model"): the signature is taken from what they wrap.
_WRAPPER_NAMES = {"ExportStageError", "ConversionError", "TorchExportError", "OnnxExporterError"}


def root_cause(exc: BaseException) -> BaseException:
    """The first exception in the ``__cause__`` chain that is not a generic wrapper."""
    seen = set()
    while type(exc).__name__ in _WRAPPER_NAMES and exc.__cause__ is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc = exc.__cause__
    return exc


def error_signature(exc: BaseException) -> str:
    cause = root_cause(exc)
    return f"{type(cause).__name__}: {normalize_message(str(cause))}"
