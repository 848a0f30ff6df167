"""GIT over a static cache: the model patch that keeps generate's 2-D mask (exporters/workarounds/models/git.py), and
the static form's count of the slots a prompt's call writes beyond its ids (exporters/generation/static_calls.py's
``extra_slots`` and ``prompt_extra_slots``; the step's cache gets them, static_loop.py writes the decode
tokens after them): Git writes its image positions (``image_patch_tokens``, 17 here) ahead of the prompt's text."""

from __future__ import annotations

import json

import pytest
import torch
from _written_cache import written_cache

IMAGE_SLOTS = 17  # (32 / 8) ** 2 + 1: Git's image positions, written at the prompt's call with no ids for them
PROMPT = 7


@pytest.fixture(scope="module")
def tiny():
    from transformers import GitConfig, GitForCausalLM

    torch.manual_seed(0)
    config = GitConfig(vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                                      "num_attention_heads": 2, "image_size": 32, "patch_size": 8},
                       vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                       max_position_embeddings=64, initializer_range=0.2, bos_token_id=1, eos_token_id=2,
                       pad_token_id=0)
    model = GitForCausalLM(config).eval()
    g = torch.Generator().manual_seed(1)
    inputs = {"input_ids": torch.randint(3, 64, (2, PROMPT), generator=g),
              "attention_mask": torch.ones(2, PROMPT, dtype=torch.long),
              "pixel_values": torch.randn(2, 3, 32, 32, generator=g)}
    return model, inputs


def _entries():
    from exporters.utils import DEFAULT_REGISTRY

    return [e for e in DEFAULT_REGISTRY.patches("dynamo") if ".git." in e.path]


def _generate(model, inputs, new, **cache):
    with torch.no_grad():
        return model.generate(**inputs, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                              return_dict_in_generate=True, output_logits=True, **cache)


def test_the_patch_is_found_in_the_models_folder():
    """Registered by its module being in exporters/workarounds/models/, nothing importing it."""
    from exporters.utils import workaround_modules

    assert "exporters.workarounds.models.git" in workaround_modules()
    assert [e.path for e in _entries()] == \
        ["transformers.models.git.modeling_git.GitForCausalLM.prepare_inputs_for_generation"]


@pytest.mark.parametrize("padded", [False, True])
def test_a_static_cache_of_the_image_slots_gives_the_default_generate_with_the_patch(tiny, padded):
    from transformers import StaticCache

    from exporters.utils import apply_patches

    model, inputs = tiny
    if padded:
        mask = inputs["attention_mask"].clone()
        mask[1, :2] = 0
        inputs = {**inputs, "attention_mask": mask}
    new = 5
    want = _generate(model, inputs, new)
    slots = IMAGE_SLOTS + PROMPT + new
    with pytest.raises(RuntimeError, match="same number of dimensions"):  # generate's 4-D mask: the defect patched
        _generate(model, inputs, new, past_key_values=StaticCache(config=model.config, max_cache_len=slots))
    with apply_patches(_entries()) as fired:
        got = _generate(model, inputs, new, past_key_values=StaticCache(config=model.config, max_cache_len=slots))
        dynamic = _generate(model, inputs, new)  # over a dynamic cache the original runs
        with pytest.raises((RuntimeError, IndexError), match="out of bounds"):  # a slot a token is too few
            _generate(model, inputs, new, past_key_values=StaticCache(config=model.config, max_cache_len=PROMPT + new))
    assert fired.names() == ["patch:dynamo:transformers.models.git.modeling_git.GitForCausalLM.prepare_inputs_for_generation"]
    assert torch.equal(got.sequences, want.sequences) and torch.equal(dynamic.sequences, want.sequences)
    for g, d, w in zip(got.logits, dynamic.logits, want.logits, strict=True):
        assert torch.equal(g, w) and torch.equal(d, w)
    assert len(set(want.sequences[:, PROMPT:].flatten().tolist())) > 2, "degenerate tiny model"


def test_the_capture_counts_the_slots_the_prompt_writes_beyond_its_ids(tiny):
    from _tiny_llama import tiny_llama

    from exporters.generation.capture import GenerationError
    from exporters.generation.static import _forward_arguments
    from exporters.generation.static_calls import Seen, prompt_extra_slots

    model, inputs = tiny
    assert prompt_extra_slots(model, inputs) == IMAGE_SLOTS  # over the default cache: 24 slots written for 7 ids
    with pytest.raises(GenerationError, match="same number of dimensions"):  # as the model is: both static caches fail
        _forward_arguments(model, inputs)
    seen = Seen()
    calls = _forward_arguments(model, inputs, patches=_entries(), seen=seen)
    assert seen.patched and seen.extra == IMAGE_SLOTS and not seen.fixed
    assert [c["input_ids"].shape for c in calls] == [(2, PROMPT), (2, 1), (2, 1)] and "pixel_values" in calls[0]
    llama = tiny_llama()  # a slot a token: nothing beyond
    ids = inputs["input_ids"]
    seen = Seen()
    _forward_arguments(llama, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, seen=seen)
    assert seen.extra == 0 and prompt_extra_slots(llama, {"input_ids": ids}) == 0


