"""The static form of a model that keeps a state of its own instead of a transformers Cache
(exporters/generation/static_state.py): Rwkv's state list, xLSTM's xLSTMCache."""

from __future__ import annotations

import json

import pytest
import torch

from exporters import get_exporter, load_generator
from exporters.generation import GenerationError
from exporters.generation.static_state import OwnStateStep

PROMPT = [5, 9, 17, 30, 12, 7]


@pytest.fixture(scope="module")
def rwkv():
    from transformers import RwkvConfig, RwkvForCausalLM

    torch.manual_seed(0)
    config = RwkvConfig(vocab_size=64, context_length=64, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32,
                        intermediate_size=64, rescale_every=0)
    model = RwkvForCausalLM(config).eval()
    with torch.no_grad():  # a head that tells tokens apart (its default init gives a few repeated ones)
        model.head.weight.normal_(0, 1.0)
    return model


@pytest.fixture(scope="module")
def xlstm():
    from transformers import xLSTMConfig, xLSTMForCausalLM

    torch.manual_seed(0)
    config = xLSTMConfig(vocab_size=64, hidden_size=32, embedding_dim=32, num_hidden_layers=2, num_blocks=2, num_heads=4,
                         qk_dim_factor=2.0, v_dim_factor=2.0)
    return xLSTMForCausalLM(config).eval()


def _eager(model, ids, n=8):
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, eos_token_id=None, pad_token_id=0)


def _genai_generates_like_eager(model, folder):
    """The model's onnxruntime-genai folder (end token 63, which the tiny models here do not generate in 8 steps),
    its greedy run against eager generate: the artifact and the runner's stats."""
    from exporters.generation.genai import export_genai_folder, run_ort_genai

    onnx = get_exporter("onnx")
    ids = torch.tensor([PROMPT])
    artifact = export_genai_folder(folder, onnx, model, {"input_ids": ids}, onnx.config_class(dynamic=True, max_dim=64),
                                   {"eos_token_id": 63})
    want = _eager(model, ids)[0, len(PROMPT):].tolist()
    assert 63 not in want
    got, stats = run_ort_genai(str(folder), PROMPT, 8)
    assert got == want
    return artifact, stats


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_rwkv_state_list_is_carried_from_its_own_starting_value(rwkv, backend, tmp_path):
    ids = torch.tensor([PROMPT])
    generator = get_exporter(backend).export_for_generation(rwkv, {"input_ids": ids}, cache="static", max_cache_len=16)
    assert generator.token_by_token
    assert sorted(generator.cache_shapes) == [f"past_state_{j}" for j in range(5)]
    want = _eager(rwkv, ids)
    assert len(set(want[0, len(PROMPT):].tolist())) > 3, want
    assert torch.equal(generator.generate(ids, max_new_tokens=8, eos_token_id=[]), want)
    # a second sequence starts again from the model's starting state, not from the first one's
    assert torch.equal(generator.generate(ids, max_new_tokens=8, eos_token_id=[]), want)
    generator.save(tmp_path / "g")
    assert torch.equal(load_generator(tmp_path / "g").generate(ids, max_new_tokens=8, eos_token_id=[]), want)


