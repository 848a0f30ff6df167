"""The static encoder-decoder form's ``decoder_prompt`` component (exporters/generation/static_encdec.py): where a
decoder computes its prompt in one call otherwise than a token a call, the prompt runs in one call, as generate
runs it; where the two agree, the step stays the one program after the encoder."""

from __future__ import annotations

import pytest
import torch
from _tiny_fsmt import tiny_fsmt

from exporters.generation.capture import GenerationError


@pytest.fixture(scope="module")
def fsmt():
    """FSMT's decoder takes no mask with a cache: in one call it reads its prompt in both directions."""
    model, ids = tiny_fsmt()
    decoder = torch.randint(4, 64, (2, 4), generator=torch.Generator().manual_seed(2))
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "decoder_input_ids": decoder}


def _cache_gap(model, inputs, generator, new_tokens: int = 4) -> float:
    """The largest difference between eager generate's decoder self-attention cache and the static loop's, over
    the slots both wrote."""
    with torch.no_grad():
        eager = model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False, return_dict_in_generate=True)
    out = generator.generate(**inputs, max_new_tokens=new_tokens, return_dict_in_generate=True)
    assert torch.equal(out.sequences, eager.sequences)
    layers = eager.past_key_values.self_attention_cache.layers
    return max(float((out.cache[f"past_{i}_{part}"][..., :want.shape[-2], :] - want).abs().max())
               for i, layer in enumerate(layers) for part, want in (("key", layer.keys), ("value", layer.values)))


def test_a_decoder_that_reads_its_prompt_otherwise_in_one_call_gets_a_decoder_prompt_component(fsmt):
    from exporters import DynamoExporter

    model, inputs = fsmt
    exporter = DynamoExporter()
    whole = exporter.export_for_generation(model, inputs, cache="static", max_cache_len=16)
    assert list(whole.components) == ["encoder", "decoder_prompt", "step"]
    assert whole.state == "inputs" and whole.encoder["decoder_prompt_length"] == 5  # the start token and 4 given
    assert "decoder prompt (5 tokens)" in whole.metadata["prompt_component"]
    assert _cache_gap(model, inputs, whole) < 1e-5
    # prompt="step" keeps the one-token form, its cache in the program
    one = exporter.export_for_generation(model, inputs, cache="static", max_cache_len=16, prompt="step")
    assert list(one.components) == ["encoder", "step"] and one.state == "buffers"
    with pytest.raises(GenerationError, match=r"exported for 5 exactly"):
        whole.generate(**{**inputs, "decoder_input_ids": inputs["decoder_input_ids"][:, :3]}, max_new_tokens=2)


def test_the_one_token_prompt_is_measured_against_the_whole_prompt_call(fsmt):
    from transformers import BartConfig, BartForConditionalGeneration

    from exporters import DynamoExporter

    model, inputs = fsmt
    torch.manual_seed(0)
    bart = BartForConditionalGeneration(BartConfig(vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1,
                                                   encoder_attention_heads=4, decoder_attention_heads=4,
                                                   encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                                                   init_std=0.2)).eval()
    agreed = DynamoExporter().export_for_generation(bart, inputs, cache="static", max_cache_len=16)
    assert list(agreed.components) == ["encoder", "step"] and agreed.state == "buffers"
    assert "prompt_component" not in agreed.metadata and "decoder_prompt_length" not in agreed.encoder


def test_the_decoder_prompt_component_is_saved_and_loaded(fsmt, tmp_path):
    import json

    from exporters import DynamoExporter, load_generator

    model, inputs = fsmt
    generator = DynamoExporter().export_for_generation(model, inputs, cache="static", max_cache_len=16)
    generator.save(tmp_path)
    doc = json.loads((tmp_path / "generator.json").read_text())
    assert doc["components"] == ["encoder", "decoder_prompt", "step"] and doc["encoder"]["decoder_prompt_length"] == 5
    loaded = load_generator(tmp_path)
    assert torch.equal(loaded.generate(**inputs, max_new_tokens=4), generator.generate(**inputs, max_new_tokens=4))


def test_the_measurement_names_the_gap_where_the_forms_differ(fsmt):
    """In eager, over a twin step: FSMT's one-token prompt leaves its cache apart from the whole-prompt call's."""
    from exporters import DynamoExporter
    from exporters.generation.capture import capture_generate
    from exporters.generation.genai import model_patches
    from exporters.generation.static import CrossAttention, StaticStep
    from exporters.generation.static_encdec import one_token_prompt_differs

    model, inputs = fsmt
    calls, _, _ = capture_generate(model, inputs, 2)
    leaves, layout = calls[0].trees["encoder_outputs"]
    ids = calls[0].tensors["decoder_input_ids"]
    fixed = {**{f"encoder_outputs__{i}": leaf for i, leaf in enumerate(leaves)},
             "encoder_attention_mask": inputs["attention_mask"]}
    patches = model_patches(DynamoExporter())
    twin = StaticStep(model, 2, 16, "inputs", takes_positions=False, takes_mask=False,
                      cross=CrossAttention(layout, len(leaves), {"encoder_attention_mask": "attention_mask"}, fixed),
                      patches=patches).eval()
    why = one_token_prompt_differs(model, inputs, twin, ids, fixed, "dynamo", patches)
    assert why is not None and "the decoder prompt (5 tokens)" in why and "dynamo's tolerance" in why
    assert one_token_prompt_differs(model, inputs, twin, ids[:, :1], fixed, "dynamo", patches) is None  # one token
