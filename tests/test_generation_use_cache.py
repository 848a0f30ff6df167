"""A model whose generation config turns ``use_cache`` off (Pix2Struct's text config, Mpt's, Evolla's): its
``generate(cache_implementation='static')`` keeps no cache, so the static form's capture asks generate for one
(``use_cache=True``, exporters.generation.capture.static_cache_asked), records that in the generator's metadata,
and leaves the model's config and generation config as they were. The artifacts are checked against the
model's default, uncached generate."""

from __future__ import annotations

import torch
from _tiny_llama import tiny_llama

from exporters import get_exporter
from exporters.generation import StaticGenerator


def _tiny_pix2struct():
    from transformers import (
        Pix2StructConfig,
        Pix2StructForConditionalGeneration,
        Pix2StructTextConfig,
        Pix2StructVisionConfig,
    )

    torch.manual_seed(0)
    text = Pix2StructTextConfig(vocab_size=48, hidden_size=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2,
                                initializer_factor=4.0)
    vision = Pix2StructVisionConfig(hidden_size=16, patch_embed_hidden_size=16, d_ff=32, d_kv=8, num_hidden_layers=1,
                                    num_attention_heads=2, initializer_factor=4.0)
    config = Pix2StructConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), initializer_factor=4.0)
    model = Pix2StructForConditionalGeneration(config).eval()
    batch, patches = 2, 6
    rows = torch.arange(1, patches + 1, dtype=torch.float32)[None, :, None].expand(batch, patches, 1)
    flattened = torch.cat([rows, torch.ones(batch, patches, 1), torch.randn(batch, patches, 16)], dim=-1)
    return model, {"flattened_patches": flattened, "attention_mask": torch.ones(batch, patches, dtype=torch.long)}


def _eager(model, inputs, new):
    with torch.no_grad():
        return model.generate(**inputs, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                              return_dict_in_generate=True, output_logits=True)


def test_an_encoder_decoder_whose_config_keeps_no_cache_gets_a_static_cache():
    """Pix2Struct: before, 'generate passes its decoder no past_key_values' (no one-token decoder call over a
    cache to read the step from). Its decoder builds its own mask over past + 1 positions, padded to the static
    cache's length from the traced cache position (exporters/workarounds/models/padding_mask.py)."""
    model, inputs = _tiny_pix2struct()
    assert model.generation_config.use_cache is False
    eager = _eager(model, inputs, 8)
    assert eager.past_key_values is None  # the reference is the model's own generate, uncached
    generator = get_exporter("dynamo").export_for_generation(model, inputs, cache="static", max_cache_len=16)
    assert isinstance(generator, StaticGenerator) and sorted(generator.components) == ["encoder", "step"]
    assert "use_cache=True" in generator.metadata["use_cache_asked"]
    assert model.generation_config.use_cache is False and model.config.text_config.use_cache is False  # unchanged
    new = eager.sequences[:, 1:]
    forced = generator.generate(**inputs, max_new_tokens=8, teacher_tokens=new, return_dict_in_generate=True,
                                output_logits=True)
    for want, got in zip(eager.logits, forced.logits, strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert torch.equal(generator.generate(**inputs, max_new_tokens=8), eager.sequences)
    assert len(set(new.flatten().tolist())) > 1, "degenerate tiny model"  # context-dependent: the logits, checked above


def test_a_decoder_whose_config_keeps_no_cache_gets_a_cache_step():
    """A decoder-only model with use_cache=False: before, the whole-sequence step (its generate re-reads the
    sequence); now a one-token step over a static cache, matching its default, uncached generate."""
    model = tiny_llama()
    model.generation_config.use_cache = False
    ids = torch.randint(3, 64, (2, 5), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    eager = _eager(model, inputs, 8)
    generator = get_exporter("dynamo").export_for_generation(model, inputs, cache="static", max_cache_len=16)
    assert generator.cache_shapes, "a step over a static cache, not the whole-sequence step"
    assert "use_cache=True" in generator.metadata["use_cache_asked"]
    assert model.generation_config.use_cache is False
    assert torch.equal(generator.generate(ids, mask, max_new_tokens=8), eager.sequences)
