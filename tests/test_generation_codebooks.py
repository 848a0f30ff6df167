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
    with pytest.raises(GenerationError, match=r"last tokens \(last_tokens:input_ids:1\).*onnxruntime-genai"):
        generator.save("unused", runner=True)  # its runner would prefill the whole prompt


def _musicgen_eager(model, inputs, new):
    from sweeps import generate as sweep

    with torch.no_grad():
        eager = model.generate(**inputs, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                               return_dict_in_generate=True, output_logits=True)
    saved, sweep.NEW_TOKENS = sweep.NEW_TOKENS, new
    try:
        return eager, sweep._forward_layout(model, dict(inputs), eager, {}.__setitem__)
    finally:
        sweep.NEW_TOKENS = saved


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_musicgen_static_feeds_the_prompts_last_token_as_generate_does(backend, tmp_path):
    """The static form reads the prefill rule off generate's own calls (static.py ``_prompt_rule``): Musicgen's first
    call takes the prompt's last token, at slot 0, so the static loop feeds that token alone and writes on from slot 1
    (before: the whole prompt, logits apart from eager's from step 0). Logits, cache and tokens are eager's, after a
    save and load too (the rule is in generator.json)."""
    import json

    from exporters import get_exporter, load_generator
    from exporters.parity import assert_close
    from exporters.pytrees import flatten_outputs

    model, inputs = _tiny_musicgen()
    new = 6
    eager, sequences = _musicgen_eager(model, inputs, new)
    prompt = inputs["input_ids"].shape[1]
    generator = get_exporter(backend).export_for_generation(model, inputs, cache="static", max_cache_len=16)
    assert generator.prefill_rules == {"input_ids": "last_tokens:input_ids:1"} and generator.prompt_slots(prompt) == 1
    ours = generator.generate(**inputs, max_new_tokens=new, teacher_tokens=sequences[:, prompt:],
                              return_dict_in_generate=True, output_logits=True)
    for step, (want, got) in enumerate(zip(eager.logits, ours.logits)):
        assert_close({f"logits.{step}": want}, {f"logits.{step}": got}, backend)
    if backend == "onnx":  # the cache as outputs: slot 0 the prompt's last token, then one a step
        want = flatten_outputs({"past_key_values": getattr(eager.past_key_values, "self_attention_cache", eager.past_key_values)})
        for i in range(2):
            written = ours.cache[f"past_{i}_key"][:, :, :new]
            assert want[f"past_key_values.{i}.key"].shape[-2] == new
            assert_close({"key": want[f"past_key_values.{i}.key"]}, {"key": written}, backend)
    assert torch.equal(generator.generate(**inputs, max_new_tokens=new), sequences)
    generator.save(tmp_path)
    with open(tmp_path / "generator.json") as f:
        assert json.load(f)["prompt_rule"] == "last_tokens:input_ids:1"
    assert torch.equal(load_generator(tmp_path).generate(**inputs, max_new_tokens=new), sequences)


def test_a_prompts_last_tokens_are_refused_where_the_loop_would_feed_other_inputs_beside_them():
    """``_prompt_rule`` checks what the first call takes beside the prompt's last tokens against what the static loop
    feeds; the loop refuses the rule where it would not apply it; ExecuTorch's LLM runner, which prefills every prompt
    token, refuses a step under it by name."""
    from types import SimpleNamespace

    from exporters.generation import StaticGenerator
    from exporters.generation.static import _prompt_rule

    ids = torch.tensor([[5, 6, 7, 8]])
    step = SimpleNamespace(extras={}, takes_mask=False, runner_form=False)
    assert _prompt_rule("M", step, {"input_ids": ids[:, -2:]}, {"input_ids": ids}) == "last_tokens:input_ids:2"
    assert _prompt_rule("M", step, {"input_ids": ids}, {"input_ids": ids}) is None
    assert _prompt_rule("M", step, {"input_ids": ids[:, :2]}, {"input_ids": ids}) is None  # not a suffix: no rule
    # the prompt's own last positions: what the loop feeds beside them
    assert _prompt_rule("M", step, {"input_ids": ids[:, -2:], "position_ids": torch.tensor([[2, 3]])},
                        {"input_ids": ids}) == "last_tokens:input_ids:2"
    with pytest.raises(GenerationError, match=r"last 2 of 4 tokens .* with \['position_ids'\]"):
        _prompt_rule("M", step, {"input_ids": ids[:, -2:], "position_ids": torch.tensor([[0, 1]])}, {"input_ids": ids})
    with pytest.raises(GenerationError, match=r"with \['token_type_ids'\]"):
        _prompt_rule("M", SimpleNamespace(extras={"token_type_ids": "repeat_last"}, takes_mask=False, runner_form=False),
                     {"input_ids": ids[:, -2:], "token_type_ids": torch.tensor([[0, 0]])},
                     {"input_ids": ids, "token_type_ids": torch.tensor([[0, 0, 1, 1]])})

    methods = {"get_max_seq_len": 8, "use_kv_cache": True, "get_vocab_size": 16}
    step_artifact = SimpleNamespace(backend="executorch", input_names=["input_ids", "cache_position"],
                                    metadata={"config_values": {"constant_methods": methods}})

    def loop(**kwargs):
        return StaticGenerator({"step": step_artifact}, batch=1, max_cache_len=8, state="buffers", cache_shapes={},
                               takes_positions=False, takes_mask=False, generation={}, metadata={"vocab_size": 16},
                               **kwargs)

    loop()._check_runner()  # the same step, its prompt fed whole: the runner's
    with pytest.raises(GenerationError, match=r"needs a prompt fed whole \(.*last 1 tokens, last_tokens:input_ids:1"):
        loop(prompt_rule="last_tokens:input_ids:1")._check_runner()
    with pytest.raises(GenerationError, match="not a step over the whole sequence"):
        loop(prompt_rule="last_tokens:input_ids:1", whole_sequence=True)
    with pytest.raises(GenerationError, match="through a step over token ids only"):
        loop(prompt_rule="append_column:input_ids:0")
