"""export_for_generation: prefill + decode components from the model's own generate, driven by a loop
that runs only the artifacts, against eager ``model.generate(do_sample=False)``.

The tiny Llama uses initializer_range 0.2: at the default 0.02 a tiny model emits one token at every
step, and such a loop would hide a broken cache from a token check (the tests assert the tokens vary).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from _backend_params import _backends
from _tiny_llama import tiny_llama

from exporters import get_exporter
from exporters.generation import GenerationError
from exporters.generation.capture import Call
from exporters.generation.steps import infer_rules
from exporters.parity import assert_close
from exporters.pytrees import flatten_outputs

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CASES = [(2, 5, 8), (1, 3, 10), (3, 7, 6), (1, 1, 8)]  # batch, prompt length, new tokens


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


def _prompt(b, s, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 64, (b, s), generator=g)  # no bos/eos/pad in the prompt
    mask = torch.ones(b, s, dtype=torch.long)
    if b > 1 and s > 2:
        mask[0, :2] = 0  # left padding
    return ids, mask


_GENERATORS: dict = {}


def _generator(llama, backend):
    if backend not in _GENERATORS:
        exporter = get_exporter(backend)
        ids, mask = _prompt(2, 5, 0)
        _GENERATORS[backend] = exporter.export_for_generation(
            llama, {"input_ids": ids, "attention_mask": mask}, exporter.config_class(dynamic=True, max_dim=64))
    return _GENERATORS[backend]


@pytest.mark.parametrize("backend", _backends())
def test_greedy_tokens_equal_eager(llama, backend):
    generator = _generator(llama, backend)
    assert generator.rules == {"input_ids": "token", "position_ids": "next_position", "attention_mask": "append_one",
                               "past_key_values": "outputs"}
    assert generator.prefill_rules == {"position_ids": "positions_from_mask"}
    distinct = set()
    for b, s, n in _CASES:
        ids, mask = _prompt(b, s, seed=b * 100 + s)
        with torch.no_grad():
            expected = llama.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, do_sample=False)
        got = generator.generate(ids, mask, max_new_tokens=n)  # the model's end token stops both
        assert torch.equal(got, expected), (b, s, n, got.tolist(), expected.tolist())
        distinct |= set(expected[:, s:].flatten().tolist())
    assert len(distinct) > 8, f"degenerate tiny model: the new tokens are {sorted(distinct)}"


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_teacher_forced_logits_and_final_cache_match_eager(llama, backend):
    generator = _generator(llama, backend)
    ids, mask = _prompt(2, 6, seed=7)
    with torch.no_grad():
        eager = llama.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False,
                               return_dict_in_generate=True, output_logits=True)
    ours = generator.generate(ids, mask, max_new_tokens=8, eos_token_id=[], teacher_tokens=eager.sequences[:, 6:],
                              return_dict_in_generate=True, output_logits=True)
    assert ours.steps == 8 and len(ours.logits) == 8
    for step, (want, got) in enumerate(zip(eager.logits, ours.logits)):
        assert_close({f"logits.{step}": want}, {f"logits.{step}": got}, backend)
    # the cache at the positions attention reads (a left-padded position's key is never attended, and a
    # fully masked attention row is computed differently by each runtime)
    want = flatten_outputs({"past_key_values": eager.past_key_values})
    assert sorted(want) == sorted(ours.cache)
    attended = torch.cat([mask, torch.ones(2, 7, dtype=mask.dtype)], dim=1).bool()  # prompt + the 7 fed tokens
    for name, tensor in ours.cache.items():
        assert tensor.shape == want[name].shape == (2, 2, 13, 8)
        keep = attended[:, None, :, None].expand_as(tensor)
        assert_close({name: want[name][keep]}, {name: tensor[keep]}, backend)


def test_end_token_stops_each_sequence_as_eager_does(llama):
    generator = _generator(llama, "dynamo")
    ids, mask = _prompt(3, 4, seed=3)
    with torch.no_grad():
        free = llama.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, min_new_tokens=10, do_sample=False)
    eos = int(free[0, 6])  # a token sequence 0 emits at its third step
    with torch.no_grad():
        expected = llama.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False,
                                  eos_token_id=eos, pad_token_id=0)
    got = generator.generate(ids, mask, max_new_tokens=10, eos_token_id=eos, pad_token_id=0)
    assert torch.equal(got, expected)


def _no_end_token(model):
    import copy

    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = None
    return config


_LOAD = """
import sys, torch
from exporters import load_generator
g = load_generator(sys.argv[1])
print(g.generate(torch.tensor([[5, 9, 17, 30]]), max_new_tokens=9, eos_token_id=[]).tolist())
"""


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_saved_generator_runs_in_a_fresh_process(llama, backend, tmp_path):
    generator = _generator(llama, backend)
    generator.save(tmp_path)
    # one graph: the decode step runs the prompt from an empty cache (exporters/generation/empty_past.py)
    assert sorted(os.listdir(tmp_path)) == ["decode", "generator.json"]
    assert generator.metadata["prefill"] == "decode at past length 0"
    ids = torch.tensor([[5, 9, 17, 30]])
    with torch.no_grad():
        expected = llama.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=9, do_sample=False,
                                  eos_token_id=None, generation_config=_no_end_token(llama))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": _ROOT}
    done = subprocess.run([sys.executable, "-c", _LOAD, str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == str(expected.tolist())


def test_bad_calls_name_the_problem(llama):
    generator = _generator(llama, "dynamo")
    ids, mask = _prompt(1, 3, seed=1)
    with pytest.raises(GenerationError, match="max_new_tokens must be at least 1"):
        generator.generate(ids, mask, max_new_tokens=0)
    with pytest.raises(GenerationError, match=r"unexpected \['pixel_values'\]"):
        generator.generate(ids, mask, pixel_values=torch.zeros(1, 3, 4, 4))
    exporter = get_exporter("dynamo")
    with pytest.raises(GenerationError, match="cache='paged' is not a cache form"):
        exporter.export_for_generation(llama, {"input_ids": ids}, cache="paged")
    with pytest.raises(GenerationError, match="max_cache_len=16 sizes a static cache"):
        exporter.export_for_generation(llama, {"input_ids": ids}, max_cache_len=16)


def _tiny_bart():
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(0)
    cfg = BartConfig(vocab_size=48, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                     decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
                     init_std=0.3, forced_eos_token_id=2)
    return BartForConditionalGeneration(cfg).eval()


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_encoder_decoder_generates_like_eager(backend, tmp_path):
    """The encoder is a component of its own; the decoder's start token and forced end token are applied
    by the loop as generate applies them."""
    model = _tiny_bart()
    ids = torch.randint(3, 48, (2, 6), generator=torch.Generator().manual_seed(5))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    exporter = get_exporter(backend)
    generator = exporter.export_for_generation(model, inputs, exporter.config_class(dynamic=True))
    assert list(generator.components) == ["encoder", "prefill", "decode"]
    assert generator.prefill_rules == {"decoder_input_ids": "decoder_start"}
    assert generator.rules["encoder_outputs"] == "same" and generator.rules["past_key_values"] == "outputs"
    for n in (3, 7):
        with torch.no_grad():
            expected = model.generate(**inputs, max_new_tokens=n, do_sample=False)
        assert torch.equal(generator.generate(**inputs, max_new_tokens=n), expected)
    assert int(expected[0, -1]) == 2  # forced_eos_token_id at the last step
    generator.save(tmp_path)
    from exporters import load_generator

    assert torch.equal(load_generator(tmp_path).generate(**inputs, max_new_tokens=7), expected)


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_sliding_window_decode_runs_past_the_window(backend):
    """A sliding-window model (window 4) generates 12 tokens after a 5-token prompt: the decode component
    keeps one structure although eager's DynamicSlidingWindowLayer counts positions in a Python int and
    cuts its cache to the window. The export's plain layers keep every position; the model's own
    sliding mask limits each query to its window, so tokens equal eager's well past the window."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=64, sliding_window=4, initializer_range=0.2)
    model = MistralForCausalLM(cfg).eval()
    ids, mask = _prompt(2, 5, 3)
    inputs = {"input_ids": ids, "attention_mask": mask}
    exporter = get_exporter(backend)
    generator = exporter.export_for_generation(model, inputs, exporter.config_class(dynamic=True, max_dim=64))
    assert generator.rules["past_key_values"] == "outputs"
    with torch.no_grad():
        expected = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    assert len(set(expected[:, 5:].flatten().tolist())) >= 3
    assert torch.equal(generator.generate(**inputs, max_new_tokens=12), expected)


