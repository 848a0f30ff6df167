"""The decode graph run at past length 0 as the prefill (exporters/generation/empty_past.py): taken where the
captured calls, an eager check and the artifact agree; otherwise the prefill stays its own component and the
generator says why. End-to-end equality with eager generate for the one-graph form is tests/test_generation.py's
(its tiny Llama takes this form on dynamo and onnx)."""

from __future__ import annotations

import pytest
import torch
from _tiny_llama import tiny_llama

from exporters import DynamoConfig, get_exporter
from exporters.base import ExportStageError
from exporters.generation import empty_past
from exporters.generation.capture import Call, flatten_tree
from exporters.generation.empty_past import PREFILL_BY_DECODE


class _Cached(torch.nn.Module):
    """logits = a running sum of the token embeddings over the cache and the new ids; ``branch`` adds 1 to the
    logits of a call given no cache (a model whose first call takes another path, as Mamba's does on
    ``cache_params is None``)."""

    def __init__(self, branch: bool = False, one_token_path: bool = False):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 4)
        self.branch, self.one_token_path = branch, one_token_path

    def forward(self, input_ids, past_key_values=()):
        new = self.embed(input_ids)
        if self.one_token_path and input_ids.shape[1] == 1:  # the same values, but a guard on the token dim
            new = new * 1
        past = past_key_values[0] if past_key_values else new[:, :0]
        cache = torch.cat([past, new], dim=1)
        logits = cache.cumsum(1)[:, -input_ids.shape[1]:]
        if self.branch and not past_key_values:
            logits = logits + 1
        return {"logits": logits, "past_key_values": (cache,)}


def _calls(model: torch.nn.Module, prompt: int = 3) -> list[Call]:
    ids = torch.arange(1, prompt + 1)[None]
    calls, cache = [], ()
    for step in range(3):
        leaves, spec = flatten_tree("past_key_values", cache)
        given = ids if step == 0 else torch.tensor([[prompt + step]])
        calls.append(Call({"input_ids": given}, {"past_key_values": (leaves, spec)}, {}))
        with torch.no_grad():
            cache = model(given, cache)["past_key_values"]
    return calls


_RULES = {"input_ids": "token", "past_key_values": "outputs"}


def test_the_calls_say_where_the_decode_graph_may_run_the_prompt():
    calls = _calls(_Cached())
    assert empty_past.refusal(calls, _RULES) is None
    assert empty_past.past_axes(calls, "past_key_values") == [1]  # grows by one along dim 1 a step
    assert "encoder" in empty_past.refusal(calls, _RULES, more_parts={"encoder": object()})
    other = [Call({**calls[0].tensors, "attention_mask": torch.ones(1, 3)}, calls[0].trees, {}), *calls[1:]]
    assert "the prefill takes ['attention_mask', 'input_ids']" in empty_past.refusal(other, _RULES)
    fixed = [calls[0], *(Call(c.tensors, {"past_key_values": ([torch.zeros(1, 5, 4)], c.trees["past_key_values"][1])}, {})
                         for c in calls[1:])]
    assert "does not grow by one along one axis" in empty_past.refusal(fixed, _RULES)


def test_the_eager_check_finds_a_first_call_computed_another_way():
    same, branching = _Cached().eval(), _Cached(branch=True).eval()
    branching.load_state_dict(same.state_dict())
    def problem_of(model):
        calls = _calls(model)
        return empty_past.eager_problem(model, calls, [1], empty_past.component_outputs(model, calls[0], []), "dynamo", [])

    assert problem_of(same) is None
    problem = problem_of(branching)
    assert problem is not None and "logits" in problem


def test_the_two_decode_steps_join_into_one_two_token_call():
    calls = _calls(_Cached(), prompt=3)
    joined = empty_past.two_token_call(calls)
    assert joined.tensors["input_ids"].tolist() == [[4, 5]]  # both steps' tokens, over the first step's cache
    assert joined.trees is calls[1].trees and joined.constants == calls[1].constants
    masked = [Call({**c.tensors, "attention_mask": torch.ones(1, 3 + i)}, c.trees, {}) for i, c in enumerate(calls)]
    assert empty_past.two_token_call(masked).tensors["attention_mask"].shape == (1, 5)  # the second step's mask
    assert empty_past.two_token_call(_calls(_Cached(), prompt=1)) is None  # a one-token prompt shows no token dim

    class Narrows:  # a backend whose one-token trace holds no prompt: the step is traced at two tokens
        decode_traced_at_one_token = "its reason"

    assert empty_past.decode_example(Narrows(), calls).tensors["input_ids"].shape == (1, 2)
    assert empty_past.decode_example(get_exporter("onnx"), calls) is calls[1]  # elsewhere at the captured step