def test_rwkv_rows_mixed_by_its_one_token_path_get_a_prompt_component(rwkv):
    """transformers' Rwkv one-token branch broadcasts the shifted state [batch, hidden] against the token [batch, 1,
    hidden], mixing the rows of a batch over 1; its prompt path does not. Eager generate runs the prompt through the
    prompt path, so the step fed the prompt one token a call was 12.9 off at the first logits (measured at export:
    static_prefill.py's prompt_path_differs). A prompt component (the step's forward over the whole prompt) runs it
    instead, the state passing between the two programs: eager's tokens and logits. One row keeps the one program."""
    ids = torch.tensor([PROMPT, [3, 8, 40, 22, 11, 2]])
    generator = get_exporter("dynamo").export_for_generation(rwkv, {"input_ids": ids}, cache="static", max_cache_len=16)
    assert sorted(generator.components) == ["prompt", "step"] and generator.state == "inputs"
    assert "fed one token a call" in generator.metadata["prompt_component"]
    assert sorted(generator.cache_shapes) == [f"past_state_{j}" for j in range(5)]
    with torch.no_grad():
        eager = rwkv.generate(input_ids=ids, max_new_tokens=8, min_new_tokens=8, do_sample=False, eos_token_id=None,
                              pad_token_id=0, return_dict_in_generate=True, output_logits=True)
    out = generator.generate(ids, max_new_tokens=8, eos_token_id=[], teacher_tokens=eager.sequences[:, -8:],
                             return_dict_in_generate=True, output_logits=True)
    for want, got in zip(eager.logits, out.logits, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(generator.generate(ids, max_new_tokens=8, eos_token_id=[]), eager.sequences)
    one_row = get_exporter("dynamo").export_for_generation(rwkv, {"input_ids": ids[:1]}, cache="static", max_cache_len=16)
    assert list(one_row.components) == ["step"] and one_row.state == "buffers"


def test_the_starting_state_is_the_one_the_model_builds(rwkv):
    step = OwnStateStep(rwkv, "state", batch=1, max_cache_len=16, state="buffers")
    starts = [getattr(step, f"initial_{j}") for j in range(5)]
    assert all(bool((s == 0).all()) for s in starts[:4])
    assert bool((starts[4] == -1e30).all())  # Rwkv's running maximum: zero here would change the arithmetic
    assert not any(name.startswith("initial_") for name in step.state_dict())  # constants, not state


def test_xlstm_cache_object_is_rebuilt_around_the_carried_tensors(xlstm):
    ids = torch.tensor([PROMPT])
    generator = get_exporter("dynamo").export_for_generation(xlstm, {"input_ids": ids}, cache="static", max_cache_len=16)
    assert len(generator.cache_shapes) == 3 * xlstm.config.num_hidden_layers  # rnn_state, not seqlen_offset
    want = _eager(xlstm, ids)
    assert torch.equal(generator.generate(ids, max_new_tokens=8, eos_token_id=[]), want)


@pytest.fixture(scope="module")
def minimax():
    from transformers import MiniMaxConfig, MiniMaxForCausalLM

    torch.manual_seed(0)
    config = MiniMaxConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=8, num_local_experts=2, num_experts_per_tok=1,
                           layer_types=["linear_attention", "full_attention"], block_size=4, initializer_range=0.2)
    return MiniMaxForCausalLM(config).eval()


def test_minimax_runs_over_the_step_cache_as_its_own_cache_class(minimax):
    """MiniMax refuses any cache but a MiniMaxCache: the step's static cache is one (static_caches.py), its
    lightning-attention state carried as a linear layer's recurrent state, its attention layers as slots."""
    ids = torch.tensor([PROMPT])
    generator = get_exporter("dynamo").export_for_generation(minimax, {"input_ids": ids}, cache="static", max_cache_len=16)
    assert generator.token_by_token
    want = _eager(minimax, ids)
    assert len(set(want[0, len(PROMPT):].tolist())) > 3, want
    assert torch.equal(generator.generate(ids, max_new_tokens=8, eos_token_id=[]), want)
    assert torch.equal(generator.generate(ids, max_new_tokens=8, eos_token_id=[]), want)  # the state starts over


def test_a_cache_of_its_own_class_without_an_adapter_is_refused_by_name(minimax, monkeypatch):
    from exporters.generation import static_caches

    monkeypatch.setattr(static_caches, "ADAPTERS", {})
    with pytest.raises(GenerationError, match="MiniMaxCache, a transformers Cache of its own class"):
        get_exporter("dynamo").export_for_generation(minimax, {"input_ids": torch.tensor([PROMPT])}, cache="static",
                                                     max_cache_len=16)


