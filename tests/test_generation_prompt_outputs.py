"""A generate that hands its calls after the prompt's what the prompt call returned (Idefics: the prompt call's
image_hidden_states, given back as image_encoder_embeddings at every later call): the static form's prompt component
returns those outputs, the step takes them at every call, and the loop hands them on (exporters/generation/
static_calls.py ``from_prompt``, static_prefill.py, static_loop.py)."""

from __future__ import annotations

import pytest
import torch
from _generation_check import assert_teacher_forced_match, tiny_for_generate

from exporters import get_exporter, load_generator
from exporters.generation import GenerationError
from exporters.generation.static_calls import Seen, fixed_constants, from_prompt, per_token_extras


def _calls():
    """Three calls as generate makes them over a static cache: the prompt (pixels, a [batch, S, images] mask),
    then one token a call with the prompt's output handed back and the mask's last row."""
    hidden = torch.randn(2, 1, 5, 4)
    mask = torch.tensor([[[0], [1], [1]], [[1], [1], [1]]])
    prompt = {"input_ids": torch.ones(2, 3, dtype=torch.long), "pixel_values": torch.randn(2, 1, 3, 8, 8),
              "image_attention_mask": mask, "interpolate_pos_encoding": True}
    later = [{"input_ids": torch.ones(2, 1, dtype=torch.long), "image_attention_mask": mask[:, -1:],
              "image_encoder_embeddings": hidden.clone(), "interpolate_pos_encoding": True} for _ in range(2)]
    seen = Seen(plain=[{"interpolate_pos_encoding": False, "use_cache": True}] * 3,
                outputs=[{"logits": torch.randn(2, 1, 7), "image_hidden_states": hidden}] * 3)
    return [prompt, *later], seen


def test_an_input_of_later_calls_is_read_as_the_prompt_calls_output():
    calls, seen = _calls()
    assert from_prompt("M", calls, seen) == {"image_encoder_embeddings": "image_hidden_states"}
    # the plain value as generate passed it (the calls record every plain value as True)
    assert fixed_constants(calls, seen) == {"interpolate_pos_encoding": False}
    assert per_token_extras(calls) == {"image_attention_mask": "repeat_last_row"}
    calls[2]["image_encoder_embeddings"] = calls[2]["image_encoder_embeddings"] + 1  # not the prompt's output
    with pytest.raises(GenerationError, match=r"passes 'image_encoder_embeddings' to its forward calls after the "
                                              r"prompt's and not to the prompt's, and it is not one of the prompt "
                                              r"call's outputs \(\['image_hidden_states', 'logits'\]\)"):
        from_prompt("M", calls, seen)


def test_idefics_static_generate_hands_the_prompts_image_hidden_states_to_every_step(tmp_path):
    """Before: GenerationError 'generate with a static cache passes [image_attention_mask, interpolate_pos_encoding]
    to forward' (skips/export_skips.py's strict xfail). Now the prompt component returns image_hidden_states, the
    step takes it as image_encoder_embeddings; tokens and teacher-forced logits equal eager's, also after a save
    and load, and the metadata records the handoff and the baked constant."""
    model, inputs = tiny_for_generate("IdeficsForVisionText2Text")
    generator = get_exporter("dynamo").export_for_generation(model, inputs, cache="static", max_cache_len=16)
    assert sorted(generator.components) == ["prompt", "step"]
    assert generator.metadata["prompt_outputs"] == {"image_encoder_embeddings": "image_hidden_states"}
    assert generator.metadata["baked_constants"] == {"interpolate_pos_encoding": False}
    assert generator.extras == {"image_attention_mask": "repeat_last_row"}
    assert "image_hidden_states" in generator.components["prompt"].output_names
    assert "image_encoder_embeddings" in generator.components["step"].input_names
    assert "pixel_values" not in generator.components["step"].input_names
    eager = assert_teacher_forced_match(generator, model, inputs, 6)
    generator.save(tmp_path)
    assert torch.equal(load_generator(tmp_path).generate(**inputs, max_new_tokens=6), eager.sequences)
