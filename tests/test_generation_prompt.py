"""The static form's prompt component (exporters/generation/static_prefill.py): the model's own forward over the
whole prompt writes the cache the step then reads, where the step's own prompt would not compute what eager
``generate`` computes."""

from __future__ import annotations

import pytest
import torch
from _generation_check import eager_generate as _eager
from _generation_check import tiny_for_generate as _tiny

from exporters import get_exporter, load_generator
from exporters.generation import GenerationError, StaticGenerator


def test_a_decoder_that_merges_the_image_itself_gets_a_prompt_component(tmp_path):
    """Chameleon's decoder turns the image into VQ tokens itself, so no step over embeddings can stand in for it
    (before: an xfail, 'hands its decoder ... no inputs_embeds'). The prompt component takes the image with the
    prompt; the step goes on over token ids, the cache passing between them as inputs and outputs. Tokens and
    teacher-forced logits equal eager's, also after a save and load; the fixed prompt length and the image input are
    named when wrong."""
    model, inputs = _tiny("ChameleonForConditionalGeneration")
    generator = get_exporter("dynamo").export_for_generation(model, inputs, cache="static", max_cache_len=40)
    assert sorted(generator.components) == ["prompt", "step"]
    assert generator.state == "inputs"
    assert "no step over embeddings" in generator.metadata["prompt_component"]
    assert "pixel_values" in generator.components["prompt"].input_names
    assert "pixel_values" not in generator.components["step"].input_names
    eager = _eager(model, inputs, 8)
    out = generator.generate(**inputs, max_new_tokens=8, teacher_tokens=eager.sequences[:, -8:],
                             return_dict_in_generate=True, output_logits=True)
    for want, got in zip(eager.logits, out.logits, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        expected = model.generate(**inputs, max_new_tokens=8, do_sample=False)  # free-running, ends at eos
    assert torch.equal(generator.generate(**inputs, max_new_tokens=8), expected)
    generator.save(tmp_path)
    assert torch.equal(load_generator(tmp_path).generate(**inputs, max_new_tokens=8), expected)
    with pytest.raises(GenerationError, match=r"takes \['pixel_values'\] with the prompt \(the prompt component's inputs"):
        generator.generate(inputs["input_ids"], inputs["attention_mask"], max_new_tokens=2)
    shorter = {**inputs, "input_ids": inputs["input_ids"][:, 1:], "attention_mask": inputs["attention_mask"][:, 1:]}
    with pytest.raises(GenerationError, match=r"dim 1 \(prompt\) is \d+; this generator's prompt component was "
                                              r"exported for a prompt of \d+ tokens exactly"):
        generator.generate(**shorter, max_new_tokens=2)


def test_a_state_space_prompt_path_unlike_its_one_token_path_gets_a_prompt_component():
    """NemotronH's Mamba2 mixer clamps dt in its chunked prompt scan and not in its one-token update: fed the prompt
    one token a call, the step's first logits are 2e-3 from eager generate's (the xfail before). Measured at export,
    the prompt component is chosen, and the logits of every step then match eager's at dynamo's tolerance."""
    model, inputs = _tiny("NemotronHForCausalLM")
    generator = get_exporter("dynamo").export_for_generation(model, inputs, cache="static", max_cache_len=24)
    assert sorted(generator.components) == ["prompt", "step"]
    assert "fed one token a call" in generator.metadata["prompt_component"]
    eager = _eager(model, inputs, 8)
    out = generator.generate(**inputs, max_new_tokens=8, teacher_tokens=eager.sequences[:, -8:],
                             return_dict_in_generate=True, output_logits=True)
    for want, got in zip(eager.logits, out.logits, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # prompt="step" keeps the one program ExecuTorch's LLM runner loads, its prompt fed one token a call
    runner_form = get_exporter("dynamo").export_for_generation(model, inputs, cache="static", max_cache_len=24,
                                                               prompt="step")
    assert list(runner_form.components) == ["step"] and runner_form.token_by_token
    with pytest.raises(GenerationError, match=r"prompt='whole'.*\('auto', 'step'\)"):
        get_exporter("dynamo").export_for_generation(model, inputs, cache="static", prompt="whole")


def test_a_hybrid_whose_one_token_path_agrees_keeps_its_one_program_step():
    """Qwen3-Next's gated delta rule computes the prompt one token a call as its prompt path does: no prompt
    component, and the step keeps its cache in its own buffers (the form ExecuTorch's LLM runner loads)."""
    from _tiny_hybrid import tiny_qwen3_next

    model = tiny_qwen3_next()
    generator = get_exporter("dynamo").export_for_generation(
        model, {"input_ids": torch.randint(3, 64, (1, 5))}, cache="static", max_cache_len=24)
    assert list(generator.components) == ["step"]
    assert generator.state == "buffers" and generator.token_by_token


def test_a_padded_prompt_over_linear_attention_states_goes_through_the_prompt_component():
    """One token a call, left padding would reach a hybrid's recurrent states (the loop refuses it by name); the
    prompt component runs the model's prompt path, which zeroes the padded positions: tokens as eager's."""
    from _tiny_hybrid import tiny_qwen3_next

    model = tiny_qwen3_next()
    ids = torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    generator = get_exporter("dynamo").export_for_generation(model, {"input_ids": ids, "attention_mask": mask},
                                                             cache="static", max_cache_len=24)
    assert sorted(generator.components) == ["prompt", "step"]
    assert generator.metadata["prompt_component"].startswith("a padded prompt")
    with torch.no_grad():
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    assert torch.equal(generator.generate(ids, mask, max_new_tokens=8), expected)


class _Program:
    backend = "executorch"
    input_names = ["input_ids", "cache_position", "past_0_key"]
    metadata: dict = {}


def test_the_runner_folder_refuses_a_prompt_component(tmp_path):
    generator = StaticGenerator({"prompt": _Program(), "step": _Program()}, batch=1, max_cache_len=8, state="inputs",
                                cache_shapes={"past_0_key": (1, 1, 8, 4)}, takes_positions=False, takes_mask=False,
                                generation={}, metadata={"prompt_component": "because", "vocab_size": 64},
                                prompt_inputs=[])
    with pytest.raises(GenerationError, match="a prompt component writes the cache the step reads"):
        generator.save(tmp_path, runner=True)
    assert not list(tmp_path.iterdir())
