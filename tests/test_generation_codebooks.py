"""A generate whose returned sequences are not its forward's rows (Musicgen's: ``(batch, num_codebooks, length)``
after its delay pattern, every pad id dropped) and whose prefill takes only the prompt's last token
(MusicgenForCausalLM's prepare_inputs_for_generation keeps ``input_ids[:, -1:]`` whenever it is given a cache, and
generate gives the first call an empty one): each step's token is read off the next call and checked against the
greedy choice (exporters/generation/chosen.py); the prefill's ids are the caller's last ones (``last_tokens``,
exporters/generation/steps.py); the sweep reads eager's tokens in the forward's layout (sweeps/generate.py)."""

from __future__ import annotations

import pytest
import torch

from exporters.generation import GenerationError
from exporters.generation.capture import Call
from exporters.generation.steps import Returned, derive_prefill_input, infer_prefill_rules, infer_rules

VOCAB = 16


def test_a_prefill_on_the_prompts_last_token_is_derived_from_the_callers_ids():
    prompt = torch.tensor([[7, 8, 9], [10, 11, 12]])
    given = {"input_ids": prompt, "attention_mask": torch.ones_like(prompt)}
    rules = infer_prefill_rules(Call({"input_ids": prompt[:, -1:], "attention_mask": given["attention_mask"]}, {}, {}),
                                given)
    assert rules == {"input_ids": "last_tokens:input_ids:1"}
    other = torch.tensor([[1, 2, 3, 4, 5]])  # another prompt: its own last token
    assert torch.equal(derive_prefill_input(rules["input_ids"], {"input_ids": other}), torch.tensor([[5]]))
    with pytest.raises(GenerationError, match="'input_ids', which the caller does not give"):  # not the last column
        infer_prefill_rules(Call({"input_ids": prompt[:, :1]}, {}, {}), given)


def _cached_calls(prompt, tokens, fed=None):
    """A cached decoder's calls (the prefill on the prompt's last token), each with logits whose argmax is the token
    chosen after it; ``fed``: the ids the decode calls take instead of the chosen tokens."""
    fed = tokens if fed is None else fed
    calls, left = [], []
    for n in range(tokens.shape[1]):
        ids = prompt[:, -1:] if n == 0 else fed[:, n - 1:n]
        mask = torch.ones(prompt.shape[0], prompt.shape[1] + n, dtype=torch.long)
        calls.append(Call({"input_ids": ids, "attention_mask": mask}, {}, {}))
        logits = torch.zeros(prompt.shape[0], 1, VOCAB)
        logits[torch.arange(prompt.shape[0]), 0, tokens[:, n]] = 1.0
        left.append(Returned({}, {"logits": logits}))
    return calls, left


def test_tokens_are_read_off_the_next_calls_where_the_sequences_are_codebook_rows():
    prompt = torch.tensor([[15, 8, 9], [15, 11, 12]])  # rows of batch * num_codebooks, as the forward takes them
    tokens = torch.tensor([[3, 4, 5], [6, 7, 3]])
    calls, left = _cached_calls(prompt, tokens)
    # what Musicgen's generate returns: (batch, num_codebooks, length), the start id 15 dropped
    codebooks = torch.cat([prompt[:, 1:], tokens], dim=-1)[:, None, :]
    assert infer_rules(calls, codebooks, prompt.shape[1], left) == {"input_ids": "token", "attention_mask": "append_one"}
    fed = tokens.clone()
    fed[1, 0] = 15  # a delay pattern writing the pad over a row's token: fed, not chosen
    calls, left = _cached_calls(prompt, tokens, fed)
    with pytest.raises(GenerationError, match=r"call 1 takes are not the greedy choice of call 0's logits \(rows \[1\]"):
        infer_rules(calls, codebooks, prompt.shape[1], left)
    with pytest.raises(GenerationError, match="returned no logits"):  # nothing to check the reading against
        infer_rules(calls, codebooks, prompt.shape[1])


def _tiny_musicgen():
    from transformers import MusicgenDecoderConfig, MusicgenForCausalLM

    torch.manual_seed(0)
    config = MusicgenDecoderConfig(vocab_size=VOCAB * 2, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                   ffn_dim=32, num_codebooks=1, max_position_embeddings=64, pad_token_id=VOCAB * 2 - 1,
                                   bos_token_id=VOCAB * 2 - 1, initializer_factor=0.5)
    model = MusicgenForCausalLM(config).eval()
    model.generation_config.decoder_start_token_id = config.pad_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.generation_config.num_return_sequences = 1  # its generate reads it without the generic default
    ids = torch.tensor([[config.pad_token_id, 4, 9, 2, 7], [config.pad_token_id, 3, 1, 8, 6]])
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def test_musicgen_generates_from_the_artifacts_as_eager_does():
    from exporters import get_exporter
    from sweeps.generate import _forward_layout

    model, inputs = _tiny_musicgen()
    with torch.no_grad():
        eager = model.generate(**inputs, max_new_tokens=6, do_sample=False, return_dict_in_generate=True,
                               output_logits=True)
    assert eager.sequences.dim() == 3  # (batch, num_codebooks, length): not the forward's rows
    recorded = {}
    from sweeps import generate as sweep

    saved, sweep.NEW_TOKENS = sweep.NEW_TOKENS, 6
    try:
        sequences = _forward_layout(model, dict(inputs), eager, recorded.__setitem__)
    finally:
        sweep.NEW_TOKENS = saved
    assert "sequences_from" in recorded and torch.equal(sequences[:, :5], inputs["input_ids"])
    exporter = get_exporter("dynamo")
    generator = exporter.export_for_generation(model, inputs, exporter.config_class(dynamic=True))
    assert generator.prefill_rules == {"input_ids": "last_tokens:input_ids:1"}
    assert torch.equal(generator.generate(**inputs, max_new_tokens=6), sequences)
