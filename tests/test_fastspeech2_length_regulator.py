"""exporters/workarounds/models/fastspeech2_conformer.py: the vectorized length regulator and relative shift
give eager's outputs exactly (zero durations, speaking speed, several lengths), and FastSpeech2Conformer
exports (it does not without the patches)."""

from __future__ import annotations

import os

import pytest
import torch

from exporters import DynamoExporter
from exporters.utils import DEFAULT_REGISTRY
from exporters.workarounds.models.fastspeech2_conformer import regulated, shifted

os.environ.setdefault("HF_HUB_OFFLINE", "1")
MODULE = "transformers.models.fastspeech2_conformer.modeling_fastspeech2_conformer"


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("speed", [1.0, 1.5])
def test_regulated_equals_length_regulator(seed, speed):
    from transformers.models.fastspeech2_conformer.modeling_fastspeech2_conformer import length_regulator

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 5, 4, generator=g)
    durations = torch.randint(0, 4, (3, 5), generator=g)
    if seed == 0:
        durations.zero_()  # eager's branch: every row becomes ones
    if seed == 1:
        durations[1] = 0  # one empty row: zeros, padded
    expected = length_regulator(x, durations.clone(), speed)
    got = regulated(x, durations.clone(), speed)
    assert got.shape == expected.shape and torch.equal(got, expected)


@pytest.mark.parametrize("time", [1, 2, 5, 9])
def test_shifted_equals_the_view_trick(time):
    from transformers.models.fastspeech2_conformer.modeling_fastspeech2_conformer import FastSpeech2ConformerAttention

    pos = torch.randn(2, 3, time, 2 * time - 1)
    assert torch.equal(shifted(pos), FastSpeech2ConformerAttention.shift_relative_position_tensor(None, pos))


def test_exports():
    from sweeps.runner import reference

    tiny = reference("FastSpeech2ConformerModel").tiny
    names = [f"patch:dynamo:{MODULE}.length_regulator",
             f"patch:dynamo:{MODULE}.FastSpeech2ConformerRelPositionalEncoding.forward",
             f"patch:dynamo:{MODULE}.FastSpeech2ConformerAttention.shift_relative_position_tensor"]
    with pytest.raises(Exception, match="(?i)data.dependent"):
        DynamoExporter(registry=DEFAULT_REGISTRY.without(*names)).export(tiny.model, tiny.inputs)
    art = DynamoExporter().export(tiny.model, tiny.inputs)
    assert set(names) <= set(art.workarounds_fired)
    with torch.no_grad():
        expected = tiny.model(**tiny.inputs).spectrogram
    torch.testing.assert_close(art(**tiny.inputs)["spectrogram"], expected)
