"""Normalized error signatures: failures that share a cause share a signature.

    >>> error_signature(ValueError("Expected size 7 but got 12 for 'input_ids' at 0x7f3a"))
    "ValueError: Expected size N but got N for 'X' at 0xN"
"""

from __future__ import annotations

import re

_PATTERNS = (
    (re.compile(r"0x[0-9a-fA-F]+"), "0xN"),
    (re.compile(r"(/[\w.\-]+)+\.(py|so|cpp|h)(:\d+)?"), "<path>"),
    (re.compile(r"'[^'\n]{1,120}'"), "'X'"),
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


def root_cause(exc: BaseException) -> BaseException:
    """The innermost exception of a chain of stage wrappers (ExportStageError)."""
    from exporters.base import ExportStageError

    while isinstance(exc, ExportStageError) and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def error_signature(exc: BaseException) -> str:
    cause = root_cause(exc)
    return f"{type(cause).__name__}: {normalize_message(str(cause))}"
