"""Two things the static step handles since 2026-12-05, each checked on the model kind that failed without
it (both tests fail at 705c599, before the change).

- A sparse-attention indexer's keys (StaticIndexedLayer, DeepSeek-V3.2 DSA) are a cache part of the step,
  written at cache_position like keys and values (before: the step refused the layer by name).
- Positions built from the cache's length (``torch.arange(past, past + S)``: RoFormer's sinusoidal
  positions) lower on ExecuTorch: while traced, get_seq_length answers with one bounded int, not the
  StaticLayer's 0-d tensor read twice as two unbacked ints (before: "Cannot evaluate a finite upper bound
  for symbolic expression -u24 + u25" in memory planning).
"""

from __future__ import annotations

import pytest
import torch

from exporters import get_exporter


def _tiny(class_name: str, init_range: float = 0.2):
    from sweeps.zoo import build_tiny

    return build_tiny(class_name, check=False, init_range=init_range).model


def _prompt(seed: int, length: int = 6, vocab: int = 64):
    return torch.randint(3, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


def test_indexer_keys_are_a_step_cache_part():
    model = _tiny("DeepseekV32ForCausalLM")
    ids = _prompt(0)
    generator = get_exporter("dynamo").export_for_generation(model, {"input_ids": ids}, cache="static", max_cache_len=24)
    indexer = {k: v for k, v in generator.cache_shapes.items() if k.endswith("_indexer_key")}
    assert indexer, f"no indexer keys among the step's cache parts: {sorted(generator.cache_shapes)}"
    assert all(shape[1] == 24 for shape in indexer.values()), indexer  # [batch, max_cache_len, index_head_dim]
    for seed in (1, 2):  # the second generate reuses the slots the first one wrote
        ids = _prompt(seed)
        with torch.no_grad():
            expected = model.generate(ids, max_new_tokens=8, do_sample=False)
        assert generator.generate(ids, max_new_tokens=8).tolist() == expected.tolist()


def test_positions_from_the_cache_length_lower_on_executorch():
    pytest.importorskip("executorch")
    model = _tiny("RoFormerForCausalLM")
    ids = _prompt(0, vocab=model.config.vocab_size)
    # batch 1, no mask: the form ExecuTorch's LLM runner loads, where RoFormer's step failed to lower
    generator = get_exporter("executorch").export_for_generation(model, {"input_ids": ids}, cache="static",
                                                                 max_cache_len=24)
    assert list(generator.components["step"].input_names) == ["input_ids", "cache_position"]
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert generator.generate(ids, max_new_tokens=8).tolist() == expected.tolist()


def test_an_empty_argument_generate_passes_is_no_step_input():
    """A multimodal model's generate passes mm_encoder_outputs={} with a text-only prompt (no modality encoded):
    the forward reads it as absent, so the step takes tokens (the runner form ExecuTorch's LLM runner loads),
    not embeddings."""
    from exporters.generation.static import static_step_for
    from sweeps.zoo import build_tiny

    model = build_tiny("Gemma3ForConditionalGeneration", seed=0).model
    step = static_step_for(model, {"input_ids": torch.tensor([[5, 9, 17, 30]])}, 16, "buffers")
    assert not step.embeds and step.runner_form


def test_a_decoder_that_embeds_itself_is_named_not_crashed_on():
    """A multimodal model whose get_decoder() is given token ids and pixels (Chameleon: its ChameleonModel turns the
    image into VQ token ids itself) has no embeddings to hand a step over embeddings: a GenerationError names the
    decoder and what it was given, instead of an IndexError from the stand-in's empty output."""
    import pytest
    import torch
    from transformers.modeling_outputs import BaseModelOutputWithPast

    from exporters.generation.capture import GenerationError
    from exporters.generation.static_embeds import PrefillEmbeds

    class Decoder(torch.nn.Module):
        def forward(self, input_ids=None, pixel_values=None, **kwargs):
            return BaseModelOutputWithPast(last_hidden_state=torch.zeros(1, input_ids.shape[1], 4))

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Decoder()

        def get_decoder(self):
            return self.model

        def forward(self, input_ids, pixel_values, use_cache=False):
            return self.model(input_ids=input_ids, pixel_values=pixel_values)[0]

    embeds = PrefillEmbeds(Model(), "model")
    with pytest.raises(GenerationError, match=r"hands its decoder Decoder no inputs_embeds \(it is given \['input_ids', "
                                              r"'pixel_values'\]\)"):
        embeds(input_ids=torch.ones(1, 3, dtype=torch.long), pixel_values=torch.zeros(1, 3, 2, 2))
