"""Whether the trace under way is stage 0's: the one whose program PT2E prepares
(``exporters.quantization.quantize``). A workaround that traces a form PT2E cannot carry through
prepare, convert and the second export (a ``torch.scan`` higher-order op) asks ``in_quantization_trace()``
and keeps the plain form there."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

_QUANTIZATION_TRACE: list[bool] = [False]


@contextlib.contextmanager
def tracing_for_quantization() -> Iterator[None]:
    """Within the block, ``in_quantization_trace()`` is True: the trace whose program PT2E prepares
    (exporters.quantization.quantize, stage 0). A patch that traces a form PT2E cannot carry through
    prepare, convert and the second export (a ``torch.scan`` higher-order op) keeps the plain form there."""
    previous, _QUANTIZATION_TRACE[0] = _QUANTIZATION_TRACE[0], True
    try:
        yield
    finally:
        _QUANTIZATION_TRACE[0] = previous


def in_quantization_trace() -> bool:
    return _QUANTIZATION_TRACE[0]
