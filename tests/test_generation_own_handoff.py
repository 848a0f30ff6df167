"""export_for_generation of a model whose generate override runs Python over the caller's tensors and hands the generic
loop (``super().generate``) tensors it computed: a ``handoff`` component (the override up to that call) and the
model's generic generate captured as usual (exporters/generation/delegated.py, ``GENERIC``). Pop2Piano prepends a
composer embedding to input_features and hands the result on as inputs_embeds; checked against eager
``model.generate(do_sample=False)``."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from exporters import get_exporter, load_generator
from exporters.generation import DelegatedGenerator, GenerationError
from exporters.generation.delegated import GENERIC, HANDOFF, HandoffComponent, find_delegate

NEW = 6


class _ScaledEmbeds(LlamaForCausalLM):
    """Its generate embeds the ids, scales them by a plain argument and hands the generic loop the embeddings."""

    def generate(self, input_ids, attention_mask=None, scale: float = 2.0, **kwargs):
        embeds = self.get_input_embeddings()(input_ids) * scale
        return super().generate(inputs_embeds=embeds, attention_mask=attention_mask, **kwargs)


class _PassesOn(LlamaForCausalLM):
    """Its generate hands the generic loop the caller's inputs unchanged (GraniteSpeech's, Kyutai's)."""

    def generate(self, *args, **kwargs):
        return super().generate(*args, **kwargs)


def _llama(cls):
    from _tiny_llama import tiny_llama

    base = tiny_llama()
    model = cls(base.config).eval()
    model.load_state_dict(base.state_dict())
    return model


def _eager(model, inputs, **kw):
    with torch.no_grad():
        return model.generate(**inputs, max_new_tokens=NEW, do_sample=False, **kw)


PROMPT = {"input_ids": torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10]]), "attention_mask": torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])}


def test_an_override_handing_the_generic_loop_computed_embeddings_gets_a_handoff_component():
    model = _llama(_ScaledEmbeds)
    delegate = find_delegate(model, PROMPT)
    assert delegate.child == GENERIC
    assert delegate.computed() == ["inputs_embeds"]
    assert delegate.passthrough == {"attention_mask": "attention_mask"}
    assert delegate.arguments == {"scale": 2.0}
    exporter = get_exporter("dynamo")
    generator = exporter.export_for_generation(model, PROMPT, exporter.config_class(dynamic=True))
    assert isinstance(generator, DelegatedGenerator)
    assert list(generator.components) == [HANDOFF, "prefill", "decode"]
    assert generator.handoff.extra_metadata["arguments"] == {"scale": 2.0}
    expected = _eager(model, PROMPT)
    assert len(set(expected.flatten().tolist())) >= 2
    assert torch.equal(generator.generate(**PROMPT, max_new_tokens=NEW), expected)
    assert torch.equal(generator.generate(**PROMPT, max_new_tokens=NEW, scale=2.0), expected)  # the one it fixed
    with pytest.raises(GenerationError, match="exported with \\{'scale': 2.0\\}"):
        generator.generate(**PROMPT, max_new_tokens=NEW, scale=3.0)
    # the export left the class's generate and the generic loop as they were
    assert type(model).generate is _ScaledEmbeds.generate and "generate" not in vars(model)


def test_a_plain_argument_given_at_export_is_fixed_in_the_handoff(tmp_path):
    model = _llama(_ScaledEmbeds)
    exporter = get_exporter("dynamo")
    generator = exporter.export_for_generation(model, {**PROMPT, "scale": 3.0}, exporter.config_class(dynamic=True))
    expected = _eager(model, PROMPT, scale=3.0)
    assert not torch.equal(expected, _eager(model, PROMPT))
    assert torch.equal(generator.generate(**PROMPT, max_new_tokens=NEW), expected)
    generator.save(tmp_path)
    loaded = load_generator(tmp_path)
    assert loaded.arguments == {"scale": 3.0}
    assert torch.equal(loaded.generate(**PROMPT, max_new_tokens=NEW), expected)


def test_an_override_passing_the_callers_inputs_on_is_captured_as_it_is():
    assert find_delegate(_llama(_PassesOn), PROMPT) is None


@pytest.fixture(scope="module")
def pop2piano():
    from sweeps.generate import generate_inputs
    from sweeps.runner import SEED, reference
    from sweeps.zoo import generate_setup

    tiny = reference("Pop2PianoForConditionalGeneration", init_range=0.2).tiny
    inputs, _ = generate_setup(tiny, seed=SEED)  # the composer table the checkpoints' generation_config.json has
    tiny.model.generation_config.decoder_start_token_id = 0  # the tiny config names none (sweeps.generate.build_for_generate)
    return tiny.model, generate_inputs(inputs)


def test_pop2piano_hands_its_composer_conditioned_features_to_the_generic_loop(pop2piano, tmp_path):
    model, inputs = pop2piano
    config = model.generation_config.to_dict()
    exporter = get_exporter("dynamo")
    generator = exporter.export_for_generation(model, inputs, exporter.config_class(dynamic=True))
    assert model.generation_config.to_dict() == config  # its generate updates the config with its kwargs: put back
    assert list(generator.components) == [HANDOFF, "encoder", "prefill", "decode"]
    assert generator.handoff.output_names == ["inputs_embeds"]
    assert generator.handoff.input_names == ["input_features", "decoder_input_ids"]
    assert generator.arguments == {"composer": "composer1"}
    expected = _eager(model, inputs)
    assert torch.equal(generator.generate(**inputs, max_new_tokens=NEW), expected)
    generator.save(tmp_path)
    assert torch.equal(load_generator(tmp_path).generate(**inputs, max_new_tokens=NEW), expected)
    # the handoff is the override's own Python: another composer, another embedding in front of the features
    features = inputs["input_features"]
    for composer in ("composer1", "composer2"):
        want, _ = model.get_mel_conditioner_outputs(features, composer, model.generation_config)
        got = HandoffComponent(model, GENERIC, ["inputs_embeds"], {"composer": composer})(**inputs)["inputs_embeds"]
        assert torch.equal(got, want)


def test_pop2piano_static_cache(pop2piano):
    model, inputs = pop2piano
    generator = get_exporter("dynamo").export_for_generation(model, inputs, cache="static", max_cache_len=16)
    assert list(generator.components) == [HANDOFF, "encoder", "step"]
    assert torch.equal(generator.generate(**inputs, max_new_tokens=NEW), _eager(model, inputs))
