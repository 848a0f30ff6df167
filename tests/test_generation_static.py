"""export_for_generation(cache="static"): one step over a fixed-size cache updated in place (mutable
buffers on dynamo and ExecuTorch, input/output pairs on ONNX), driven by StaticGenerator, against eager
``model.generate(do_sample=False)``."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch
from _backend_params import _backends
from _tiny_llama import tiny_llama
from _tiny_mla import tiny_deepseek_v3

from exporters import get_exporter
from exporters.generation import GenerationError, StaticGenerator
from exporters.parity import assert_close
from exporters.pytrees import flatten_outputs

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_CACHE_LEN = 24


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


def _prompt(b, s, seed, pad=True):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 64, (b, s), generator=g)
    mask = torch.ones(b, s, dtype=torch.long)
    if pad and b > 1 and s > 2:
        mask[0, :2] = 0  # left padding
    return ids, mask


_GENERATORS: dict = {}


def _generator(llama, backend) -> StaticGenerator:
    if backend not in _GENERATORS:
        ids, mask = _prompt(2, 5, 0)
        _GENERATORS[backend] = get_exporter(backend).export_for_generation(
            llama, {"input_ids": ids, "attention_mask": mask}, cache="static", max_cache_len=MAX_CACHE_LEN)
    return _GENERATORS[backend]


@pytest.mark.parametrize("backend", _backends())
def test_static_step_generates_like_eager(llama, backend):
    generator = _generator(llama, backend)
    assert isinstance(generator, StaticGenerator)
    assert generator.state == ("inputs" if backend == "onnx" else "buffers")
    step = generator.components["step"]
    # only the sequence is dynamic (a prompt, then one token); batch and cache are fixed
    assert {name: sorted(dims) for name, dims in step.dynamic_dims.items() if dims} == \
        {"input_ids": [1], "position_ids": [1], "cache_position": [0]}
    distinct = set()
    for s, n, seed in ((5, 8, 1), (3, 12, 2), (1, 10, 3), (9, 16, 4)):  # the last fills all 24 slots
        ids, mask = _prompt(2, s, seed)
        with torch.no_grad():
            expected = llama.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, do_sample=False)
        got = generator.generate(ids, mask, max_new_tokens=n)  # calls reuse the slots without a reset
        assert torch.equal(got, expected), (s, n, got.tolist(), expected.tolist())
        distinct |= set(expected[:, s:].flatten().tolist())
    assert len(distinct) > 8, f"degenerate tiny model: the new tokens are {sorted(distinct)}"


def test_onnx_cache_pairs_match_eager_cache(llama):
    generator = _generator(llama, "onnx")
    assert generator.cache_shapes == {f"past_{i}_{p}": (2, 2, MAX_CACHE_LEN, 8) for i in range(2) for p in ("key", "value")}
    ids, mask = _prompt(2, 6, seed=7)
    with torch.no_grad():
        eager = llama.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False,
                               return_dict_in_generate=True, output_logits=True)
    ours = generator.generate(ids, mask, max_new_tokens=8, eos_token_id=[], teacher_tokens=eager.sequences[:, 6:],
                              return_dict_in_generate=True, output_logits=True)
    for step, (want, got) in enumerate(zip(eager.logits, ours.logits)):
        assert_close({f"logits.{step}": want}, {f"logits.{step}": got}, "onnx")
    want = flatten_outputs({"past_key_values": eager.past_key_values})
    attended = torch.cat([mask, torch.ones(2, 7, dtype=mask.dtype)], dim=1).bool()
    for i in range(2):
        for part in ("key", "value"):
            got = ours.cache[f"past_{i}_{part}"]
            assert got.shape == (2, 2, MAX_CACHE_LEN, 8)
            written = got[:, :, :13]
            keep = attended[:, None, :, None].expand_as(written)
            assert_close({part: want[f"past_key_values.{i}.{part}"][keep]}, {part: written[keep]}, "onnx")


def test_limits_are_named_before_anything_runs(llama):
    generator = _generator(llama, "dynamo")
    ids, mask = _prompt(2, 5, seed=1)
    with pytest.raises(GenerationError, match=r"needs 28 cache slots; max_cache_len is 24 \(at most 20 new tokens"):
        generator.generate(ids, mask, max_new_tokens=24)
    with pytest.raises(GenerationError, match=r"prompt\) is 25, longer than the static cache \(max_cache_len=24\)"):
        generator.generate(*_prompt(2, 25, seed=1), max_new_tokens=1)
    with pytest.raises(GenerationError, match=r"dim 0 \(batch\) is 1; this static cache was exported for batch 2"):
        generator.generate(*_prompt(1, 4, seed=1), max_new_tokens=2)
    with pytest.raises(GenerationError, match="longer than max_cache_len=4"):
        get_exporter("dynamo").export_for_generation(llama, {"input_ids": ids}, cache="static", max_cache_len=4)


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_encoder_decoder_runs_its_decoder_one_token_a_call(backend, tmp_path):
    """An encoder-decoder's static form: the encoder component, then a one-token decoder step over a static
    self-attention cache, the encoder's outputs and mask an input of every call (before: refused as 'an
    encoder-decoder'). The tokens equal eager's, the decoder's sequences as generate returns them, after a
    save and load too; the encoder's input is required."""
    from transformers import BartConfig, BartForConditionalGeneration

    from exporters import load_generator

    torch.manual_seed(0)
    model = BartForConditionalGeneration(BartConfig(
        vocab_size=48, d_model=16, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, init_std=1.0, forced_eos_token_id=None)).eval()
    ids, mask = _prompt(2, 6, seed=5)
    ids = ids % 48
    generator = get_exporter(backend).export_for_generation(model, {"input_ids": ids, "attention_mask": mask},
                                                            cache="static", max_cache_len=16)
    assert sorted(generator.components) == ["encoder", "step"] and generator.token_by_token
    assert not any(generator.components["step"].dynamic_dims.values())
    with torch.no_grad():
        expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    got = generator.generate(ids, mask, max_new_tokens=8)
    assert torch.equal(got, expected), (got.tolist(), expected.tolist())
    assert len(set(expected[:, 1:].flatten().tolist())) > 3, "degenerate tiny model"
    generator.save(tmp_path)
    assert torch.equal(load_generator(tmp_path).generate(ids, mask, max_new_tokens=8), expected)
    with pytest.raises(GenerationError, match=r"takes \['input_ids'"):
        generator.generate(None, mask, max_new_tokens=2)


