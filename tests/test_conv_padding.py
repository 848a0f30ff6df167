"""exporters/workarounds/models/encodec_conv_padding.py: the Encodec-style conv's extra padding in integer arithmetic equals
upstream's for every length, and a strided causal conv exports with a dynamic length."""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers import MimiConfig
from transformers.models.mimi.modeling_mimi import MimiConv1d

from exporters import DynamoConfig, DynamoExporter
from exporters.utils import DEFAULT_REGISTRY
from exporters.workarounds.models.encodec_conv_padding import extra_padding

NAME = "patch:dynamo:transformers.models.mimi.modeling_mimi.MimiConv1d._get_extra_padding_for_conv1d"


def test_equals_upstream_for_every_length():
    conv = MimiConv1d(MimiConfig(), 1, 1, kernel_size=4, stride=2)
    for length, kernel, stride in itertools.product(range(1, 50), (1, 2, 3, 4, 7, 8), (1, 2, 3, 4, 5)):
        if stride > kernel:
            continue
        conv.kernel_size, conv.stride, conv.padding_total = (torch.tensor(v) for v in (kernel, stride, kernel - stride))
        expected = int(MimiConv1d._get_extra_padding_for_conv1d(conv, torch.empty(1, 1, length)))
        assert extra_padding(length, kernel, stride, kernel - stride) == expected, (length, kernel, stride)


class _ConvThenBranch(torch.nn.Module):
    """Mimi's encoder: a strided causal conv, then code that branches on the frame count (the
    transformer's ``q_length > 1``), which an unbacked frame count cannot decide."""

    def __init__(self):
        super().__init__()
        self.conv = MimiConv1d(MimiConfig(use_causal_conv=True), 2, 3, kernel_size=7, stride=3)

    def forward(self, hidden_states):
        out = self.conv(hidden_states)
        return out * 2 if out.shape[-1] > 1 else out


def test_strided_causal_conv_exports_with_a_dynamic_length():
    conv = _ConvThenBranch().eval()
    x = torch.randn(1, 2, 40)
    with pytest.raises(Exception, match="(?i)data.dependent|unbacked|guard"):
        DynamoExporter(registry=DEFAULT_REGISTRY.without(NAME)).export(conv, {"hidden_states": x}, DynamoConfig(dynamic=True))
    art = DynamoExporter().export(conv, {"hidden_states": x}, DynamoConfig(dynamic=True))
    assert NAME in art.workarounds_fired
    for length in (40, 23, 64, 9):
        sample = torch.randn(1, 2, length)
        (got,) = art(hidden_states=sample).values()
        torch.testing.assert_close(got, conv(sample))
