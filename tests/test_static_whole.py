"""The static form of a model without a cache (exporters/generation/static_whole.py): one step over the whole
sequence so far, which ExecuTorch's LLM runner runs with ``use_kv_cache`` False."""

from __future__ import annotations

import json

import pytest
import torch

from exporters import get_exporter, load_generator
from exporters.generation import GenerationError

PROMPT = [5, 9, 17, 30, 12]


@pytest.fixture(scope="module")
def gpt():
    from transformers import OpenAIGPTConfig, OpenAIGPTLMHeadModel

    torch.manual_seed(0)
    config = OpenAIGPTConfig(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4, tie_word_embeddings=False)
    return OpenAIGPTLMHeadModel(config).eval()


def _eager(model, ids, mask=None, n=8):
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask if mask is not None else torch.ones_like(ids),
                              max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)


def test_a_model_without_a_cache_gets_a_step_over_the_whole_sequence(gpt, tmp_path):
    ids = torch.tensor([PROMPT])
    generator = get_exporter("dynamo").export_for_generation(gpt, {"input_ids": ids}, cache="static", max_cache_len=16)
    assert generator.whole_sequence
    assert generator.components["step"].input_names == ["input_ids"]  # the runner form: positions built inside
    want = _eager(gpt, ids)
    assert len(set(want[0, 5:].tolist())) > 3, want
    got = generator.generate(ids, max_new_tokens=8, eos_token_id=[])
    assert torch.equal(got, want)
    generator.save(tmp_path / "g")
    loaded = load_generator(tmp_path / "g")
    assert loaded.whole_sequence and torch.equal(loaded.generate(ids, max_new_tokens=8, eos_token_id=[]), want)
    # the longest call is prompt + max_new_tokens - 1 tokens: past the step's bound, refused before anything runs
    with pytest.raises(GenerationError, match="needs 17 tokens in its last call; max_cache_len is 16"):
        generator.generate(ids, max_new_tokens=13, eos_token_id=[])


def test_a_padded_batch_takes_its_mask_and_positions(gpt):
    ids = torch.tensor([[0, 0, 9, 17, 30], [5, 9, 17, 30, 12]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    generator = get_exporter("dynamo").export_for_generation(gpt, {"input_ids": ids, "attention_mask": mask},
                                                             cache="static", max_cache_len=16)
    assert generator.components["step"].input_names == ["input_ids", "attention_mask", "position_ids"]
    got = generator.generate(ids, attention_mask=mask, max_new_tokens=8, eos_token_id=[], pad_token_id=0)
    assert torch.equal(got, _eager(gpt, ids, mask))


@pytest.mark.slow
def test_executorch_llm_runner_runs_it_without_a_kv_cache(gpt, tmp_path):
    from exporters.generation.runners import run_executorch_llm

    ids = torch.tensor([PROMPT])
    generator = get_exporter("executorch").export_for_generation(gpt, {"input_ids": ids}, cache="static", max_cache_len=16)
    generator.save(tmp_path, runner=True)
    methods = json.loads((tmp_path / "metadata.json").read_text())["config_values"]["constant_methods"]
    assert methods["use_kv_cache"] is False and methods["enable_dynamic_shape"] is True
    got, stats = run_executorch_llm(str(tmp_path), PROMPT, 8)
    assert got == _eager(gpt, ids)[0, 5:].tolist()
    assert stats["num_prompt_tokens"] == len(PROMPT)


def test_ort_genai_carries_the_sequence_so_far_as_the_state_of_a_model_without_a_cache(gpt, tmp_path):
    from exporters.generation.genai import export_genai_folder, run_ort_genai

    onnx = get_exporter("onnx")
    ids = torch.tensor([PROMPT])
    artifact = export_genai_folder(tmp_path, onnx, gpt, {"input_ids": ids}, onnx.config_class(dynamic=True, max_dim=32),
                                   {"eos_token_id": 0})
    assert artifact.extra_metadata["cache_layout"]["whole_sequence"] == {"context": 32}
    want = _eager(gpt, ids)[0, len(PROMPT):].tolist()
    assert 0 not in want and len(set(want)) > 3, want
    got, stats = run_ort_genai(str(tmp_path), PROMPT, 8)
    assert got == want and stats["sequence_length"] == len(PROMPT) + 8
    # the graph itself, as onnxruntime-genai calls it: a prompt at past 0, then one token after it
    first = artifact(input_ids=ids, attention_mask=torch.ones(1, 5, dtype=torch.long),
                     **{"past_key_values.0.conv_state": torch.zeros(1, 1, 1),
                        "past_key_values.0.recurrent_state": torch.zeros(1, 1, 1, 32)})
    assert first["present.0.recurrent_state"][0, 0, 0, :5].tolist() == PROMPT  # the ids so far, as floats
    assert not first["present.0.recurrent_state"][0, 0, 0, 5:].any()


def test_a_model_that_computes_only_longer_sequences_gets_its_least_length_as_the_bound():
    """torch.export refuses S over [1, max] where the model's code guards a longer minimum (Blt's byte n-gram
    hashing: S >= 3); the whole-sequence step takes torch's suggested minimum when it keeps the maximum."""
    from exporters.generation.static_whole import shortest_sequence

    class Trigrams(torch.nn.Module):
        def forward(self, input_ids):
            if input_ids.shape[1] >= 3:  # a Python branch: the trace keeps this side, guarded
                return input_ids * 2
            return input_ids

    ids = torch.tensor([PROMPT])
    with pytest.raises(Exception) as caught:
        torch.export.export(Trigrams(), (ids,), dynamic_shapes=({1: torch.export.Dim("S", min=1, max=16)},))
    assert shortest_sequence(caught.value, "S", 16) == 3
    assert shortest_sequence(caught.value, "S", 32) is None  # a different maximum: not this bound's fix
    assert shortest_sequence(RuntimeError("something else"), "S", 16) is None