_LOAD = """
import sys, torch
from exporters import load_generator
g = load_generator(sys.argv[1])
ids = torch.tensor([[5, 9, 17, 30], [7, 7, 40, 41]])
print(type(g).__name__, g.generate(ids, max_new_tokens=9, eos_token_id=[]).tolist())
"""


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_saved_static_generator_runs_in_a_fresh_process(llama, backend, tmp_path):
    generator = _generator(llama, backend)
    generator.save(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["generator.json", "step"]
    ids = torch.tensor([[5, 9, 17, 30], [7, 7, 40, 41]])
    config = copy.deepcopy(llama.generation_config)
    config.eos_token_id = None  # eos_token_id=[] in the loop: no end token, none suppressed
    with torch.no_grad():
        expected = llama.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=9, do_sample=False,
                                  eos_token_id=None, generation_config=config)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": _ROOT}
    done = subprocess.run([sys.executable, "-c", _LOAD, str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == f"StaticGenerator {expected.tolist()}"


def test_static_cache_takes_each_layers_own_key_and_value_sizes():
    """Multi-head latent attention (DeepSeek-V3) caches keys and values of different sizes: the static cache is
    sized from the model's own writes, not from one head_dim of the config (before: index_copy_ refused the
    key of another size at export)."""
    model = tiny_deepseek_v3()
    ids = torch.randint(3, 64, (1, 5), generator=torch.Generator().manual_seed(1))
    generator = get_exporter("dynamo").export_for_generation(model, {"input_ids": ids}, cache="static", max_cache_len=16)
    with torch.no_grad():
        layer = model(ids, use_cache=True).past_key_values.layers[0]
        expected = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert layer.keys.shape[-1] != layer.values.shape[-1]
    assert (generator.cache_shapes["past_0_key"][-1], generator.cache_shapes["past_0_value"][-1]) == \
        (layer.keys.shape[-1], layer.values.shape[-1])
    assert generator.generate(ids, max_new_tokens=8).tolist() == expected.tolist()


def test_linear_attention_states_run_token_by_token():
    """A hybrid (Qwen3-Next: gated delta rule layers beside attention layers) keeps its conv and recurrent states
    as buffers of the step, which takes one token a call from zero state; a second generate starts again from
    zero (a running state is not masked by position as stale key/value slots are)."""
    from _tiny_hybrid import tiny_qwen3_next

    model = tiny_qwen3_next()
    generator = get_exporter("dynamo").export_for_generation(
        model, {"input_ids": torch.randint(3, 64, (1, 5))}, cache="static", max_cache_len=24)
    assert generator.token_by_token
    step = generator.components["step"]
    assert {name: sorted(dims) for name, dims in step.dynamic_dims.items() if dims} == {}  # one token a call
    assert any("conv" in name for name in generator.cache_shapes)
    assert any("recurrent" in name for name in generator.cache_shapes)
    ids = torch.randint(3, 64, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=8, do_sample=False)
    runs = [generator.generate(ids, max_new_tokens=8, return_dict_in_generate=True, output_logits=True) for _ in range(2)]
    assert runs[0].sequences.tolist() == expected.tolist()
    # the second run starts from the state the first left in the program: reset, it computes the same
    # (without the reset its logits move by about 4e-4 on this model)
    for first, second in zip(runs[0].logits, runs[1].logits):
        assert torch.equal(first, second)


def test_runner_form_builds_the_mask_generate_passes():
    """A batch of one without padding exports the runner form (tokens and cache positions only). BioGpt derives
    its positions from the attention mask; without one it reads the static cache's length, a data-dependent
    value the export refuses ('N - u0 > N'). The step builds generate's all-ones mask over the written slots."""
    from transformers import BioGptConfig, BioGptForCausalLM

    torch.manual_seed(0)
    config = BioGptConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=2, max_position_embeddings=64, eos_token_id=None, pad_token_id=1)
    model = BioGptForCausalLM(config).eval()
    ids = torch.randint(3, 64, (1, 5), generator=torch.Generator().manual_seed(1))
    generator = get_exporter("dynamo").export_for_generation(model, {"input_ids": ids}, cache="static", max_cache_len=16)
    assert generator.components["step"].input_names == ["input_ids", "cache_position"]
    with torch.no_grad():
        expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    assert generator.generate(ids, max_new_tokens=8).tolist() == expected.tolist()


def _tiny_bert_lm():
    from transformers import BertConfig, BertLMHeadModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=64, type_vocab_size=2, is_decoder=True, initializer_range=0.3)
    return BertLMHeadModel(config).eval()


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_per_token_inputs_follow_their_rule(backend, tmp_path):
    """BERT's generate passes token_type_ids to every forward call, the last segment again for each new
    token: the static step takes them like input_ids and the loop repeats the last one (before: the export
    refused 'passes ['token_type_ids'] to forward'). A prompt ending in segment 1 makes the rule matter."""
    from exporters import load_generator

    model = _tiny_bert_lm()
    ids = torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(3))
    types = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    generator = get_exporter(backend).export_for_generation(model, {"input_ids": ids, "token_type_ids": types},
                                                            cache="static", max_cache_len=16)
    assert generator.extras == {"token_type_ids": "repeat_last"}
    assert sorted(generator.components["step"].dynamic_dims["token_type_ids"]) == [1]
    with torch.no_grad():
        expected = model.generate(input_ids=ids, token_type_ids=types, max_new_tokens=8, do_sample=False)
        zeros = model.generate(input_ids=ids, token_type_ids=torch.zeros_like(types), max_new_tokens=8, do_sample=False)
    assert not torch.equal(expected, zeros), "the segments change nothing: the test cannot see a wrong rule"
    assert torch.equal(generator.generate(ids, token_type_ids=types, max_new_tokens=8), expected)
    generator.save(tmp_path)
    assert torch.equal(load_generator(tmp_path).generate(ids, token_type_ids=types, max_new_tokens=8), expected)
    with pytest.raises(GenerationError, match=r"takes \['token_type_ids'\] with the prompt"):
        generator.generate(ids, max_new_tokens=2)
    with pytest.raises(GenerationError, match=r"input 'token_type_ids' has shape \(2, 5\)"):
        generator.generate(ids, token_type_ids=types[:, 1:], max_new_tokens=2)