def test_multimodal_image_encoder_is_a_component_of_its_own(tmp_path):
    """A vision-language model's generate runs get_image_features before the first forward and passes
    the result as mm_encoder_outputs: that call is exported as the image_encoder component, and the
    loop feeds its outputs to the prefill (LlavaOnevision: a ModelOutput with a field set after
    construction and None leaves in hidden_states)."""
    from sweeps.generate import generate_inputs
    from sweeps.runner import reference

    tiny = reference("LlavaOnevisionForConditionalGeneration", init_range=0.2).tiny
    inputs = generate_inputs(tiny.inputs)
    exporter = get_exporter("dynamo")
    generator = exporter.export_for_generation(tiny.model, inputs, exporter.config_class(dynamic=True))
    assert list(generator.components) == ["image_encoder", "prefill", "decode"]
    assert generator.prefill_trees == {"mm_encoder_outputs": "encoder"}
    assert "pixel_values" in generator.prefill_inputs
    with torch.no_grad():
        expected = tiny.model.generate(**inputs, max_new_tokens=6, do_sample=False)
    assert torch.equal(generator.generate(**inputs, max_new_tokens=6), expected)
    generator.save(tmp_path)
    from exporters import load_generator

    assert torch.equal(load_generator(tmp_path).generate(**inputs, max_new_tokens=6), expected)


