"""A generate that re-feeds the sequence with a column of its own appended at every call (XLM's
prepare_inputs_for_generation: the ids, then mask_token_id; langs filled with lang_id): the prefill rules that
carry a constant read off the captured call (``append_column``, ``filled_like``), the decode rule that puts the
chosen token before that column (``insert_token``), and the refusal where the captured tokens cannot tell it
from appending after the column (exporters/generation/steps.py)."""

from __future__ import annotations

import pytest
import torch

from exporters.generation import GenerationError
from exporters.generation.capture import Call
from exporters.generation.steps import (
    AmbiguousTokenRule,
    apply_tensor_rule,
    derive_prefill_input,
    infer_prefill_rules,
    infer_rules,
)

MASK, LANG = 5, 3  # LANG not 1: a fill of ones is also "append_one"


def _xlm_calls(prompt: torch.Tensor, tokens: torch.Tensor, langs_first: bool = False) -> list[Call]:
    """The forward calls XLM's generate makes: the sequence so far, then the mask column; langs like it."""
    calls = []
    for n in range(tokens.shape[1] + 1):
        ids = torch.cat([prompt, tokens[:, :n], torch.full((prompt.shape[0], 1), MASK)], dim=-1)
        tensors = {"input_ids": ids, "langs": torch.full_like(ids, LANG)}
        calls.append(Call(dict(reversed(tensors.items())) if langs_first else tensors, {}, {}))
    return calls


def test_an_appended_id_column_and_a_filled_input_are_prefill_rules_carrying_their_value():
    prompt = torch.tensor([[7, 8, 9], [10, 11, 12]])
    given = {"input_ids": prompt, "attention_mask": torch.ones_like(prompt)}
    for langs_first in (False, True):  # langs is derived after the ids it is shaped like, whatever the call's order
        (prefill, *_) = _xlm_calls(prompt, torch.zeros(2, 0, dtype=torch.long), langs_first)
        rules = infer_prefill_rules(prefill, given)
        assert list(rules.items()) == [("input_ids", f"append_column:input_ids:{MASK}"),
                                       ("langs", f"filled_like:input_ids:{LANG}")]
        derived: dict[str, torch.Tensor] = {}
        for name, rule in rules.items():  # as the loop derives them: in order, each seeing those before it
            derived[name] = derive_prefill_input(rule, given, None, derived)
            assert torch.equal(derived[name], prefill.tensors[name]) and derived[name].dtype == torch.long
    other = torch.tensor([[1, 2], [3, 4]])  # another prompt: the constants, not the captured values, carry over
    assert torch.equal(derive_prefill_input(f"append_column:input_ids:{MASK}", {"input_ids": other}),
                       torch.tensor([[1, 2, MASK], [3, 4, MASK]]))


def test_an_appended_column_that_is_not_one_id_is_no_rule():
    prompt = torch.tensor([[7, 8, 9], [10, 11, 12]])
    ids = torch.cat([prompt, torch.tensor([[MASK], [MASK + 1]])], dim=-1)  # a column that differs by row
    with pytest.raises(GenerationError, match="'input_ids', which the caller does not give"):
        infer_prefill_rules(Call({"input_ids": ids}, {}, {}), {"input_ids": prompt})
    mixed = torch.full((2, 4), LANG)
    mixed[0, 0] = LANG + 1  # not one value throughout: no fill
    with pytest.raises(GenerationError, match="'langs'"):
        infer_prefill_rules(Call({"input_ids": prompt, "langs": mixed}, {}, {}), {"input_ids": prompt})


def test_the_chosen_token_goes_before_the_trailing_column_the_prefill_appended():
    prompt = torch.tensor([[7, 8, 9], [10, 11, 12]])
    tokens = torch.tensor([[20, 21, 22], [23, 24, 25]])
    calls = _xlm_calls(prompt, tokens)
    seq = torch.cat([prompt, tokens], dim=-1)
    prefill_rules = infer_prefill_rules(calls[0], {"input_ids": prompt})
    rules = infer_rules(calls, seq, prompt.shape[1], None, prefill_rules)
    assert rules == {"input_ids": "insert_token", "langs": "append_last"}
    step = apply_tensor_rule("insert_token", calls[1].tensors["input_ids"], tokens[:, 1])
    assert torch.equal(step, calls[2].tensors["input_ids"])
    # without the prefill's column the rule is not tried: nothing explains the ids
    with pytest.raises(GenerationError, match="decode-step input 'input_ids'"):
        infer_rules(calls, seq, prompt.shape[1])


