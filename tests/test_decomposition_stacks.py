"""exporters/workarounds/torch_internals/decomposition_stacks.py: the lowerings' re-traces run with torch's stack capture off,
restored afterwards (also on error), and both lowerings still produce programs that match eager."""

from __future__ import annotations

import pytest
import torch
import torch.fx.config as fx_config

from exporters import OnnxConfig, OnnxExporter
from exporters.workarounds.torch_internals.decomposition_stacks import _without_stack_capture, stacks_not_captured


def test_flag_set_inside_and_restored():
    seen = []

    def retrace():
        seen.append(fx_config.do_not_emit_stack_traces)
        raise RuntimeError("boom")

    before = fx_config.do_not_emit_stack_traces
    with pytest.raises(RuntimeError, match="boom"):
        _without_stack_capture(retrace)()
    assert seen == [True] and fx_config.do_not_emit_stack_traces == before
    with stacks_not_captured():
        assert fx_config.do_not_emit_stack_traces


class _Sizes(torch.nn.Module):
    def forward(self, x):
        return x.reshape(x.shape[0] * x.shape[1] // 2, 2).sum(-1) * x.shape[1]


def test_onnx_dynamic_export_fires_and_matches():
    x = torch.randn(3, 4)
    art = OnnxExporter().export(_Sizes(), {"x": x}, OnnxConfig(dynamic=True))
    assert "patch:onnx:torch.onnx._internal.exporter._core._prepare_exported_program_for_export" in art.workarounds_fired
    for probe in (x, torch.randn(5, 6)):
        (got,) = art(x=probe).values()
        torch.testing.assert_close(got, _Sizes()(probe))


def test_executorch_lowering_fires():
    from exporters import ExecutorchExporter

    x = torch.randn(3, 4)
    art = ExecutorchExporter().export(_Sizes(), {"x": x})
    assert "patch:executorch:executorch.exir.program._program._gen_edge_manager_for_partitioners" in art.workarounds_fired
    (got,) = art(x=x).values()
    torch.testing.assert_close(got, _Sizes()(x))


def test_lowerings_install_the_shape_arithmetic_patches(monkeypatch):
    """torch.onnx and to_edge re-trace the program's sizes: the shape-arithmetic patches torch.export
    gets (sympy.simplify, ShapeEnv internals) are installed for the lowering too, and nothing else
    of the dynamo set."""
    import exporters.exporter_executorch as et
    import exporters.exporter_onnx as onx
    from exporters.tracing import SHAPE_ARITHMETIC_PATHS

    seen = {}

    def capture(key):
        def stop(self, program, *args):  # (traced, config, patches, ...) / (config, partitioners, patches, ...)
            seen[key] = {p.path for p in args[2]}
            raise RuntimeError("captured")
        return stop

    monkeypatch.setattr(onx.OnnxExporter, "_to_onnx", capture("onnx"))
    monkeypatch.setattr(et.ExecutorchExporter, "_lower", capture("executorch"))
    for exporter in (onx.OnnxExporter(), et.ExecutorchExporter()):
        with pytest.raises(Exception, match="captured"):
            exporter.export(_Sizes(), {"x": torch.randn(3, 4)})
    for key, paths in seen.items():
        assert "sympy.simplify" in paths, key
        assert "torch.fx.experimental.symbolic_shapes.ShapeEnv._maybe_evaluate_static" in paths, key
        assert "torch.utils._sympy.value_ranges.sympy_interp" in paths, key
        own = {"onnx": ("torch.onnx.", "onnxscript.", "onnx_ir.", "onnx."), "executorch": et._EXECUTORCH_INTERNALS}[key]
        dynamo_only = {p for p in paths if not p.startswith(own)}  # the backend's own lowering patches aside
        assert all(p.startswith(SHAPE_ARITHMETIC_PATHS) for p in dynamo_only), (key, dynamo_only)
    assert set(seen) == {"onnx", "executorch"}