def test_extra_slots_are_counted_on_the_text_layers():
    """The fewest slots written beyond the tokens fed over the layers written with at least that many: a layer written
    with fewer (Mllama's cross-attention, the image's length) or more (the same, a longer image) does not count."""
    from exporters.generation.static_calls import extra_slots, fixed_layers

    cache = written_cache
    calls = [{"input_ids": torch.ones(1, PROMPT, dtype=torch.long)}, {"input_ids": torch.ones(1, 1, dtype=torch.long)}]
    fed = PROMPT + 1
    assert extra_slots(cache([(40, fed + IMAGE_SLOTS)] * 2), calls) == IMAGE_SLOTS
    assert extra_slots(cache([(fed, fed), (68, 68), (4, 4)]), calls) == 0  # Mllama's: the text's layers one a token
    assert extra_slots(cache([]), calls) == 0
    with_image = cache([(40, fed + IMAGE_SLOTS), (68, 68), (40, fed + IMAGE_SLOTS)])
    assert extra_slots(with_image, calls) == IMAGE_SLOTS
    assert fixed_layers(with_image, calls, IMAGE_SLOTS) == {1: ((1, 2, 68, 4), (1, 2, 68, 4))}


@pytest.mark.parametrize(("backend", "padded"), [("dynamo", False), ("onnx", False), ("dynamo", True)])
def test_the_static_form_sizes_its_cache_and_decodes_after_the_extra_slots(tiny, backend, padded, tmp_path):
    """max_cache_len counts tokens (16: the prompt's 7 and 9 new); the step's cache holds the 17 image slots beside them,
    and decode token i goes to slot 17 + 7 + i. Before: the export failed (generate's static cache refused, then a
    cache of a slot a token overflowed). Padded, the step takes the mask over the tokens' 16 slots, which Git widens
    over its image slots itself."""
    from exporters import get_exporter, load_generator
    from exporters.generation import GenerationError
    from exporters.parity import assert_close

    model, inputs = tiny
    if padded:
        mask = inputs["attention_mask"].clone()
        mask[1, :2] = 0
        inputs = {**inputs, "attention_mask": mask}
    generator = get_exporter(backend).export_for_generation(model, inputs, cache="static", max_cache_len=16)
    assert generator.takes_mask == padded  # generate passes no mask for rows unpadded
    assert generator.extra_slots == IMAGE_SLOTS and generator.cache_slots == 16 + IMAGE_SLOTS
    assert generator.prompt_slots(PROMPT) == IMAGE_SLOTS + PROMPT
    assert {shape[-2] for shape in generator.cache_shapes.values()} == {16 + IMAGE_SLOTS}
    new = 16 - PROMPT  # every token slot: the last decode token at slot 17 + 7 + 8 = 32, the cache's last
    want = _generate(model, inputs, new)
    got = generator.generate(**inputs, max_new_tokens=new, return_dict_in_generate=True, output_logits=True)
    assert torch.equal(got.sequences, want.sequences), (got.sequences.tolist(), want.sequences.tolist())
    assert_close({f"logits_{i}": t for i, t in enumerate(want.logits)},
                 {f"logits_{i}": t for i, t in enumerate(got.logits)}, backend)
    if backend == "onnx":  # the cache comes back: every slot eager's dynamic cache holds, image ones first
        written = IMAGE_SLOTS + PROMPT + new - 1
        assert_close({f"{i}.{part}": getattr(layer, part) for i, layer in enumerate(want.past_key_values.layers)
                      for part in ("keys", "values")},
                     {f"{i}.{part}": got.cache[f"past_{i}_{part[:-1]}"][..., :written, :]
                      for i in range(len(want.past_key_values.layers)) for part in ("keys", "values")}, backend)
    with pytest.raises(GenerationError, match=r"a prompt of 7 and the 17 slots its call writes beyond them plus "
                                              r"max_new_tokens=11 needs 34 cache slots; max_cache_len is 16 \(\+ 17 "
                                              r"extra slots: 33\) \(at most 10 new tokens"):
        generator.generate(**inputs, max_new_tokens=11)
    generator.save(tmp_path)
    with open(tmp_path / "generator.json") as f:
        assert json.load(f)["extra_slots"] == IMAGE_SLOTS
    loaded = load_generator(tmp_path)
    assert loaded.extra_slots == IMAGE_SLOTS
    assert torch.equal(loaded.generate(**inputs, max_new_tokens=new), want.sequences)


def test_a_loop_refuses_extra_slots_it_cannot_write():
    from exporters.generation import GenerationError, StaticGenerator

    with pytest.raises(GenerationError, match="not through a prompt fed one token a call"):
        StaticGenerator({}, batch=1, max_cache_len=8, state="inputs", cache_shapes={}, takes_positions=False,
                        takes_mask=False, generation={}, token_by_token=True, extra_slots=3)
