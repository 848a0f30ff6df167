"""exporters/workarounds/models/qwen3_audio_windows.py: Qwen3 audio encoders' attention windows from a static grid.

The patched ``get_audio_cu_seqlens`` must put every packed frame in the same window as the original's
Python loop (several windows per sample, a partial last window, padded samples), the encoder must
give eager's output under it with a padded mask, and the encoder must export with it (not without).
"""

from __future__ import annotations

import os
from unittest import mock

import pytest
import torch

from exporters import DynamoConfig, DynamoExporter
from exporters.utils import DEFAULT_REGISTRY
from exporters.workarounds.models.packed_attention import segment_ids
from exporters.workarounds.models.qwen3_audio_windows import AUDIO_WINDOW_PATHS, _patch_audio_windows_static

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ASR = "transformers.models.qwen3_asr.modeling_qwen3_asr"
NAME = f"patch:dynamo:{ASR}.get_audio_cu_seqlens"


def test_registered_for_both_copies():
    names = {e.name for e in DEFAULT_REGISTRY.patches("dynamo")}
    assert {f"patch:dynamo:{p}" for p in AUDIO_WINDOW_PATHS} <= names


def _lengths(feature_lens, num_chunks, chunk_len):
    """chunk_lengths the encoder derives from a left-aligned mask of ``feature_lens`` frames per sample."""
    mask = torch.arange(num_chunks * chunk_len)[None, :] < torch.tensor(feature_lens)[:, None]
    return mask.view(len(feature_lens), num_chunks, chunk_len).sum(-1).reshape(-1), mask.sum(-1)


@pytest.mark.parametrize("feature_lens,n_window_infer", [
    ([500, 500], 200),      # 5 full chunks each: windows of 26 frames, a partial last one
    ([500, 170], 200),      # a padded sample: fewer windows, a partial chunk
    ([130, 40], 400),       # one window per sample, shorter than the grid's
    ([300, 1], 100),        # window = one chunk (ratio 1), a 1-frame sample
    ([0, 250], 200),        # an empty sample
])
def test_same_windows_as_the_python_loop(feature_lens, n_window_infer):
    from transformers.models.qwen3_asr import modeling_qwen3_asr as m

    n_window, num_chunks = 50, 5
    chunk_lengths, lens = _lengths(feature_lens, num_chunks, 2 * n_window)
    original = m.get_audio_cu_seqlens
    expected = original(chunk_lengths, lens, n_window_infer, n_window)
    got = _patch_audio_windows_static(original)(chunk_lengths, lens, n_window_infer, n_window)
    assert got.dtype == expected.dtype == torch.int32
    assert got[-1] == expected[-1]  # same packed length
    # the same boundaries, the grid's empty windows only repeating one
    assert torch.equal(torch.unique_consecutive(got), torch.unique_consecutive(expected))
    length = int(expected[-1])
    assert torch.equal(segment_ids(got, length).unique_consecutive(return_counts=True)[1],
                       segment_ids(expected, length).unique_consecutive(return_counts=True)[1])
    if len(expected) > len(feature_lens) + 1:
        assert len(got) > len(feature_lens) + 1  # a sample really was cut into several windows


def test_precomputed_cu_seqlens_pass_through():
    from transformers.models.qwen3_asr import modeling_qwen3_asr as m

    given = torch.tensor([0, 5], dtype=torch.int32)
    kwargs = {"cu_seqlens": given}
    got = _patch_audio_windows_static(m.get_audio_cu_seqlens)(torch.ones(1), torch.ones(1), 800, 50, kwargs=kwargs)
    assert got is given and kwargs == {}


@pytest.fixture(scope="module")
def encoder():
    from transformers.models.qwen3_asr.configuration_qwen3_asr import Qwen3ASREncoderConfig
    from transformers.models.qwen3_asr.modeling_qwen3_asr import Qwen3ASREncoder

    torch.manual_seed(0)
    config = Qwen3ASREncoderConfig(num_mel_bins=16, d_model=32, encoder_layers=1, encoder_attention_heads=4,
                                   encoder_ffn_dim=64, downsample_hidden_size=8, output_dim=32,
                                   n_window=50, n_window_infer=200, max_position_embeddings=64)
    config._attn_implementation = "sdpa"
    model = Qwen3ASREncoder(config).eval()
    with torch.no_grad():  # with the 0.02-std init all frames look alike and no window matters: make them differ
        for p in model.parameters():
            p.normal_(std=0.5)
    mask = torch.arange(500)[None, :] < torch.tensor([500, 170])[:, None]
    return model, {"input_features": torch.randn(2, 16, 500), "input_features_mask": mask.long()}


def test_encoder_equals_eager_and_exports(encoder):
    model, inputs = encoder
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
    with pytest.raises(Exception, match="(?i)data.dependent"):
        DynamoExporter(registry=DEFAULT_REGISTRY.without(NAME)).export(model, inputs, DynamoConfig())
    art = DynamoExporter().export(model, inputs, DynamoConfig())
    assert NAME in art.workarounds_fired
    assert expected.shape[0] == 13 * 5 + 13 + 9  # 5 full chunks, then 1 full + 70 frames (9 after the CNN)
    torch.testing.assert_close(art(**inputs)["last_hidden_state"], expected)
    # the windows matter: one window per sample gives another result
    from transformers.models.qwen3_asr import modeling_qwen3_asr as m

    one_window_each = torch.tensor([0, 65, 87], dtype=torch.int32)
    with torch.no_grad(), mock.patch.object(m, "get_audio_cu_seqlens", lambda *args, **kwargs: one_window_each):
        whole = model(**inputs).last_hidden_state
    assert (whole - expected).abs().max().item() > 1e-3