def test_per_token_extras_need_a_rule_for_every_call():
    from exporters.generation.static import per_token_extras

    ids = [torch.ones(1, 4, dtype=torch.long), torch.ones(1, 1, dtype=torch.long), torch.ones(1, 1, dtype=torch.long)]
    calls = [{"input_ids": i} for i in ids]
    segments = [torch.tensor([[0, 0, 1, 1]]), torch.tensor([[1]]), torch.tensor([[1]])]
    assert per_token_extras([{**c, "token_type_ids": s} for c, s in zip(calls, segments)]) == {"token_type_ids": "repeat_last"}
    suffix = [torch.tensor([[0, 0, 0, 0]]), torch.tensor([[1]]), torch.tensor([[1]])]
    assert per_token_extras([{**c, "token_type_ids": s} for c, s in zip(calls, suffix)]) == {"token_type_ids": "ones_column"}
    # no rule gives a segment that flips at a step; an input not shaped like input_ids is no per-token input
    flips = [torch.tensor([[0, 0, 1, 1]]), torch.tensor([[0]]), torch.tensor([[1]])]
    assert per_token_extras([{**c, "token_type_ids": s} for c, s in zip(calls, flips)]) == {}
    features = [{**c, "pixel_values": torch.zeros(1, 3, 4, 4)} for c in calls]
    assert per_token_extras(features) == {}


