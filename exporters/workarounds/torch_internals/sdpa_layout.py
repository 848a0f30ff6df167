"""Torch patch: scaled_dot_product_attention's output traced contiguous.

Cause. The CPU SDPA kernel returns its output laid out as (batch, seq, heads, dim), so the model's
``transpose(1, 2).reshape(...)`` traces as a free ``view`` and its ``.contiguous()`` vanishes. ONNX
and ExecuTorch lowering decompose SDPA into matmuls whose output is (batch, heads, seq,
dim)-contiguous, and that recorded ``view`` then fails ("Cannot view a tensor with shape ... and
strides ..."; GPT-2 on ExecuTorch, T5 on ONNX).

What this changes (while tracing only). The traced output is copied to a contiguous layout, so the
reshape is traced as the copy it is after lowering. Registered for dynamo, so every exporter traces
the same graph.

    before: sdpa(q, k, v) -> strides of (b, s, h, d)   after: sdpa(q, k, v).clone(contiguous)

Remove when: the output strides of torch's ``scaled_dot_product_attention`` at trace time (the CPU
kernel's (batch, seq, heads, dim) layout) and after the lowerings' decomposition (matmuls, (batch,
heads, seq, dim)-contiguous) agree, so a ``view`` traced against one is valid for the other.
"""

from __future__ import annotations

import torch

from exporters.utils import register_patch


@register_patch("dynamo", "torch.nn.functional.scaled_dot_product_attention")
def _patch_sdpa_contiguous_output(original):
    """The CPU SDPA kernel returns its output laid out as (batch, seq, heads, dim), so the model's
    ``transpose(1, 2).reshape(...)`` traces as a free ``view`` and its ``.contiguous()`` vanishes.
    ONNX and ExecuTorch lowering decompose SDPA into matmuls whose output is (batch, heads, seq,
    dim)-contiguous, and that recorded ``view`` then fails ("Cannot view a tensor with shape ...
    and strides ..."; GPT-2 on ExecuTorch, T5 on ONNX). Make the traced output contiguous, so the
    reshape is traced as the copy it is after lowering. Registered for dynamo, so every exporter
    traces the same graph.

    before: sdpa(q, k, v) -> strides of (b, s, h, d)   after: sdpa(q, k, v).clone(contiguous)
    """

    def sdpa(*args, **kwargs):
        # always: the layout the fake kernel reports at trace time (flash or math) need not be the one
        # a later decomposition sees, so only an explicit copy pins it
        return original(*args, **kwargs).clone(memory_format=torch.contiguous_format)

    return sdpa