def _export_one_graph(model: torch.nn.Module, two_tokens: bool = True) -> tuple[list[int], tuple]:
    from exporters.generation.component import FlatComponent, flat_call_inputs

    calls, exporter, traced = _calls(model, prompt=4), get_exporter("dynamo"), []

    def export_decode(empty, call):
        traced.append(call.tensors["input_ids"].shape[1])
        config = DynamoConfig(dynamic=True, max_dim=16, may_be_empty=tuple(empty))
        return exporter.export(FlatComponent(model, call).eval(), flat_call_inputs(call), config)

    want = empty_past.component_outputs(model, calls[0], [])
    example = empty_past.two_token_call(calls) if two_tokens else calls[1]
    return traced, empty_past.export_one_graph(export_decode, lambda: "the prefill's artifact", calls, [1], want, "dynamo",
                                               "input_ids", example, lambda call: empty_past.component_outputs(model, call, []))


def test_the_decode_graph_is_traced_at_two_tokens_and_again_at_one_where_that_fails_the_step():
    traced, (components, empty, why) = _export_one_graph(_Cached().eval())
    assert traced == [2] and list(components) == ["decode"] and why is None
    assert empty == {"past_key_values__0": {"shape": [1, 0, 4], "dtype": "float32", "batch_dim": 0}}
    # `if seq == 1` at a two-token trace: a guard that bounds the token dim from 2, so the step is traced again at one
    # token (where the guard bounds it to 1, so the prompt needs its own component)
    traced, (components, empty, why) = _export_one_graph(_Cached(one_token_path=True).eval())
    assert traced == [2, 1] and components["prefill"] == "the prefill's artifact" and empty is None
    assert why.startswith("the decode step traced at two tokens fails at one: refused:")
    # a two-token trace that fails over the prompt is not kept as the step either: its checks covered one step's sizes
    traced, (components, empty, why) = _export_one_graph(_Cached(branch=True).eval())
    assert traced == [2, 1] and components["prefill"] == "the prefill's artifact" and "logits" in why
    traced, (components, empty, why) = _export_one_graph(_Cached().eval(), two_tokens=False)  # at the captured step
    assert traced == [1] and list(components) == ["decode"] and why is None


def test_a_backend_whose_one_token_trace_cannot_run_the_prompt_keeps_the_prefill(monkeypatch):
    llama = tiny_llama()
    exporter = get_exporter("dynamo")
    config = DynamoConfig(dynamic=True, max_dim=64)
    ids = torch.tensor([[5, 9, 17, 30], [3, 4, 5, 6]])
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    one = exporter.export_for_generation(llama, inputs, config)
    assert list(one.components) == ["decode"] and one.metadata["prefill"] == PREFILL_BY_DECODE
    past = one.components["decode"].dynamic_dims["past_key_values__0"]
    assert [spec["min"] for spec in past.values()] == [1, 0]  # batch from 1, the past axis from 0
    monkeypatch.setattr(type(exporter), "decode_traced_at_one_token", "this backend's reason", raising=False)
    assert list(exporter.export_for_generation(llama, inputs, config).components) == ["decode"]  # traced at two tokens
    short = {"input_ids": ids[:, :1], "attention_mask": torch.ones_like(ids[:, :1])}  # no token dim to join two steps on
    two = exporter.export_for_generation(llama, short, config)
    assert list(two.components) == ["prefill", "decode"]
    assert two.metadata["prefill"] == "its own component: this backend's reason"
    assert "ExecuTorch" in get_exporter("executorch").decode_traced_at_one_token
    assert get_exporter("onnx").decode_traced_at_one_token is None
    with torch.no_grad():
        want = llama.generate(**inputs, max_new_tokens=6, do_sample=False)
        want_short = llama.generate(**short, max_new_tokens=6, do_sample=False)
    assert torch.equal(one.generate(**inputs, max_new_tokens=6), want)
    assert torch.equal(two.generate(**short, max_new_tokens=6), want_short)


def test_bad_empty_past_records_and_dims_are_refused_by_name():
    with pytest.raises(ValueError, match=r"empty_past\['past_key_values__0'\]: dtype 'load' is not a torch dtype"):
        empty_past.zeros_for({"past_key_values__0": {"shape": [1, 0], "dtype": "load", "batch_dim": 0}}, 2)
    assert empty_past.zeros_for({"k": {"shape": [1, 2, 0], "dtype": "float16", "batch_dim": 0}}, 3)["k"].shape == (3, 2, 0)
    with pytest.raises(ExportStageError, match=r"may_be_empty names \('cache', 2\)"):
        get_exporter("dynamo").export(_Cached(), {"input_ids": torch.tensor([[1, 2]])},
                                      DynamoConfig(dynamic=True, may_be_empty=(("cache", 2),)))