def test_a_state_kept_in_module_attributes_is_carried_by_the_step():
    """RecurrentGemma sets its conv and recurrent states on its modules in forward and returns no cache: a static
    step that left them as they were at export gave wrong logits from step 0, and the static form refused it by name.
    The step now carries them as buffers (exporters/generation/module_state.py), one token a call, and generates
    eager's tokens."""
    from sweeps.zoo import build_tiny

    tiny = build_tiny("RecurrentGemmaForCausalLM", seed=0)
    ids = tiny.inputs["input_ids"]
    generator = get_exporter("dynamo").export_for_generation(tiny.model, {"input_ids": ids}, cache="static")
    assert generator.token_by_token
    with torch.no_grad():
        expected = tiny.model.generate(input_ids=ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(generator.generate(ids, max_new_tokens=6), expected)


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_a_prompt_with_image_features_runs_over_embeddings(backend, tmp_path):
    """Llava's generate passes the image features to the prompt's call only: the static form exports the
    model's forward up to its decoder (embed), the embedding table (embed_tokens) and a step over
    inputs_embeds (before: 'passes ['mm_encoder_outputs'] to forward'). Tokens equal eager's, also after a
    save and load, and the caller's image input is required."""
    from exporters import load_generator
    from sweeps.generate import generate_inputs
    from sweeps.runner import reference

    tiny = reference("LlavaForConditionalGeneration", init_range=0.2).tiny
    model, inputs = tiny.model, generate_inputs(tiny.inputs)
    generator = get_exporter(backend).export_for_generation(model, inputs, cache="static", max_cache_len=40)
    assert sorted(generator.components) == ["embed", "embed_tokens", "step"]
    assert "inputs_embeds" in generator.components["step"].input_names
    assert "input_ids" not in generator.components["step"].input_names
    with torch.no_grad():
        expected = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    assert torch.equal(generator.generate(**inputs, max_new_tokens=8), expected)
    generator.save(tmp_path)
    assert torch.equal(load_generator(tmp_path).generate(**inputs, max_new_tokens=8), expected)
    with pytest.raises(GenerationError, match=r"takes \['pixel_values'\] with the prompt"):
        generator.generate(inputs["input_ids"], inputs["attention_mask"], max_new_tokens=2)


def test_a_per_token_tensor_the_model_hands_its_decoder_is_a_step_input():
    """Gemma4 hands its decoder per_layer_inputs (per-layer token embeddings) beside inputs_embeds, and its forward
    takes them by name: the step takes handed_per_layer_inputs, embed_tokens gives them for a new token from the
    model's own text call (before: "hands its decoder ['per_layer_inputs'] beside the embeddings"). The teacher-forced
    logits equal eager's."""
    from sweeps.generate import generate_inputs
    from sweeps.runner import reference

    tiny = reference("Gemma4ForConditionalGeneration", init_range=0.2).tiny
    model, inputs = tiny.model, generate_inputs(tiny.inputs)
    generator = get_exporter("dynamo").export_for_generation(model, inputs, cache="static", max_cache_len=40)
    assert "handed_per_layer_inputs" in generator.components["step"].input_names
    assert "handed_per_layer_inputs" in generator.components["embed_tokens"].output_names
    with torch.no_grad():
        eager = model.generate(**inputs, max_new_tokens=6, do_sample=False, output_logits=True,
                               return_dict_in_generate=True)
    prompt = inputs["input_ids"].shape[1]
    out = generator.generate(**inputs, max_new_tokens=6, output_logits=True, return_dict_in_generate=True,
                             teacher_tokens=eager.sequences[:, prompt:])
    for want, got in zip(eager.logits, out.logits, strict=True):
        assert_close({"logits": want}, {"logits": got}, "dynamo")


def test_a_prompt_only_per_token_input_the_forward_reads_for_its_mask_is_a_step_input():
    """Molmo2's generate passes mm_token_type_ids to the prompt call only, and its forward builds the prompt's
    image-block (bidirectional) mask from it: the step over embeddings takes it at every call, a new token's value by
    the first rule under which generate's logits stay as they are (before: teacher-forced logits 0.01 off at step 0,
    the prompt given a plain causal mask). The teacher-forced logits equal eager's."""
    from sweeps.generate import generate_inputs
    from sweeps.runner import reference

    tiny = reference("Molmo2ForConditionalGeneration", init_range=0.2).tiny
    model, inputs = tiny.model, generate_inputs(tiny.inputs)
    generator = get_exporter("dynamo").export_for_generation(model, inputs, cache="static", max_cache_len=40)
    assert generator.extras == {"mm_token_type_ids": "repeat_last"}
    assert "mm_token_type_ids" in generator.components["step"].input_names
    with torch.no_grad():
        eager = model.generate(**inputs, max_new_tokens=6, do_sample=False, output_logits=True,
                               return_dict_in_generate=True)
    prompt = inputs["input_ids"].shape[1]
    out = generator.generate(**inputs, max_new_tokens=6, output_logits=True, return_dict_in_generate=True,
                             teacher_tokens=eager.sequences[:, prompt:])
    for want, got in zip(eager.logits, out.logits, strict=True):
        assert_close({"logits": want}, {"logits": got}, "dynamo")


@pytest.mark.parametrize("name, token_by_token", [("AriaTextForCausalLM", False), ("Lfm2ForCausalLM", True)])
def test_a_step_whose_sequence_bound_torch_cannot_prove_runs_token_by_token(name, token_by_token):
    """Lfm2's short convolution branches on ``seq_len == 1`` (``S != 1`` on the sequence, a constraint violation over
    S in [1, max_cache_len]): the step is exported at one token a call, and the loop feeds the prompt token by token.
    AriaText's MoE puts ``S * Min(32, 32 * S) == 32 * S`` on it, which is true at every S in [1, 24]: the finite-range
    decision (exporters/workarounds/torch_internals/_finite_range_guards.py) proves it, and its step takes the prompt
    in one call (it ran token by token before). Both generate eager's tokens."""
    from sweeps.generate import generate_inputs
    from sweeps.runner import reference

    tiny = reference(name, init_range=0.2).tiny
    model, inputs = tiny.model, generate_inputs(tiny.inputs)
    generator = get_exporter("dynamo").export_for_generation(model, inputs, cache="static", max_cache_len=24)
    step = generator.components["step"]
    assert generator.token_by_token is token_by_token
    if token_by_token:
        assert step.extra_metadata["sequence_dim"].startswith("one token a call")
        assert not any(step.dynamic_dims.values())
    else:
        assert step.dynamic_dims["input_ids"][1]["min"] == 1 and step.dynamic_dims["input_ids"][1]["max"] == 24
    with torch.no_grad():
        expected = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    assert torch.equal(generator.generate(**inputs, max_new_tokens=8), expected)


def test_fixed_inputs_are_the_tensors_every_call_passes_unchanged():
    """A multimodal model's feature layout (Qwen2-Audio's feature_attention_mask) comes with every forward call,
    unchanged: the embed component reads it with the prompt, the step over embeddings is not given it. An input
    that changes between calls, or that a call leaves out, is not fixed."""
    from exporters.generation.static import fixed_inputs

    layout, ids = torch.ones(2, 5, dtype=torch.long), torch.arange(6).reshape(2, 3)
    calls = [{"input_ids": ids, "feature_attention_mask": layout, "grown": ids, "once": ids, "use_cache": True},
             {"input_ids": ids[:, :1], "feature_attention_mask": layout.clone(), "grown": ids[:, :1], "use_cache": True},
             {"input_ids": ids[:, :1], "feature_attention_mask": layout.clone(), "grown": ids[:, :1] + 1}]
    assert fixed_inputs(calls) == ["feature_attention_mask"]
    calls[2]["feature_attention_mask"] = layout * 0
    assert fixed_inputs(calls) == []


def test_deepstack_features_per_token_add_what_the_decoder_adds():
    """A DeepStack decoder adds each layer's image features at the mask's positions (a gather whose count is data);
    the static step over embeddings hands them per token, zeros at text positions, and adds them densely. The two
    give the same hidden states, bit for bit, and a new token's zeros add nothing."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextModel

    from exporters.generation.static_embeds import add_dense, dense_deepstack

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 6, 8, generator=g)
    mask = torch.tensor([[0, 1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 0]], dtype=torch.bool)
    features = [torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g)]
    dense = dense_deepstack(hidden, mask, features)
    assert sorted(dense) == ["deepstack_0", "deepstack_1"]
    for name, feature in zip(sorted(dense), features):
        expected = Qwen3VLTextModel._deepstack_process(None, hidden, mask, feature)
        assert torch.equal(add_dense(hidden, None, dense[name]), expected)
    new_token = hidden[:, -1:]
    assert torch.equal(add_dense(new_token, None, torch.zeros_like(new_token)), new_token)