def test_ngram_bans_are_applied_as_generate_applies_them(llama):
    """no_repeat_ngram_size (decoder-only) and encoder_no_repeat_ngram_size (encoder-decoder): the loop
    bans the same tokens generate bans, so the tokens equal eager's, and differ from the unbanned ones."""
    import copy

    model = copy.deepcopy(llama)
    ids, mask = _prompt(2, 5, 7)
    inputs = {"input_ids": ids, "attention_mask": mask}
    with torch.no_grad():
        free = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    model.generation_config.no_repeat_ngram_size = 2
    with torch.no_grad():
        expected = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    assert not torch.equal(free, expected)  # the ban changes this prompt's tokens
    generator = get_exporter("dynamo").export_for_generation(model, inputs, get_exporter("dynamo").config_class(dynamic=True))
    assert torch.equal(generator.generate(**inputs, max_new_tokens=16), expected)

    # a decoder-only model's encoder_no_repeat_ngram_size: generate bans n-grams of the prompt (its inputs_tensor);
    # size 1 bans every prompt token
    model.generation_config.no_repeat_ngram_size = 0
    model.generation_config.encoder_no_repeat_ngram_size = 1
    with torch.no_grad():
        expected = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    assert not torch.equal(free, expected)
    generator = get_exporter("dynamo").export_for_generation(model, inputs, get_exporter("dynamo").config_class(dynamic=True))
    assert torch.equal(generator.generate(**inputs, max_new_tokens=16), expected)
    static = get_exporter("dynamo").export_for_generation(model, inputs, cache="static", max_cache_len=32)
    assert torch.equal(static.generate(**inputs, max_new_tokens=16), expected)  # the static loop bans them too

    bart = _tiny_bart()
    bart.generation_config.encoder_no_repeat_ngram_size = 2
    src = torch.randint(3, 48, (2, 6), generator=torch.Generator().manual_seed(5))
    inputs = {"input_ids": src, "attention_mask": torch.ones_like(src)}
    with torch.no_grad():
        expected = bart.generate(**inputs, max_new_tokens=8, do_sample=False)
    generator = get_exporter("dynamo").export_for_generation(bart, inputs, get_exporter("dynamo").config_class(dynamic=True))
    assert torch.equal(generator.generate(**inputs, max_new_tokens=8), expected)


def test_a_processor_the_loop_does_not_apply_is_refused_at_export(llama):
    import copy

    model = copy.deepcopy(llama)
    model.generation_config.repetition_penalty = 1.3
    with pytest.raises(GenerationError, match=r"sets \['repetition_penalty'\]"):
        get_exporter("dynamo").export_for_generation(model, {"input_ids": torch.tensor([[4, 5, 6]])})