def test_tokens_that_all_equal_the_appended_id_cannot_tell_insert_from_append():
    prompt = torch.tensor([[7, 8, 9], [10, 11, 12]])
    tokens = torch.full((2, 3), MASK)  # a tiny tied model predicting the mask token at the mask's position
    calls = _xlm_calls(prompt, tokens)
    prefill_rules = infer_prefill_rules(calls[0], {"input_ids": prompt})
    with pytest.raises(AmbiguousTokenRule) as info:
        infer_rules(calls, torch.cat([prompt, tokens], dim=-1), prompt.shape[1], None, prefill_rules)
    assert info.value.token_id == MASK


@pytest.fixture(scope="module")
def xlm():
    from transformers import XLMConfig, XLMWithLMHeadModel

    def build(**kwargs):
        config = XLMConfig(vocab_size=64, emb_dim=32, n_layers=2, n_heads=4, max_position_embeddings=64, n_langs=4,
                           **kwargs)
        torch.manual_seed(0)
        return XLMWithLMHeadModel(config).eval()

    # at init_std 0.2 the tokens vary and differ from the mask id; at transformers' 0.02 the tied model predicts
    # the mask token it is given at the last position, every step
    return {"varied": build(init_std=0.2, embed_init_std=0.2, mask_token_id=MASK, lang_id=LANG),
            "mask_only": build(mask_token_id=MASK, lang_id=LANG)}


@pytest.mark.parametrize("kind", ["varied", "mask_only"])
def test_xlm_generates_like_eager_through_the_exported_prefill_and_decode(xlm, kind):
    from exporters import get_exporter

    model = xlm[kind]
    ids = torch.tensor([[9, 17, 33, 41, 12], [8, 30, 22, 14, 50]])
    eager = model.generate(input_ids=ids, max_new_tokens=6, do_sample=False)
    new = eager[:, ids.shape[1]:]
    assert (len(set(new.flatten().tolist())) >= 3) == (kind == "varied")
    exporter = get_exporter("dynamo")
    generator = exporter.export_for_generation(model, {"input_ids": ids}, exporter.config_class(dynamic=True))
    # mask_only: every token generate chose was the mask id; the export captured again with it suppressed
    assert generator.rules["input_ids"] == "insert_token"
    assert generator.prefill_rules == {"input_ids": f"append_column:input_ids:{MASK}",
                                       "langs": f"filled_like:input_ids:{LANG}"}
    assert generator.prefill_inputs == ["input_ids"]
    assert torch.equal(generator.generate(input_ids=ids, max_new_tokens=6), eager)
    other = torch.tensor([[3, 4, 5], [6, 7, 8], [9, 10, 11]])  # another batch and prompt length
    assert torch.equal(generator.generate(input_ids=other, max_new_tokens=4),
                       model.generate(input_ids=other, max_new_tokens=4, do_sample=False))


def test_the_whole_sequence_step_reads_an_appended_column_and_filled_inputs_off_the_calls():
    from exporters.generation.static_whole import appended_column, filled_inputs, rereads_sequence

    prompt = torch.tensor([[7, 8, 9], [10, 11, 12]])
    calls = [{**c.tensors, "use_cache": True} for c in _xlm_calls(prompt, torch.tensor([[20, 21], [23, 24]]))]
    assert appended_column(calls, {"input_ids": prompt}) == MASK and not rereads_sequence(calls)
    assert filled_inputs(calls) == {"langs": LANG}
    assert appended_column(calls, {"input_ids": prompt[:, :2]}) is None  # the first call is not the caller's + column
    plain = [{"input_ids": torch.cat([prompt, torch.full((2, n), 4)], dim=-1)} for n in range(3)]
    assert appended_column(plain, {"input_ids": prompt}) is None  # a plain re-fed sequence (OpenAIGPT) has none


@pytest.mark.parametrize("kind", ["varied", "mask_only"])
def test_xlm_generates_like_eager_through_the_static_whole_sequence_step(xlm, kind):
    from exporters import get_exporter

    model = xlm[kind]
    ids = torch.tensor([[9, 17, 33, 41, 12], [8, 30, 22, 14, 50]])
    exporter = get_exporter("dynamo")
    generator = exporter.export_for_generation(model, {"input_ids": ids}, exporter.config_class(), cache="static",
                                               max_cache_len=16)
    assert generator.whole_sequence and not generator.extras  # the step appends the mask column and fills langs
    assert torch.equal(generator.generate(input_ids=ids, max_new_tokens=6),
                       model.generate(input_ids=ids, max_new_tokens=6, do_sample=False))


