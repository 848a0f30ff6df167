"""exporters/workarounds/models/packed_attention.py: packed ``cu_seqlens`` attention as one masked call.

The patched forward must compute what eager's per-segment split computes (segments of different
lengths, sdpa and eager attention, two projection layouts), and Glm4vVisionModel must export with it.
"""

from __future__ import annotations

import pytest
import torch

from exporters.utils import DEFAULT_REGISTRY, Registry, apply_patches, register_patch
from exporters.workarounds.models.packed_attention import SEGMENTED_ATTENTION_PATHS, _patch_segmented_attention, segment_ids

GLM4V = "transformers.models.glm4v.modeling_glm4v.Glm4vVisionAttention.forward"
OMNI_AUDIO = "transformers.models.qwen2_5_omni.modeling_qwen2_5_omni.Qwen2_5OmniAudioAttention.forward"
CU_SEQLENS = torch.tensor([0, 3, 4, 11], dtype=torch.int32)  # segments of lengths 3, 1 and 7


def test_segment_ids_handle_uneven_and_empty_segments():
    assert segment_ids(CU_SEQLENS, 11).tolist() == [0, 0, 0, 1, 2, 2, 2, 2, 2, 2, 2]
    with_empty = torch.tensor([0, 3, 4, 4, 11], dtype=torch.int32)  # an empty third segment
    assert segment_ids(with_empty, 11).tolist() == [0, 0, 0, 1, 3, 3, 3, 3, 3, 3, 3]


def test_registered_for_every_segmented_class():
    names = {e.name for e in DEFAULT_REGISTRY.patches("dynamo")}
    assert {f"patch:dynamo:{p}" for p in SEGMENTED_ATTENTION_PATHS} <= names
    assert GLM4V in SEGMENTED_ATTENTION_PATHS and OMNI_AUDIO in SEGMENTED_ATTENTION_PATHS


def _glm4v_attention(attn_implementation):
    from transformers.models.glm4v.configuration_glm4v import Glm4vVisionConfig
    from transformers.models.glm4v.modeling_glm4v import Glm4vVisionAttention

    config = Glm4vVisionConfig(hidden_size=32, num_heads=4, attention_bias=True)
    config._attn_implementation = attn_implementation
    module = Glm4vVisionAttention(config).eval()
    seq = int(CU_SEQLENS[-1])
    angles = torch.randn(seq, 4).repeat(1, 2)  # head_dim 8
    cos, sin = angles.cos(), angles.sin()
    return module, (torch.randn(seq, 32), CU_SEQLENS), {"position_embeddings": (cos, sin)}


def _omni_audio_attention(attn_implementation):
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniAudioEncoderConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniAudioAttention

    config = Qwen2_5OmniAudioEncoderConfig(d_model=32, encoder_attention_heads=4)
    config._attn_implementation = attn_implementation
    module = Qwen2_5OmniAudioAttention(config).eval()
    return module, (torch.randn(int(CU_SEQLENS[-1]), 32), CU_SEQLENS), {}


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("build,path", [(_glm4v_attention, GLM4V), (_omni_audio_attention, OMNI_AUDIO)],
                         ids=["glm4v-qkv-rotary", "omni-audio-separate-proj"])
def test_patched_forward_equals_eager_split(build, path, attn_implementation):
    torch.manual_seed(0)
    module, args, kwargs = build(attn_implementation)
    with torch.no_grad():
        expected = module(*args, **kwargs)
        registry = Registry()
        register_patch("dynamo", path, registry=registry)(_patch_segmented_attention)
        with apply_patches(registry.patches("dynamo")) as fired:
            got = module(*args, **kwargs)
    assert fired.names() == [f"patch:dynamo:{path}"]
    expected = expected[0] if isinstance(expected, tuple) else expected
    got = got[0] if isinstance(got, tuple) else got
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() < 1e-5
    # not the same as attending over the whole sequence: the mask is doing the work
    with torch.no_grad():
        whole = module(args[0], torch.tensor([0, int(CU_SEQLENS[-1])], dtype=torch.int32), **kwargs)
    whole = whole[0] if isinstance(whole, tuple) else whole
    assert (whole - expected).abs().max().item() > 1e-3


def test_glm4v_vision_model_exports_and_matches_eager():
    from exporters import DynamoExporter
    from exporters.parity import assert_close
    from exporters.utils import flatten_outputs
    from sweeps.zoo import build_tiny

    tiny = build_tiny("Glm4vVisionModel")
    # two images of different sizes (32 and 16 patches) packed into one sequence
    inputs = dict(tiny.inputs, grid_thw=torch.tensor([[1, 4, 8], [1, 4, 4]]))
    assert inputs["hidden_states"].shape[0] == 48
    artifact = DynamoExporter().export(tiny.model, inputs)
    assert f"patch:dynamo:{GLM4V}" in artifact.workarounds_fired
    with torch.no_grad():
        expected = flatten_outputs(tiny.model(**inputs))
    assert_close(expected, artifact(**inputs), "dynamo")