def test_an_input_no_rule_explains_is_named():
    def call(ids, extra, n):
        return Call({"input_ids": ids, "noise": extra}, {}, {}, {})  # tensors, trees, constants, output trees

    seq = torch.tensor([[1, 2, 3, 4]])
    calls = [call(seq[:, :2], torch.tensor([1.0]), 0), call(seq[:, 2:3], torch.tensor([5.0]), 1),
             call(seq[:, 3:4], torch.tensor([-2.0]), 2)]
    with pytest.raises(GenerationError, match="decode-step input 'noise'"):
        infer_rules(calls, seq, 2)


def test_eager_generate_drops_only_the_inputs_generate_itself_refuses_as_unused():
    from sweeps.generate import _eager_generate

    class _Model:
        def __init__(self):
            self.calls = []

        def generate(self, **kwargs):
            self.calls.append(sorted(k for k in kwargs if isinstance(kwargs[k], torch.Tensor)))
            if "decoder_input_ids" in kwargs:
                raise ValueError("The following `model_kwargs` are not used by the model: ['decoder_input_ids'] "
                                 "(note: typos in the generate arguments will also show up in this list)")
            if "bad" in kwargs:
                raise ValueError("bad is not a valid input")
            return "generated"

    recorded = {}
    model = _Model()
    inputs = {"input_ids": torch.ones(1, 3, dtype=torch.long), "decoder_input_ids": torch.ones(1, 1, dtype=torch.long)}
    assert _eager_generate(model, inputs, recorded.__setitem__) == "generated"
    assert sorted(inputs) == ["input_ids"]  # the exports get the same inputs as the eager run
    assert recorded == {"inputs_generate_refused": ["decoder_input_ids"]}
    assert model.calls == [["decoder_input_ids", "input_ids"], ["input_ids"]]
    with pytest.raises(ValueError, match="bad is not a valid input"):  # any other refusal is raised
        _eager_generate(model, {"input_ids": torch.ones(1, 3), "bad": torch.ones(1)}, recorded.__setitem__)


def test_the_decoder_start_column_takes_its_batch_from_any_encoder_input():
    from exporters.generation.steps import derive_prefill_input

    generation = {"decoder_start_token_id": 7}
    for name, value in (("input_ids", torch.ones(3, 5, dtype=torch.long)), ("pixel_values", torch.ones(3, 3, 8, 8)),
                        ("input_values", torch.ones(3, 160)), ("flattened_patches", torch.ones(3, 4, 10))):
        assert torch.equal(derive_prefill_input("decoder_start", {name: value}, generation), torch.full((3, 1), 7))
    with pytest.raises(KeyError):  # nothing to read the batch from: the rule does not apply
        derive_prefill_input("decoder_start", {"attention_mask": torch.ones(3, 5)}, generation)


def test_suppressed_ids_past_the_vocabulary_mask_nothing_as_in_generate():
    from transformers.generation.logits_process import SuppressTokensAtBeginLogitsProcessor, SuppressTokensLogitsProcessor

    from exporters.generation.processors import process

    scores = torch.randn(2, 16)
    generation = {"suppress_tokens": [3, 220], "begin_suppress_tokens": [5, 50257]}
    ids = torch.zeros(2, 4, dtype=torch.long)
    expected = SuppressTokensLogitsProcessor([3, 220])(ids, scores)
    expected = SuppressTokensAtBeginLogitsProcessor([5, 50257], begin_index=4)(ids, expected)
    got = process(generation, scores, length=4, prompt_length=4, max_length=12)
    assert torch.equal(got == torch.finfo(got.dtype).min, expected == -float("inf"))


def test_a_generate_without_cache_that_refeeds_the_sequence_is_read_as_append_rules():
    from exporters.generation.steps import apply_tensor_rule, infer_rules

    seq = torch.tensor([[1, 2, 3, 4, 5, 6]])
    calls = [Call({"input_ids": seq[:, :n], "attention_mask": torch.ones(1, n, dtype=torch.long),
                   "position_ids": torch.arange(n)[None]}, {}, {}, {}) for n in (3, 4, 5, 6)]
    rules = infer_rules(calls, seq, prompt_length=3)
    assert rules == {"input_ids": "append_token", "attention_mask": "append_one", "position_ids": "append_position"}
    assert torch.equal(apply_tensor_rule("append_token", seq[:, :3], torch.tensor([9])), torch.tensor([[1, 2, 3, 9]]))
    cross = torch.arange(2 * 3 * 4).reshape(2, 3, 4)  # (batch, text position, image): the decode reads the last row
    assert torch.equal(apply_tensor_rule("repeat_last_row", cross, torch.tensor([9, 9])), cross[:, 2:3])
    segments = torch.zeros(2, 5, dtype=torch.long)  # PaliGemma: a generated token is in the causal suffix, 1
    assert torch.equal(apply_tensor_rule("ones_column", segments, torch.tensor([9, 9])), torch.ones(2, 1, dtype=torch.long))
    skipping = [calls[0], calls[1], calls[3]]  # lengths 3, 4, 6: neither one token nor the sequence so far
    with pytest.raises(GenerationError, match="neither one token per call nor the whole sequence"):
        infer_rules(skipping + [calls[3]], seq, prompt_length=3)


