"""The static encoder-decoder step's inputs: what generate passes every decoder call unchanged is an input of
the step; a tensor it passes to some calls only is left out where the decoder calls do not read it (Udop's and
T5Gemma2's pixel_values, read only by the encoder they skip given encoder_outputs), and refused by name where
they do."""

from __future__ import annotations

import pytest
import torch

from exporters.generation.capture import GenerationError, _split
from exporters.generation.static_encdec import decoder_reads, same_inputs


class _Model(torch.nn.Module):
    """A decoder over its encoder's output; ``reads_pixels``: whether the decoder call adds the pixels' mean."""

    def __init__(self, reads_pixels: bool):
        super().__init__()
        self.reads_pixels = reads_pixels

    def forward(self, decoder_input_ids, encoder_outputs, pixel_values=None, attention_mask=None, use_cache=None,
                return_dict=None):
        logits = encoder_outputs[0].sum(1, keepdim=True) + decoder_input_ids.float()[..., None]
        if self.reads_pixels and pixel_values is not None:
            logits = logits + pixel_values.mean()
        from transformers.modeling_outputs import Seq2SeqLMOutput

        return Seq2SeqLMOutput(logits=logits)


def _calls():
    encoded = (torch.randn(1, 4, 3),)
    mask = torch.ones(1, 4, dtype=torch.long)
    first = _split({"decoder_input_ids": torch.tensor([[0]]), "encoder_outputs": encoded, "attention_mask": mask,
                    "pixel_values": torch.randn(1, 3, 2, 2), "use_cache": True})
    later = _split({"decoder_input_ids": torch.tensor([[5]]), "encoder_outputs": encoded, "attention_mask": mask,
                    "use_cache": True})
    return [first, later], {"attention_mask": mask, "input_ids": torch.ones(1, 4, dtype=torch.long)}


def test_a_tensor_only_the_first_call_gets_is_left_out_where_the_decoder_does_not_read_it():
    calls, given = _calls()
    model = _Model(reads_pixels=False)
    assert not decoder_reads(model, calls, "pixel_values")
    same = same_inputs("M", calls, given, reads=lambda name: decoder_reads(model, calls, name))
    assert same == {"encoder_attention_mask": "attention_mask"}


def test_a_tensor_the_decoder_reads_is_refused_by_name():
    calls, given = _calls()
    model = _Model(reads_pixels=True)
    assert decoder_reads(model, calls, "pixel_values")
    with pytest.raises(GenerationError, match="passes 'pixel_values' to its decoder calls, changed from call to call"):
        same_inputs("M", calls, given, reads=lambda name: decoder_reads(model, calls, name))
    with pytest.raises(GenerationError, match="'pixel_values'"):  # without the check, refused as before
        same_inputs("M", calls, given)