def test_executorch_llm_runner_prefills_the_state_token_by_token(xlstm, tmp_path):
    from exporters.generation.runners import run_executorch_llm

    ids = torch.tensor([PROMPT])
    generator = get_exporter("executorch").export_for_generation(xlstm, {"input_ids": ids}, cache="static",
                                                                 max_cache_len=16)
    generator.save(tmp_path, runner=True)
    methods = json.loads((tmp_path / "metadata.json").read_text())["config_values"]["constant_methods"]
    assert methods["use_kv_cache"] is True and methods["enable_dynamic_shape"] is False
    want = _eager(xlstm, ids)[0, len(PROMPT):].tolist()
    got, stats = run_executorch_llm(str(tmp_path), PROMPT, 8)
    assert got == want
    # the runner starts its second generation at position 0 again: the state starts over
    got, _ = run_executorch_llm(str(tmp_path), PROMPT, 8)
    assert got == want and stats["num_prompt_tokens"] == len(PROMPT)


def test_closed_form_wkv_continues_the_loop_from_a_given_state():
    from transformers.models.rwkv.modeling_rwkv import rwkv_linear_attention_cpu

    from exporters.workarounds.models.rwkv_wkv import wkv_closed_form

    torch.manual_seed(0)
    decay, first = torch.randn(16), torch.randn(16)
    key, value = torch.randn(2, 9, 16) * 3, torch.randn(2, 9, 16)
    given = [torch.randn(2, 16), torch.rand(2, 16) + 0.1, torch.randn(2, 16)]
    for state in (None, given, [torch.zeros(2, 16), torch.zeros(2, 16), torch.full((2, 16), -1e30)]):
        want, want_state = rwkv_linear_attention_cpu(decay, first, key, value, state=None if state is None else
                                                     [s.clone() for s in state], return_state=True)
        got, got_state = wkv_closed_form(decay, first, key, value, state=state, return_state=True)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        # the two states stand for the same sums (each scaled by its own maximum): the next token agrees
        step_key, step_value = torch.randn(2, 1, 16), torch.randn(2, 1, 16)
        torch.testing.assert_close(rwkv_linear_attention_cpu(decay, first, step_key, step_value, state=got_state)[0],
                                   rwkv_linear_attention_cpu(decay, first, step_key, step_value, state=want_state)[0],
                                   atol=1e-5, rtol=1e-5)


def test_ort_genai_runs_rwkv_from_its_state_in_one_graph(rwkv, tmp_path):
    artifact, stats = _genai_generates_like_eager(rwkv, tmp_path)
    assert sorted(artifact.input_names) == ["attention_mask", "input_ids", "past_key_values.0.conv_state",
                                            "past_key_values.0.recurrent_state"]
    assert json.loads((tmp_path / "genai_config.json").read_text())["model"]["decoder"]["num_hidden_layers"] == 1
    assert stats["sequence_length"] == len(PROMPT) + 8


def test_calls_are_read_over_the_steps_own_cache_where_transformers_static_cache_fails():
    """Inkling's relative-position bias spans a sliding layer's rolling window, generate's mask every slot:
    its own generate(cache_implementation='static') fails, while over the step's cache (every layer full
    length) it runs, and the step generates eager's tokens."""
    from transformers import InklingForCausalLM

    from sweeps.zoo.build import tiny_config

    torch.manual_seed(0)
    model = InklingForCausalLM(tiny_config("inkling_text")).eval()
    ids = torch.tensor([[5, 9, 17, 30, 12, 7, 3, 21, 40]])  # past the sliding window
    with pytest.raises(RuntimeError, match="must match the size"), torch.no_grad():
        model.generate(input_ids=ids, max_new_tokens=3, do_sample=False, cache_implementation="static")
    generator = get_exporter("dynamo").export_for_generation(model, {"input_ids": ids}, cache="static", max_cache_len=24)
    assert torch.equal(generator.generate(ids, max_new_tokens=8, eos_token_id=[]), _eager(model, ids))


def test_lightning_attention_from_a_state_in_closed_form_is_the_loop(minimax):
    """exporters/workarounds/models/minimax_lightning.py: several tokens from a given state, as the original's
    per-token loop computes them (its cached path), output and new state."""
    from transformers.models.minimax.modeling_minimax import MiniMaxCache, MiniMaxLightningAttention

    from exporters.workarounds.models.minimax_lightning import _patch_lightning_from_state

    layer = next(m for m in minimax.modules() if isinstance(m, MiniMaxLightningAttention))
    torch.manual_seed(1)
    hidden = torch.randn(2, 5, minimax.config.hidden_size)
    state = torch.randn(2, layer.num_attention_heads, layer.head_dim, layer.head_dim)

    def run(forward):
        cache = MiniMaxCache()
        cache.set_linear_cache(layer.layer_idx, state.clone())
        with torch.no_grad():
            out, _ = forward(layer, hidden, None, None, past_key_values=cache)
        return out, cache.get_linear_cache(layer.layer_idx)

    original = MiniMaxLightningAttention.forward
    want, want_state = run(original)
    got, got_state = run(_patch_lightning_from_state(original))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_state, want_state, atol=1e-5, rtol=1e-5)


