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