def test_the_decoder_prompt_rule_reads_how_generate_started_the_decoder():
    """T5 and Bart start the decoder with the start token then any given ids; Whisper's generate takes the given
    decoder_input_ids as the whole prompt (they hold its start and task tokens); anything else is refused."""
    from exporters.generation.static_encdec import decoder_prompt_rule

    given = {"input_ids": torch.ones(2, 4, dtype=torch.long), "decoder_input_ids": torch.tensor([[7, 8], [9, 10]])}
    generation = {"decoder_start_token_id": 0}
    assert decoder_prompt_rule("M", torch.tensor([[7, 8], [9, 10]]), given, generation) == "given"
    assert decoder_prompt_rule("M", torch.tensor([[0, 7, 8], [0, 9, 10]]), given, generation) == "decoder_start"
    assert decoder_prompt_rule("M", torch.zeros(2, 1, dtype=torch.long), {"input_ids": given["input_ids"]},
                               generation) == "decoder_start"
    with pytest.raises(GenerationError, match="neither the caller's nor the start token"):
        decoder_prompt_rule("M", torch.tensor([[3, 3], [3, 3]]), given, generation)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_whisper_generates_from_its_given_decoder_prompt(cache):
    """Whisper's generate returns its decoder prompt with the new tokens only in its dict form (the capture reads
    that one), and takes the given decoder_input_ids as the whole prompt: both cache forms give eager's tokens."""
    from exporters import get_exporter
    from sweeps.generate import generate_inputs
    from sweeps.runner import reference

    tiny = reference("WhisperForConditionalGeneration", init_range=0.5).tiny
    inputs = generate_inputs(tiny.inputs)
    inputs["decoder_input_ids"] = torch.tensor([[35, 110, 125], [74, 61, 65]])
    with torch.no_grad():
        expected = tiny.model.generate(**inputs, max_new_tokens=6, do_sample=False, return_dict_in_generate=True).sequences
    assert torch.equal(expected[:, :3], inputs["decoder_input_ids"])
    exporter = get_exporter("dynamo")
    if cache == "static":
        generator = exporter.export_for_generation(tiny.model, inputs, cache="static", max_cache_len=16)
        assert generator.encoder["decoder_prompt"] == "given"
    else:
        generator = exporter.export_for_generation(tiny.model, inputs, exporter.config_class(dynamic=True))
    assert torch.equal(generator.generate(**inputs, max_new_tokens=6), expected)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_florence2_encoder_component_is_its_own_encoder_hook(cache):
    """Florence2's generate builds its encoder's inputs_embeds in its override of the encoder hook (text embeddings
    with the image features scattered in): the encoder component is that hook over the caller's input_ids, mask and
    pixel_values (exporters/generation/encoder_prep.py), and both cache forms give eager's tokens."""
    from exporters import get_exporter
    from sweeps.generate import generate_inputs
    from sweeps.runner import reference

    tiny = reference("Florence2ForConditionalGeneration", init_range=0.2).tiny
    inputs = generate_inputs(tiny.inputs)
    inputs.pop("decoder_input_ids", None)
    with torch.no_grad():
        expected = tiny.model.generate(**inputs, max_new_tokens=6, do_sample=False)
    exporter = get_exporter("dynamo")
    if cache == "static":
        generator = exporter.export_for_generation(tiny.model, inputs, cache="static", max_cache_len=16)
    else:
        generator = exporter.export_for_generation(tiny.model, inputs, exporter.config_class(dynamic=True))
    assert sorted(generator.components["encoder"].input_names) == ["attention_mask", "input_ids", "pixel_values"]
    assert torch.equal(generator.generate(**inputs, max_new_tokens=6), expected)


def test_a_decoder_that_shifts_its_encoder_outputs_in_place_shifts_a_copy():
    """MoonshineStreaming's decoder adds its position embeddings to ``encoder_hidden_states`` in place. Eager's cross
    cache is written at generate's first decoder call, from the encoder outputs as they were then; the step computes
    cross-attention afresh at every call, so each call must read them as that first call did. The step changes a copy
    (``CrossAttention.model_kwargs``): the outputs the loop hands every call stay as the encoder gave them (exported,
    the program wrote the shift back, five shifts after a five-token decoder prompt: logits 3.1e-3 off eager's), and
    a second call over the same inputs gives the first call's logits."""
    import types

    from exporters.generation.capture import flatten_tree
    from exporters.generation.static import CrossAttention, StaticStep
    from sweeps.generate import build_for_generate

    case = types.SimpleNamespace(entry=types.SimpleNamespace(class_name="MoonshineStreamingForConditionalGeneration"))
    model, inputs, _ = build_for_generate(case, 0.2)
    with torch.no_grad():
        encoded = model.get_encoder()(input_values=inputs["input_values"], attention_mask=inputs["attention_mask"])
    leaves, layout = flatten_tree("encoder_outputs", encoded)
    given = {f"encoder_outputs__{i}": leaf for i, leaf in enumerate(leaves)}
    step = StaticStep(model, int(leaves[0].shape[0]), 8, "inputs", takes_positions=False, takes_mask=False,
                      cross=CrossAttention(layout, len(leaves), {}, {k: v.clone() for k, v in given.items()})).eval()
    held = {k: v.clone() for k, v in given.items()}
    feed = {"input_ids": inputs["decoder_input_ids"][:, :1], "cache_position": torch.tensor([0]), **given,
            **step.initial_cache()}
    with torch.no_grad():
        first, again = step(**feed)["logits"], step(**feed)["logits"]
    assert all(torch.equal(given[k], held[k]) for k in given)
    assert torch.equal(first, again)
