"""A static cache whose layers are not all of the text's length (Mllama: its cross-attention layers hold the image's keys
and values, one slot a vision position, written at the prompt's call only, in layers generate's
``_prepare_static_cache`` sizes to the image): the static step reads each such layer's shapes off the model's own
static-cache generate (exporters/generation/static_calls.py ``fixed_layers``) and keeps it at that length
(static_layers.py), carried between the prompt component and the step as any other cache layer."""

from __future__ import annotations

import torch
from _generation_check import assert_teacher_forced_match, tiny_for_generate
from _written_cache import written_cache

from exporters import get_exporter
from exporters.generation.static_calls import fixed_layers


def _cache(written: dict[int, tuple[int, int]]):
    """A StaticCache of layers i -> (length, positions written), heads 2, head size 4, batch 1."""
    return written_cache(written.values(), value_size=3)


def test_a_layer_not_written_by_the_text_keeps_its_own_length():
    calls = [{"input_ids": torch.ones(1, 7, dtype=torch.long)}, {"input_ids": torch.ones(1, 1, dtype=torch.long)},
             {"input_ids": torch.ones(1, 1, dtype=torch.long)}]  # 9 tokens fed
    assert fixed_layers(_cache({0: (9, 9), 1: (68, 68), 2: (9, 9)}), calls) == {1: ((1, 2, 68, 4), (1, 2, 68, 3))}
    # generate's text layers may be longer than what it fed (a previous generate's max_cache_len): still the text's
    assert fixed_layers(_cache({0: (20, 9), 1: (68, 68)}), calls) == {1: ((1, 2, 68, 4), (1, 2, 68, 3))}
    # no layer counts the text's tokens: nothing to tell the text's layers by, so no layer is kept apart
    assert fixed_layers(_cache({0: (12, 11), 1: (68, 68)}), calls) == {}
    # every layer the text's
    assert fixed_layers(_cache({0: (9, 9), 1: (9, 9)}), calls) == {}


def test_mllama_static_generate_keeps_the_images_keys_and_values_in_layers_of_their_length():
    """Before: RuntimeError at export 'Attempting to broadcast a dimension of length 68 at -1! ... [2, 1, 7, 68] ...
    broadcastable to [2, 4, 7, 16]' (every step layer had max_cache_len slots; skips/export_skips.py's strict xfail).
    Now the cross-attention layer has the image's 68 slots, written by the prompt component and read by the step;
    tokens and teacher-forced logits equal eager's."""
    model, inputs = tiny_for_generate("MllamaForConditionalGeneration")
    generator = get_exporter("dynamo").export_for_generation(model, inputs, cache="static", max_cache_len=16)
    assert sorted(generator.components) == ["prompt", "step"]
    layout = generator.components["step"].extra_metadata["cache_layout"]
    cross = model.config.text_config.cross_attention_layers
    for i in range(model.config.text_config.num_hidden_layers):
        assert layout[f"past_{i}_key"][-2] == (68 if i in cross else 16), (i, layout)
    assert_teacher_forced_match(generator, model, inputs, 6)