def test_one_indexed_positions_are_derived_from_the_mask_plus_one():
    from exporters.generation.steps import derive_prefill_input

    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    zero = derive_prefill_input("positions_from_mask", {"attention_mask": mask})
    assert torch.equal(zero, torch.tensor([[0, 0, 1, 2], [0, 1, 2, 3]]))
    assert torch.equal(derive_prefill_input("positions_from_mask_1", {"attention_mask": mask}), zero + 1)


def test_a_tree_updated_in_place_and_an_output_of_another_name_are_read_off_what_each_call_left():
    from exporters.generation.capture import flatten_tree
    from exporters.generation.generator import Generator
    from exporters.generation.steps import Returned

    seq = torch.tensor([[1, 2, 3, 4, 5]])
    caches = [(), (torch.full((1, 2), 1.0),), (torch.full((1, 3), 2.0),), (torch.full((1, 4), 3.0),)]
    embeds = torch.tensor([[7.0, 8.0]])

    def call(n, cache, extra):
        leaves, spec = flatten_tree("past_key_values", cache)
        tensors = {"input_ids": seq[:, n - 1:n] if n > 2 else seq[:, :2], **({"image_embeds": extra} if extra is not None else {})}
        return Call(tensors, {"past_key_values": (leaves, spec)}, {}, {})

    calls = [call(2, caches[0], None), call(3, caches[1], embeds), call(4, caches[2], embeds)]
    # each call left the cache it was given grown in place (not returned), and returned the embeddings
    left = [Returned({"past_key_values": list(caches[i + 1])}, {"logits": torch.zeros(1, 9), "hidden": embeds})
            for i in range(3)]
    rules = infer_rules(calls, seq, 2, left)
    assert rules == {"input_ids": "token", "image_embeds": "previous_output:hidden", "past_key_values": "updated"}
    with pytest.raises(GenerationError, match="'past_key_values'"):  # what a call left must be what the next takes
        infer_rules(calls, seq, 2, [Returned({"past_key_values": [c[0] + 1 for c in caches[i + 1:i + 2]]}, left[i].outputs)
                                    for i in range(3)])
    with pytest.raises(GenerationError, match="'image_embeds'"):  # no output holds the embeddings
        infer_rules(calls, seq, 2, [Returned(r.trees, {"logits": torch.zeros(1, 9)}) for r in left])
    # the loop reads both off the previous component's outputs; an empty cache carried "same" has no leaves
    loop = Generator({}, {"image_embeds": "previous_output:hidden", "past_key_values": "updated", "empty": "same"},
                     ["input_ids"], {"past_key_values": 1, "empty": 0}, {})
    outputs = {"logits": torch.zeros(1, 9), "hidden": embeds, "past_key_values.0": caches[2][0]}
    tensors, trees = loop._next_inputs({}, {}, outputs, list(outputs), torch.tensor([5]))
    assert tensors["image_embeds"] is embeds and trees == {"past_key_values": [caches[2][0]], "empty": []}


def test_state_a_forward_keeps_in_module_attributes_is_refused():
    from exporters.generation.steps import Returned, check_no_module_state

    def left(state):
        return Returned({}, {}, {"block.conv_state": state, "rotary.cos": torch.ones(16, 4)})

    check_no_module_state([left(torch.zeros(2, 3)), left(torch.ones(2, 3)), left(torch.ones(2, 3))], 2, "M")
    with pytest.raises(GenerationError, match=r"module attributes .*block\.conv_state"):
        check_no_module_state([left(torch.zeros(2, 3)), left(torch.ones(2, 3)), left(torch.ones(2, 3) * 2)], 2, "M")
