"""A decoder-only model whose generate passes tensors unchanged to every forward call (Blip's text decoder: the
image's encoder_hidden_states and encoder_attention_mask): the static step takes them at every call
(exporters/generation/static.py ``same``), the loop feeds them, the folder keeps their names. And Blip's text
decoder over a static cache keeps the cross-attention keys apart (exporters/workarounds/models/blip_text.py)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def tiny():
    from transformers import BlipTextConfig
    from transformers.models.blip.modeling_blip_text import BlipTextLMHeadModel

    torch.manual_seed(0)
    config = BlipTextConfig(vocab_size=64, hidden_size=32, encoder_hidden_size=16, intermediate_size=64,
                            num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
                            bos_token_id=1, eos_token_id=2, pad_token_id=0, sep_token_id=2, initializer_range=0.5)
    model = BlipTextLMHeadModel(config).eval()
    for module in model.modules():  # context-dependent tokens at random weights
        if isinstance(module, torch.nn.Linear):
            torch.nn.init.normal_(module.weight, std=0.5)
    g = torch.Generator().manual_seed(1)
    inputs = {"input_ids": torch.randint(3, 64, (2, 5), generator=g), "attention_mask": torch.ones(2, 5, dtype=torch.long),
              "encoder_hidden_states": torch.randn(2, 6, 16, generator=g),
              "encoder_attention_mask": torch.ones(2, 6, dtype=torch.long)}
    return model, inputs


def _eager(model, inputs, **kwargs):
    with torch.no_grad():
        return model.generate(**inputs, max_new_tokens=6, do_sample=False, return_dict_in_generate=True,
                              output_logits=True, eos_token_id=None, **kwargs)


def test_the_patch_keeps_a_static_caches_slots_for_the_text(tiny, monkeypatch):
    from transformers.models.blip import modeling_blip_text

    from exporters.workarounds.models.blip_text import _patch_blip_text_static_cache

    model, inputs = tiny
    with pytest.raises(IndexError):  # the image's keys written into the text's slots (the defect)
        _eager(model, inputs, cache_implementation="static")
    want = _eager(model, inputs)
    patched = _patch_blip_text_static_cache(modeling_blip_text.BlipTextEncoder.forward)
    monkeypatch.setattr(modeling_blip_text.BlipTextEncoder, "forward", patched)
    got = _eager(model, inputs, cache_implementation="static")
    assert torch.equal(got.sequences, want.sequences)
    for g, w in zip(got.logits, want.logits, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_the_static_step_takes_generates_unchanged_inputs_at_every_call(tiny, tmp_path):
    from exporters import DynamoConfig, DynamoExporter, load_generator
    from exporters.generation.capture import GenerationError

    model, inputs = tiny
    want = _eager(model, inputs)
    generator = DynamoExporter().export_for_generation(model, inputs, DynamoConfig(), cache="static", max_cache_len=16)
    assert generator.same_inputs == ["encoder_attention_mask", "encoder_hidden_states"]
    assert {"encoder_hidden_states", "encoder_attention_mask"} <= set(generator.components["step"].input_names)
    new = want.sequences.shape[1] - inputs["input_ids"].shape[1]
    got = generator.generate(**inputs, max_new_tokens=new, eos_token_id=None)
    assert torch.equal(got, want.sequences)
    generator.save(tmp_path / "g")
    loaded = load_generator(tmp_path / "g")
    assert loaded.same_inputs == generator.same_inputs
    assert torch.equal(loaded.generate(**inputs, max_new_tokens=new, eos_token_id=None), want.sequences)
    without = {k: v for k, v in inputs.items() if k != "encoder_hidden_states"}
    with pytest.raises(GenerationError, match="encoder_hidden_states"):
        generator.generate(**without, max_new_tokens=2)
