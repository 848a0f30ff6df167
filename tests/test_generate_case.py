"""sweeps/generate.py's rules around one generate item, without exporting: which classes are generate items,
which inputs the artifact loop is called with, a generate that needs a missing package, and an eager generate
that changes its model's generation config."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch


def test_classes_that_generate_no_tokens_are_no_generate_items():
    """NOT_TOKEN_GENERATORS names catalog classes listed under a generative task (stale names would hide
    nothing), and generative() leaves them out."""
    from sweeps.plugin import GENERATIVE_TASKS, NOT_TOKEN_GENERATORS, generative
    from sweeps.zoo import catalog

    entries = {e.class_name: e for e in catalog()}
    for name, reason in NOT_TOKEN_GENERATORS.items():
        assert name in entries, name
        assert any(t in GENERATIVE_TASKS for t in entries[name].tasks), name
        assert not generative(entries[name]) and len(reason) > 40
    assert generative(entries["LlamaForCausalLM"])


def test_pi0_cannot_generate():
    import transformers

    assert not transformers.PI0ForConditionalGeneration.can_generate()


def test_the_artifact_loop_is_called_with_what_generate_passed_to_its_calls():
    """Inputs eager generate passed to no captured call (CTRL's token_type_ids) are not the loop's: the static
    step takes tokens, a mask and the per-token extras its calls took; the dynamic loop its encoders' and
    prefill's inputs, a mask, and a decoder prompt where the prefill starts the decoder."""
    from sweeps.generate import _loop_takes

    plain = {"extras": {}, "embed_inputs": None, "prompt_inputs": None, "encoder": None}
    static = SimpleNamespace(cache="static", **plain)
    assert _loop_takes(static) == {"input_ids", "attention_mask"}
    static = SimpleNamespace(cache="static", **{**plain, "extras": {"token_type_ids": "repeat_last"}})  # per-token extras
    assert _loop_takes(static) == {"input_ids", "attention_mask", "token_type_ids"}
    # the embed component's inputs (a multimodal prompt); an encoder-decoder's encoder inputs and decoder prompt
    static = SimpleNamespace(cache="static", **{**plain, "embed_inputs": ["input_ids", "pixel_values"]})
    assert _loop_takes(static) == {"input_ids", "attention_mask", "pixel_values"}
    static = SimpleNamespace(cache="static", **{**plain, "prompt_inputs": ["pixel_values"]})  # a prompt component's
    assert _loop_takes(static) == {"input_ids", "attention_mask", "pixel_values"}
    static = SimpleNamespace(cache="static", **{**plain, "encoder": {"inputs": ["input_features"], "same": {}}})
    assert _loop_takes(static) == {"input_ids", "attention_mask", "input_features", "decoder_input_ids"}
    dynamic = SimpleNamespace(prefill_inputs=["input_ids"], prefill_rules={"position_ids": "positions_from_mask"})
    assert _loop_takes(dynamic) == {"input_ids", "attention_mask"}
    seq2seq = SimpleNamespace(prefill_inputs=["pixel_values"], prefill_rules={"decoder_input_ids": "decoder_start"})
    assert _loop_takes(seq2seq) == {"pixel_values", "attention_mask", "decoder_input_ids"}


def test_a_generate_that_needs_a_missing_package_is_blocked_like_a_build():
    from sweeps.generate import _eager_generate
    from sweeps.zoo import BlockedByPackage

    class _Model:
        def generate(self, **kwargs):
            raise ImportError("The default noise scheduler requires `surely_not_installed_pkg`. Install it")

    with pytest.raises(BlockedByPackage, match="generate needs surely_not_installed_pkg"):
        _eager_generate(_Model(), {"input_ids": torch.ones(1, 2, dtype=torch.long)}, {}.__setitem__)

    class _Installed:
        def generate(self, **kwargs):
            raise ImportError("this requires `torch` in some other way")

    with pytest.raises(ImportError) as info:  # an installed package: the error is the model's, raised as it is
        _eager_generate(_Installed(), {"input_ids": torch.ones(1, 2, dtype=torch.long)}, {}.__setitem__)
    assert not isinstance(info.value, BlockedByPackage)


def test_a_generate_that_reads_a_mask_it_was_not_given_gets_an_unpadded_prompts_mask():
    """generate builds an attention mask only for a forward that names one; VibeVoice's forward takes it through
    **kwargs and its _sample reads model_kwargs["attention_mask"] (KeyError without it). The item adds the all-ones
    mask, to the exports' inputs too, and records it; any other KeyError is raised."""
    from sweeps.generate import _eager_generate

    class _Model:
        def __init__(self):
            self.masks = []

        def generate(self, **kwargs):
            self.masks.append(kwargs.get("attention_mask"))
            if kwargs.get("attention_mask") is None:
                raise KeyError("attention_mask")
            return "generated"

    model, recorded = _Model(), {}
    inputs = {"input_ids": torch.ones(2, 3, dtype=torch.long)}
    assert _eager_generate(model, inputs, recorded.__setitem__) == "generated"
    assert torch.equal(inputs["attention_mask"], torch.ones(2, 3, dtype=torch.long))  # the exports get it too
    assert recorded == {"inputs_generate_added": ["attention_mask"]}
    assert model.masks[0] is None and torch.equal(model.masks[1], inputs["attention_mask"])

    class _OtherKey:
        def generate(self, **kwargs):
            raise KeyError("pixel_values")

    with pytest.raises(KeyError, match="pixel_values"):
        _eager_generate(_OtherKey(), {"input_ids": torch.ones(1, 2, dtype=torch.long)}, {}.__setitem__)

    class _Always:
        def generate(self, **kwargs):
            raise KeyError("attention_mask")

    given = {"input_ids": torch.ones(1, 2, dtype=torch.long), "attention_mask": torch.ones(1, 2, dtype=torch.long)}
    with pytest.raises(KeyError, match="attention_mask"):  # given a mask and still raising: the model's own error
        _eager_generate(_Always(), given, {}.__setitem__)


def test_eager_generate_leaves_the_generation_config_as_it_found_it():
    """Pop2Piano's generate updates model.generation_config with its keyword arguments: the export's own
    generate calls would get return_dict_in_generate=True; the config is put back and that is recorded."""
    from transformers import GenerationConfig

    from sweeps.generate import _eager_generate

    class _Model:
        generation_config = GenerationConfig(pad_token_id=0)

        def generate(self, **kwargs):
            self.generation_config.update(**{k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)})
            return "generated"

    model, recorded = _Model(), {}
    assert _eager_generate(model, {"input_ids": torch.ones(1, 2, dtype=torch.long)}, recorded.__setitem__) == "generated"
    assert model.generation_config.return_dict_in_generate is not True
    assert recorded == {"generation_config_restored": True}


def test_a_config_asking_for_beam_search_is_checked_greedy_and_says_so():
    """FSMT's config defaults to num_beams=5: the item checks greedy search on both sides, recorded."""
    from sweeps.generate import build_for_generate

    case = SimpleNamespace(entry=SimpleNamespace(class_name="FSMTForConditionalGeneration"))
    model, _, notes = build_for_generate(case, 0.2)
    assert model.generation_config.num_beams == 1
    assert notes["generation_config_set"]["num_beams"] == "1 (the model's config: 5)"
