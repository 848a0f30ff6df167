"""XNNPACK partitions of quantized programs that its compiler refuses at load (issue 33): a node that
would read int8 and write float, or move int8 values between two different scales. Each case is a
program with explicit quantize/dequantize ops (what convert_pt2e writes) or a small int8 export; each
loads and runs only with its workaround (exporters/workarounds/executorch/xnnpack_partitioner.py), and
without it fails to load with "Failed to create ... xnn_status_invalid_parameter"."""

from __future__ import annotations

import pytest
import torch

from exporters import get_exporter
from exporters.utils import flatten_outputs

_CONFIGS = "patch:executorch:executorch.backends.xnnpack.partition.config.generic_node_configs."


def _qdq(x, scale, zero_point):
    qd = torch.ops.quantized_decomposed
    q = qd.quantize_per_tensor(x, scale, zero_point, -128, 127, torch.int8)
    return qd.dequantize_per_tensor(q, scale, zero_point, -128, 127, torch.int8)


class _Requantized(torch.nn.Module):
    """dq(s=0.02) -> op -> q(s=0.03): the op moves int8 values between two scales."""

    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, x):
        return _qdq(self.op(_qdq(x, 0.02, 3)), 0.03, -2)


class _SharedDequantize(torch.nn.Module):
    """One dequantize read by a slice that is a quantized pattern (same scale out) and by one that
    feeds a float op: what the edge decompositions leave of rotate-half after a ``chunk``."""

    def forward(self, x):
        d = _qdq(x, 0.02, 3)
        return _qdq(d[..., :4], 0.02, 3), -d[..., 4:]


def _export(model, x):
    from torch.ao.quantization.fx._decomposed import quantized_decomposed_lib  # noqa: F401 - registers the ops

    exporter = get_exporter("executorch")
    return exporter.export(model.eval(), {"x": x}, exporter.config_class())


@pytest.mark.parametrize("op, x, patch", [
    (lambda t: t.permute(0, 2, 1), torch.randn(2, 3, 8), _CONFIGS + "PermuteConfig.check_constraints"),
    (lambda t: torch.nn.functional.max_pool2d(t, 2), torch.randn(1, 4, 4, 4),
     _CONFIGS + "MaxPool2dConfig.check_constraints"),
], ids=["permute", "max_pool2d"])
def test_a_data_movement_op_between_two_scales_stays_out_of_the_delegate(op, x, patch):
    model = _Requantized(op)
    artifact = _export(model, x)
    assert patch in artifact.workarounds_fired
    assert torch.equal(list(flatten_outputs(artifact(x=x)).values())[0], model(x))


def test_each_user_of_a_shared_dequantize_gets_its_own():
    torch.manual_seed(0)
    x, model = torch.randn(2, 3, 8), _SharedDequantize()
    artifact = _export(model, x)
    assert "patch:executorch:executorch.exir.program._program.EdgeProgramManager.to_backend" in artifact.workarounds_fired
    got_all = list(flatten_outputs(artifact(x=x)).values())
    assert len(got_all) == 2
    for got, want in zip(got_all, model(x)):
        assert torch.equal(got, want)


class _PadAfterLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.nn.functional.pad(self.proj(x), (0, 3)).view(2, 3, 1, 11)


def test_a_float_pad_after_a_dequantize_is_not_requantized():
    """int8 recipe: the pad's dequantize is not fused (a pad is never a quantized pattern), so
    XNNPACK's InsertPadQDQPass must not make the pad write int8 (Qwen3_5's chunked delta rule)."""
    from exporters.parity import assert_close_quantized
    from exporters.quantization import int8

    torch.manual_seed(0)
    x = torch.randn(2, 3, 8)
    exporter = get_exporter("executorch")
    artifact = exporter.export(_PadAfterLinear().eval(), {"x": x},
                               exporter.config_class(quantization=int8(calibration=[{"x": x}])))
    assert "patch:executorch:executorch.backends.xnnpack._passes.insert_pad_qdq.InsertPadQDQPass.call" \
        in artifact.workarounds_fired
    assert_close_quantized(artifact.reference(x=x), artifact(x=x), "executorch")


def test_a_dequantized_scalar_placeholder_has_no_memory_format():
    """XNNPACK's ChannelsLastTaggedReshapePass indexed a dequantized placeholder's value to ask whether it
    is NHWC; a 0-dim one (int8 RTDetr's lifted scalar) raised IndexError and failed the lowering."""
    from executorch.backends.xnnpack._passes.channels_last_tagged_reshape_pass import ChannelsLastTaggedReshapePass
    from executorch.exir.dialects._ops import ops as exir_ops

    from exporters.workarounds.executorch.xnnpack_passes import _patch_channels_last_scalar_placeholder

    qd = exir_ops.edge.quantized_decomposed
    graph = torch.fx.Graph()
    scalar = graph.placeholder("scale")
    scalar.meta["val"] = torch.tensor(0.5)
    quantized = graph.call_function(qd.quantize_per_tensor.default, (scalar, 0.01, 0, -128, 127, torch.int8))
    dequantized = graph.call_function(qd.dequantize_per_tensor.default, (quantized, 0.01, 0, -128, 127, torch.int8))

    with pytest.raises(IndexError):
        ChannelsLastTaggedReshapePass.is_nhwc_node(dequantized)
    is_nhwc = _patch_channels_last_scalar_placeholder(ChannelsLastTaggedReshapePass.is_nhwc_node)
    is_nchw = _patch_channels_last_scalar_placeholder(ChannelsLastTaggedReshapePass.is_nchw_node)
    assert is_nhwc(dequantized) is False and is_nchw(dequantized) is True
    assert is_nhwc.acted() and is_nchw.acted()
