"""Patch (onnx, executorch): the lowerings' re-traces do not capture a Python stack per new node.

Cause. Both lowerings re-trace the exported program (``ExportedProgram.run_decompositions``: torch.onnx
before translating, ExecuTorch's ``to_edge`` twice, then its edge passes), and for every node that
does not inherit a stack trace from the node it replays (every symbolic-size operation) torch's
tracer captures and formats the whole Python stack (``CapturedTraceback.extract().summary()``,
fx/proxy.py:287). On size-heavy dynamic programs that is most of the lowering: py-spy on
SwinForImageClassification's ONNX dynamic export put 76% of its samples in
``CapturedTraceback.summary``.

What this changes. Those re-traces run with ``torch.fx.config.do_not_emit_stack_traces`` (torch's own
switch for this cost): replayed nodes keep the stack trace they carry, new ones get none (it only
labels graph dumps and ONNX metadata). The graphs are otherwise the same.

    before: run_decompositions(...)   after: the same, with do_not_emit_stack_traces=True

Remove when: torch's FX tracer stops capturing and formatting a whole Python stack for every node a
re-trace creates (``CapturedTraceback.extract().summary()`` in torch/fx/proxy.py), or
``run_decompositions`` as torch.onnx and ExecuTorch's ``to_edge`` call it runs with
``torch.fx.config.do_not_emit_stack_traces`` on its own.
"""

from __future__ import annotations

import contextlib
import functools

import torch.fx.config as fx_config

from exporters.utils import register_patch


@contextlib.contextmanager
def stacks_not_captured():
    previous = fx_config.do_not_emit_stack_traces
    fx_config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        fx_config.do_not_emit_stack_traces = previous


def _without_stack_capture(original):
    @functools.wraps(original)
    def retrace(*args, **kwargs):
        with stacks_not_captured():
            return original(*args, **kwargs)

    return retrace


@register_patch("onnx", "torch.onnx._internal.exporter._core._prepare_exported_program_for_export")
def _patch_onnx_decompositions_without_stack_capture(original):
    return _without_stack_capture(original)


@register_patch("executorch", "executorch.exir.program._program._gen_edge_manager_for_partitioners")
def _patch_edge_decompositions_without_stack_capture(original):
    return _without_stack_capture(original)
