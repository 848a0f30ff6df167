"""What complex_as_real and its FFT rules share: complex dtypes and their real parts, and the
exception a rule raises for a use it cannot rewrite."""

from __future__ import annotations

from typing import Any

import torch

_REAL_OF = {torch.complex32: torch.float16, torch.complex64: torch.float32, torch.complex128: torch.float64}

# higher-order ops that run their subgraph once, inline, on their operands: a complex operand or
# result may cross them (DeepSeek-V2 builds freqs_cis under torch.no_grad / autocast off)
_WRAPPERS = ("wrap_with_set_grad_enabled", "wrap_with_autocast")


class _Unhandled(Exception):
    """A complex value reaches an op this rewrite does not know: leave the program as it was."""


def _is_complex(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_complex()


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _real_dtype(value: Any) -> Any:
    return _REAL_OF.get(value, value) if isinstance(value, torch.dtype) else value


def _rank(node_arg) -> int:
    return _val(node_arg).dim()
