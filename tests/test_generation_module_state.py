"""State a model keeps in module attributes its forward sets (RecurrentGemma's conv and recurrent states): the
generation components carry it (exporters/generation/module_state.py), and any such state they do not carry is
still refused by name (steps.check_no_module_state)."""

from __future__ import annotations

import pytest
import torch

from exporters import get_exporter
from exporters.generation import GenerationError
from exporters.generation.steps import Returned, check_no_module_state, uncarriable

STATE = ["model.layers.0.temporal_block.conv1d_state", "model.layers.0.temporal_block.rg_lru.recurrent_states"]


@pytest.fixture(scope="module")
def recurrent_gemma():
    from transformers import RecurrentGemmaConfig, RecurrentGemmaForCausalLM

    torch.manual_seed(0)
    config = RecurrentGemmaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=16, lru_width=32,
                                  attention_window_size=16, conv1d_width=4, logits_soft_cap=30.0,
                                  block_types=["recurrent", "attention"], pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = RecurrentGemmaForCausalLM(config).eval()
    for p in model.parameters():  # wide enough that the tokens depend on the context
        torch.nn.init.normal_(p, std=0.3)
    return model


def _prompt():
    ids = torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(1))
    return ids, torch.ones_like(ids)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_module_held_state_is_carried_from_step_to_step(recurrent_gemma, cache):
    ids, mask = _prompt()
    with torch.no_grad():
        want = recurrent_gemma.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    exporter = get_exporter("dynamo")
    kwargs = {"cache": "static", "max_cache_len": 16} if cache == "static" else {"config": exporter.config_class(dynamic=True)}
    generator = exporter.export_for_generation(recurrent_gemma, {"input_ids": ids, "attention_mask": mask}, **kwargs)
    got = generator.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6)
    assert torch.equal(got, want)
    assert len(set(want[:, 6:].flatten().tolist())) > 2  # a loop repeating one token would hide a baked state
    if cache == "dynamic":  # recorded by path: the generator's and each carrying component's metadata
        assert generator.metadata["module_state"] == STATE
        assert generator.components["decode"].extra_metadata["module_state"] == STATE
        assert generator.rules["module_state"] == "attributes"
    else:
        assert {"past_state_0", "past_state_1"} <= set(generator.cache_shapes) or generator.state == "buffers"
        assert generator.token_by_token
    # the export leaves the model's own attributes as it found them
    assert recurrent_gemma.model.layers[0].temporal_block.conv1d_state.shape[0] == 2


def test_module_state_not_carried_is_refused_by_name():
    def left(before, after):
        return Returned({}, {}, {"block.conv_state": after}, {"block.conv_state": before})

    a, b, c = torch.zeros(2, 3), torch.ones(2, 3), torch.ones(2, 3) * 2
    carried = [left(None, a), left(a, b), left(b, c)]  # each call starts from what the call before left
    assert uncarriable(carried, "block.conv_state") is None
    check_no_module_state(carried, 2, "M", carried=["block.conv_state"])
    with pytest.raises(GenerationError, match=r"module attributes .*block\.conv_state"):
        check_no_module_state(carried, 2, "M")
    reset = [left(None, a), left(a + 5, b), left(b, c)]  # something between the calls set it
    assert uncarriable(reset, "block.conv_state") == "set between the calls, not only by them"
    with pytest.raises(GenerationError, match=r"not carried: block\.conv_state: set between the calls"):
        check_no_module_state(reset, 2, "M", carried=[])
    grows = [left(None, a), left(a, torch.ones(2, 4)), left(torch.ones(2, 4), torch.ones(2, 5))]
    assert uncarriable(grows, "block.conv_state") == "not one shape and dtype after every call"
