"""exporters/workarounds/models/longformer.py: Longformer/LED global attention with static shapes.

The patched attention must compute what eager computes with no, some and uneven global tokens and
with padding; a Longformer with global tokens must export to dynamo and ONNX and match eager (the
ONNX artifact also needs the chunking patch: ``as_strided`` over a non-contiguous view came out
wrong); the question-answering head must find its question end without ``nonzero``.
"""

from __future__ import annotations

import pytest
import torch

from exporters import ExportStageError, get_exporter
from exporters.parity import assert_close
from exporters.utils import DEFAULT_REGISTRY, Registry, apply_patches, flatten_outputs
from exporters.workarounds.models.longformer import GLOBAL_ATTENTION_PATHS


def _longformer(cls_name="LongformerModel"):
    # initializer_range 0.3: peaked attention, so that global tokens visibly change the result
    import transformers

    config = transformers.LongformerConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                           intermediate_size=37, attention_window=4, max_position_embeddings=64, initializer_range=0.3,
                                           sep_token_id=2)
    torch.manual_seed(0)
    return getattr(transformers, cls_name)(config).eval()


def _led():
    import transformers

    config = transformers.LEDConfig(vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=1,
                                    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=37,
                                    decoder_ffn_dim=37, attention_window=4, max_encoder_position_embeddings=64,
                                    max_decoder_position_embeddings=64, init_std=0.3)
    torch.manual_seed(0)
    return transformers.LEDModel(config).eval()


def _inputs(global_positions):
    ids = torch.randint(3, 100, (2, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[1, 8:] = 0  # padding in the second row
    glob = torch.zeros(2, 11, dtype=torch.long)
    for row, cols in enumerate(global_positions):
        glob[row, cols] = 1
    return {"input_ids": ids, "attention_mask": mask, "global_attention_mask": glob}


GLOBALS = {"none": ([], []), "uneven": ([0, 5], [2]), "one_row": ([0], [])}


def test_registered_for_longformer_and_led():
    names = {e.name for e in DEFAULT_REGISTRY.patches("dynamo")}
    assert {f"patch:dynamo:{p}" for p in GLOBAL_ATTENTION_PATHS} <= names


@pytest.mark.parametrize("build", [_longformer, _led], ids=["longformer", "led"])
@pytest.mark.parametrize("globals_", list(GLOBALS.values()), ids=list(GLOBALS))
def test_patched_attention_equals_eager(build, globals_):
    model, inputs = build(), _inputs(globals_)
    with torch.no_grad():
        expected = flatten_outputs(model(**inputs))
        with apply_patches(DEFAULT_REGISTRY.patches("dynamo")) as fired:
            got = flatten_outputs(model(**inputs))
    assert any("SelfAttention.forward" in name for name in fired.names())
    assert_close(expected, got, "dynamo")
    if globals_ == GLOBALS["none"]:  # the original's window-only softmax: equal bit for bit, not just within tolerance
        assert all(torch.equal(expected[k], got[k]) for k in expected), {
            k: (expected[k] - got[k]).abs().max().item() for k in expected}
    if globals_ != GLOBALS["none"]:  # the global tokens change the result: the masks are doing the work
        with torch.no_grad():
            plain = flatten_outputs(model(**dict(inputs, global_attention_mask=torch.zeros_like(inputs["input_ids"]))))
        assert (plain["last_hidden_state"] - got["last_hidden_state"]).abs().max() > 1e-3


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_longformer_with_global_tokens_exports_and_matches_eager(backend):
    model, inputs = _longformer(), _inputs(GLOBALS["uneven"])
    with pytest.raises(ExportStageError, match="data-dependent"):
        get_exporter(backend, registry=Registry()).export(model, inputs)
    artifact = get_exporter(backend).export(model, inputs)
    with torch.no_grad():
        expected = flatten_outputs(model(**inputs))
    assert_close(expected, artifact(**inputs), backend)


def test_question_answering_finds_the_question_end_without_nonzero():
    model = _longformer("LongformerForQuestionAnswering")
    ids = torch.tensor([[5, 6, 7, 2, 2, 8, 9, 10, 11, 2], [5, 2, 2, 6, 7, 8, 9, 10, 11, 2]])  # questions of 3 and 1
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    artifact = get_exporter("dynamo").export(model, inputs)
    assert "patch:dynamo:transformers.models.longformer.modeling_longformer._get_question_end_index" in artifact.workarounds_fired
    with torch.no_grad():
        expected = flatten_outputs(model(**inputs))
    assert_close(expected, artifact(**inputs), "dynamo")