def test_ort_genai_runs_xlm_with_the_mask_column_made_inside_its_graph(xlm, tmp_path):
    from exporters import get_exporter
    from exporters.generation.genai import export_genai_folder, run_ort_genai

    model, prompt = xlm["varied"], [9, 17, 33, 41, 12]
    onnx = get_exporter("onnx")
    artifact = export_genai_folder(tmp_path, onnx, model, {"input_ids": torch.tensor([prompt])},
                                   onnx.config_class(dynamic=True, max_dim=32), {"eos_token_id": 1, "pad_token_id": 2})
    assert artifact.extra_metadata["cache_layout"]["whole_sequence"] == {"context": 32}
    want = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[0, len(prompt):].tolist()
    assert MASK not in want and len(set(want)) >= 3, want  # the tokens tell the inserted column from an appended one
    got, _ = run_ort_genai(str(tmp_path), prompt, 6)
    assert got == want


def _xlnet_calls(prompt: torch.Tensor, tokens: torch.Tensor, width: int = 16) -> list[Call]:
    """The forward calls XLNet's generate makes: the prompt and a dummy 0, then the last token fed, the chosen one
    and the dummy, with perm_mask / target_mapping over them and mems: the call before's output less 2 positions."""
    batch, calls, seq = prompt.shape[0], [], prompt
    for n in range(tokens.shape[1] + 1):
        if n:
            seq = torch.cat([seq, tokens[:, n - 1:n]], dim=-1)
        ids = torch.cat([seq if n == 0 else seq[:, -2:], torch.zeros(batch, 1, dtype=torch.long)], dim=-1)
        length = ids.shape[1]
        perm = torch.zeros(batch, length, length)
        perm[:, :, -1] = 1
        target = torch.zeros(batch, 1, length)
        target[:, 0, -1] = 1
        trees = {} if n == 0 else {"mems": ([m[:-2] for m in calls[-1].output_trees["mems"][0]], None)}
        call = Call({"input_ids": ids, "perm_mask": perm, "target_mapping": target}, trees, {})
        out_len = (trees["mems"][0][0].shape[0] if trees else 0) + length
        call.output_trees = {"mems": ([torch.full((out_len, batch, width), float(n * 10 + i)) for i in range(2)], None)}
        calls.append(call)
    return calls


def test_xlnets_window_masks_and_cut_mems_are_read_as_rules():
    from exporters.generation.steps import apply_tensor_rule

    prompt = torch.tensor([[7, 8, 9, 10], [11, 12, 13, 14]])
    tokens = torch.tensor([[20, 21, 22], [23, 24, 25]])
    calls = _xlnet_calls(prompt, tokens)
    prefill_rules = infer_prefill_rules(calls[0], {"input_ids": prompt})
    assert prefill_rules == {"input_ids": "append_column:input_ids:0", "perm_mask": "last_onehot:input_ids:all:float32",
                             "target_mapping": "last_onehot:input_ids:1:float32"}
    rules = infer_rules(calls, torch.cat([prompt, tokens], dim=-1), prompt.shape[1], None, prefill_rules)
    assert rules == {"input_ids": "window_token:1", "perm_mask": "as_prefill", "target_mapping": "as_prefill",
                     "mems": "outputs_trimmed:2"}
    assert torch.equal(apply_tensor_rule("window_token:1", calls[1].tensors["input_ids"], tokens[:, 1]),
                       calls[2].tensors["input_ids"])
    # mems cut by another count than the one read off the first pair: no rule explains them
    calls[2].trees["mems"] = ([m[:-1] for m in calls[1].output_trees["mems"][0]], None)
    with pytest.raises(GenerationError, match="'mems'"):
        infer_rules(calls, torch.cat([prompt, tokens], dim=-1), prompt.shape[1], None, prefill_rules)


def test_xlnet_generates_like_eager_through_the_exported_prefill_and_decode():
    from transformers import XLNetConfig, XLNetLMHeadModel

    from exporters import get_exporter

    config = XLNetConfig(vocab_size=64, d_model=32, n_layer=2, n_head=4, d_inner=64, initializer_range=0.5)
    torch.manual_seed(1)  # a draw whose tokens vary for both prompts (seed 0 repeats two tokens)
    model = XLNetLMHeadModel(config).eval()
    ids = torch.tensor([[9, 17, 33, 41, 12, 40], [8, 30, 22, 14, 50, 16]])  # no pad id (5)
    exporter = get_exporter("dynamo")
    generator = exporter.export_for_generation(model, {"input_ids": ids}, exporter.config_class(dynamic=True))
    assert generator.rules["input_ids"] == "window_token:1" and generator.rules["mems"] == "outputs_trimmed:2"
    for prompt in (ids, torch.tensor([[3, 4, 7, 6], [7, 8, 9, 10], [11, 12, 13, 14]])):
        eager = model.generate(input_ids=prompt, max_new_tokens=6, do_sample=False)
        assert len(set(eager[:, prompt.shape[1]:].flatten().tolist())) >= 3
        assert torch.equal(generator.generate(input_ids=prompt, max_new_tokens=6), eager)
