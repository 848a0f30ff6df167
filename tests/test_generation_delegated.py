"""export_for_generation of a model whose generate hands a sub-model's generate what it computed (Blip-2: the
image through the vision tower and Q-Former, merged into the language model's inputs_embeds; Blip: the image
embeddings as the text decoder's encoder_hidden_states): a handoff component, then the sub-model's own generation
export (exporters/generation/delegated.py), against eager ``model.generate(do_sample=False)``."""

from __future__ import annotations

import pytest
import torch

from exporters import get_exporter, load_generator
from exporters.generation import DelegatedGenerator, GenerationError
from exporters.generation.delegated import HANDOFF, find_delegate

NEW = 6


def _tiny(name: str):
    from sweeps.generate import generate_inputs
    from sweeps.runner import reference

    tiny = reference(name, init_range=0.2).tiny
    inputs = generate_inputs(tiny.inputs)
    inputs.pop("decoder_input_ids", None)  # a forward-only input generate refuses (sweeps.generate._eager_generate)
    return tiny.model, inputs


@pytest.fixture(scope="module")
def blip2():
    return _tiny("Blip2ForConditionalGeneration")


def _eager(model, inputs, **kw):
    with torch.no_grad():
        return model.generate(**inputs, max_new_tokens=NEW, do_sample=False, **kw)


def test_blip2_dynamic_cache_runs_the_handoff_then_the_language_model(blip2, tmp_path):
    model, inputs = blip2
    generator = get_exporter("dynamo").export_for_generation(model, inputs, get_exporter("dynamo").config_class(dynamic=True))
    assert isinstance(generator, DelegatedGenerator)
    assert list(generator.components) == [HANDOFF, "prefill", "decode"]
    # the handoff returns what Blip-2's generate computed (the merged embeddings); the ids and mask it hands on
    # unchanged are the caller's own
    assert generator.handoff.output_names == ["inputs_embeds"]
    assert generator.passthrough == {"attention_mask": "attention_mask", "input_ids": "input_ids"}
    # the language model's prefill takes the embeddings and no ids; the returned sequences start with the ids
    assert "inputs_embeds" in generator.inner.components["prefill"].input_names
    assert "input_ids" not in generator.inner.components["prefill"].input_names
    expected = _eager(model, inputs)
    assert len(set(expected[:, -NEW:].flatten().tolist())) >= 2
    assert torch.equal(generator.generate(**inputs, max_new_tokens=NEW), expected)
    generator.save(tmp_path)
    loaded = load_generator(tmp_path)
    assert isinstance(loaded, DelegatedGenerator)
    assert torch.equal(loaded.generate(**inputs, max_new_tokens=NEW), expected)
    with pytest.raises(GenerationError, match="missing \\['pixel_values'\\]"):
        generator.generate(**{k: v for k, v in inputs.items() if k != "pixel_values"}, max_new_tokens=NEW)
    with pytest.raises(GenerationError, match="runner"):
        generator.save(tmp_path / "runner", runner=True)


def test_blip2_static_cache_takes_the_prompt_as_embeddings(blip2):
    model, inputs = blip2
    generator = get_exporter("dynamo").export_for_generation(model, inputs, cache="static", max_cache_len=32)
    # no embed component: the handoff's inputs_embeds are the prompt's; new tokens through the embedding table
    assert list(generator.components) == [HANDOFF, "embed_tokens", "step"]
    assert torch.equal(generator.generate(**inputs, max_new_tokens=NEW), _eager(model, inputs))


def test_blip_hands_its_text_decoder_constants_the_loop_keeps():
    model, inputs = _tiny("BlipForConditionalGeneration")
    delegate = find_delegate(model, inputs)
    assert delegate.child == "text_decoder"
    assert delegate.constants() == {"eos_token_id": model.config.text_config.sep_token_id,
                                    "pad_token_id": model.config.text_config.pad_token_id}
    given = {k: v.clone() for k, v in inputs.items()}
    generator = get_exporter("dynamo").export_for_generation(model, inputs, get_exporter("dynamo").config_class(dynamic=True))
    # Blip's generate writes its bos id into input_ids in place: the export left the caller's tensors alone
    assert all(torch.equal(given[k], inputs[k]) for k in inputs)
    assert sorted(generator.handoff.output_names) == ["attention_mask", "encoder_attention_mask",
                                                      "encoder_hidden_states", "input_ids"]
    assert torch.equal(generator.generate(**inputs, max_new_tokens=NEW), _eager(model, {k: v.clone() for k, v in given.items()}))
    with pytest.raises(GenerationError, match="sets \\['eos_token_id'\\] itself"):
        generator.generate(**inputs, max_new_tokens=NEW, eos_token_id=3)


def test_a_model_running_its_own_forward_is_not_delegated():
    from _tiny_llama import tiny_llama

    model = tiny_llama()
    assert find_delegate(model, {"input_ids": torch.tensor([[3, 4, 5]])}) is None


class _Rewrites(torch.nn.Module):
    """A model whose generate hands a sub-model's generate its inputs and changes what it returns."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def generate(self, input_ids, **kwargs):
        return self.lm.generate(input_ids=input_ids, **kwargs)[:, 1:]


def test_a_generate_that_rewrites_the_sub_models_result_is_refused():
    from _tiny_llama import tiny_llama

    with pytest.raises(GenerationError, match="returns something else"):
        find_delegate(_Rewrites(tiny_llama()), {"input_ids": torch.tensor([[3, 4, 5]])})


def test_a_tampered_delegated_generator_json_is_refused_by_name(blip2, tmp_path):
    import json

    from exporters.loading import LoadError

    model, inputs = blip2
    generator = get_exporter("dynamo").export_for_generation(model, inputs, get_exporter("dynamo").config_class(dynamic=True))
    path = generator.save(tmp_path)
    doc = json.load(open(path))
    doc["delegated"]["passthrough"] = {"input_ids": "labels"}
    json.dump(doc, open(path, "w"))
    with pytest.raises(LoadError, match="passes on \\['labels'\\], which the handoff component does not take"):
        load_generator(tmp_path)
