"""benchmarks/peer_generate.py: the loop that judges the peer's prefill and decode components, on runners that
stand in for the peer's (the model's own forward, or one that gets the decode step wrong), and the generate
variants' names on our side."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import peer_generate as pg  # noqa: E402

from sweeps.generate import GenerateMismatch, eager_reference  # noqa: E402


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, initializer_range=0.5)
    model = LlamaForCausalLM(config).eval()
    inputs = {"input_ids": torch.randint(3, 64, (2, 5)), "attention_mask": torch.ones(2, 5, dtype=torch.long)}
    return model, inputs


class _Runner:
    """The peer runner's interface: keyword calls, ``metadata.kwargs`` the names it was traced with."""

    def __init__(self, forward, shift: float = 0.0):
        self.forward, self.shift = forward, shift
        self.metadata = types.SimpleNamespace(kwargs=("input_ids", "attention_mask", "position_ids",
                                                      "past_key_values", "use_cache", "cache_position"))
        self.seen: list[set[str]] = []

    def __call__(self, **kwargs):
        self.seen.append(set(kwargs))
        out = self.forward(**kwargs)
        out.logits = out.logits + self.shift
        return out


def test_the_loop_passes_runners_that_compute_what_the_model_does():
    model, inputs = _llama()
    ref = eager_reference(model, dict(inputs), {}, lambda k, v: None)
    runners = {"prefill": _Runner(model.forward), "decode": _Runner(model.forward)}
    assert pg._judge_loop(model, runners, inputs, ref, "dynamo", None)["judged_by"] == "loop"
    assert len(runners["prefill"].seen) == 2  # once per drive: teacher-forced, then free-running
    assert len(runners["decode"].seen) == 2 * (ref.new.shape[1] - 1)
    assert all(names <= set(runners["decode"].metadata.kwargs) for names in runners["decode"].seen)
    assert "forward" not in vars(model)  # the model's own forward is back


def test_the_loop_fails_a_decode_step_off_eager_at_its_step():
    model, inputs = _llama()
    ref = eager_reference(model, dict(inputs), {}, lambda k, v: None)
    runners = {"prefill": _Runner(model.forward), "decode": _Runner(model.forward, shift=1e-2)}
    with pytest.raises(GenerateMismatch, match="logits at step 1 "):
        pg._judge_loop(model, runners, inputs, ref, "dynamo", None)


def test_teacher_forcing_feeds_eager_tokens_whatever_the_runner_prefers():
    model, inputs = _llama()
    ref = eager_reference(model, dict(inputs), {}, lambda k, v: None)
    steps = ref.new.shape[1]
    wrong = (ref.new + 1) % 64
    out = pg.drive(model, {"prefill": _Runner(model.forward), "decode": _Runner(model.forward)}, inputs, steps,
                   teacher=wrong)
    assert torch.equal(out.sequences[:, ref.prompt:], wrong)


def test_generate_results_are_named_apart_from_the_forward_ones():
    from sweeps.report.load import Result
    from sweeps.report.summary import peer_variant

    gen = Result(nodeid="sweeps/test_generate.py::test_generate[onnx-static-LlamaForCausalLM]", outcome="pass",
                 model_class="LlamaForCausalLM", backend="onnx", variant="static")
    fwd = Result(nodeid="sweeps/test_export.py::test_export[onnx-static-LlamaForCausalLM]", outcome="pass",
                 model_class="LlamaForCausalLM", backend="onnx", variant="static")
    assert (peer_variant(gen), peer_variant(fwd)) == ("generate-static", "static")