def test_ort_genai_runs_minimax_from_its_lightning_state_in_one_graph(minimax, tmp_path):
    artifact, _ = _genai_generates_like_eager(minimax, tmp_path)
    assert "past_key_values.0.recurrent_state" in artifact.input_names  # the lightning layer's K^T V
    assert "patch:dynamo:transformers.models.minimax.modeling_minimax.MiniMaxLightningAttention.forward" in \
        artifact.workarounds_fired


def test_an_indexers_position_history_is_kept_in_slots():
    """Qwen4Exp's indexer concatenates each call's positions to the history its layer holds and looks keys' rotary
    positions up in it by slot; the step keeps that history as [dims, batch, max_cache_len] slots (a buffer, or an
    input / output pair on ONNX), written at each call's cache positions."""
    from sweeps.zoo import build_tiny

    model = build_tiny("Qwen4ExpForCausalLM", seed=0, init_range=0.5).model
    ids = torch.tensor([PROMPT])
    generator = get_exporter("onnx").export_for_generation(model, {"input_ids": ids}, cache="static", max_cache_len=16)
    histories = {k: v for k, v in generator.cache_shapes.items() if k.endswith("_positions")}
    assert list(histories.values()) == [(3, 1, 16)], generator.cache_shapes
    want = _eager(model, ids)
    assert len(set(want[0, len(PROMPT):].tolist())) > 3, want
    assert torch.equal(generator.generate(ids, max_new_tokens=8, eos_token_id=[]), want)


def test_mlstm_closed_form_is_the_step_kernel_token_by_token():
    """exporters/workarounds/models/xlstm_mlstm.py against mlstm_recurrent_step_native applied token by token,
    from zero and from a given state: outputs, and states standing for the same sums (C e^m, m)."""
    from transformers.models.xlstm.modeling_xlstm import mlstm_recurrent_step_native

    from exporters.workarounds.models.xlstm_mlstm import mlstm_closed_form

    torch.manual_seed(0)
    batch, heads, length, dqk, dv = 2, 3, 6, 4, 5
    q, k, v = torch.randn(batch, heads, length, dqk), torch.randn(batch, heads, length, dqk), torch.randn(batch, heads, length, dv)
    i, f = torch.randn(batch, heads, length) * 2, torch.randn(batch, heads, length) * 2
    given = (torch.randn(batch, heads, dqk, dv), torch.randn(batch, heads, dqk), torch.randn(batch, heads, 1))
    for state in (None, given):
        c, n, m = state if state else (torch.zeros(batch, heads, dqk, dv), torch.zeros(batch, heads, dqk),
                                       torch.zeros(batch, heads, 1))
        steps = []
        for t in range(length):
            h, (c, n, m) = mlstm_recurrent_step_native(q[:, :, t], k[:, :, t], v[:, :, t], i[:, :, t, None],
                                                       f[:, :, t, None], c, n, m)
            steps.append(h)
        got, (c2, n2, m2) = mlstm_closed_form(q, k, v, i, f, *(state or (None, None, None)))
        torch.testing.assert_close(got, torch.stack(steps, 2), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(m2, m)
        torch.testing.assert_close(c2, c, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(n2, n, atol=1e-4, rtol=1e-4)


def test_ort_genai_runs_xlstm_from_its_cache_object_in_one_graph(xlstm, tmp_path):
    artifact, _ = _genai_generates_like_eager(xlstm, tmp_path)
    assert "patch:dynamo:transformers.models.xlstm.modeling_xlstm.xLSTMBackend.forward" in artifact.workarounds_fired
