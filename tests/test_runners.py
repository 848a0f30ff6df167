"""The runtimes' own LLM runners over folders saved with ``save(runner=True)``: ExecuTorch's
TextLLMRunner (static cache in the program) and onnxruntime-genai (genai_config.json), against eager."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from _tiny_llama import tiny_llama
from _tiny_mla import tiny_deepseek_v3

from exporters import get_exporter, load_generator
from exporters.generation import GenerationError
from exporters.generation.runners import fixed_width_text, fixed_width_tokenizer, ids_from_pieces, text_from_ids, word_tokenizer

PROMPT = [5, 9, 17, 30, 12]


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


def _eager(model, n, eos=True):
    config = copy.deepcopy(model.generation_config)
    if not eos:
        config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(torch.tensor([PROMPT]), max_new_tokens=n, do_sample=False, generation_config=config,
                             **({} if eos else {"eos_token_id": None}))
    return out[0, len(PROMPT):].tolist()


@pytest.mark.parametrize("size", [64, 99, 3906, 5000])
def test_tokenizers_hold_exactly_the_ids_they_name(size):
    ids = [0, 1, 61, 62, size - 1, size // 2]
    words = word_tokenizer(size)
    assert words.get_vocab_size() == size  # ExecuTorch's runner samples over the tokenizer's vocabulary
    assert words.encode(text_from_ids(ids, size)).ids == ids
    assert ids_from_pieces([words.id_to_token(i) for i in ids], size) == ids
    assert fixed_width_tokenizer(size).encode(fixed_width_text(ids, size)).ids == ids
    with pytest.raises(ValueError, match="no word of the tokenizer"):
        ids_from_pieces(["?!"], size)


@pytest.mark.slow
def test_executorch_llm_runner_generates_like_eager(llama, tmp_path):
    from exporters.generation.runners import run_executorch_llm

    generator = get_exporter("executorch").export_for_generation(llama, {"input_ids": torch.tensor([PROMPT])},
                                                                 cache="static", max_cache_len=32)
    assert generator.components["step"].input_names == ["input_ids", "cache_position"]
    generator.save(tmp_path, runner=True)
    assert sorted(os.listdir(tmp_path)) == ["generator.json", "metadata.json", "model.pte", "tokenizer.json"]
    expected = _eager(llama, 10, eos=False)
    assert len(set(expected)) > 5, expected
    ids, stats = run_executorch_llm(str(tmp_path), PROMPT, 10)
    assert ids == expected
    assert stats == {"num_prompt_tokens": len(PROMPT), "num_generated_tokens": 9}  # the decode loop's count
    # the same folder loads as our own generator, which runs the same program
    assert load_generator(tmp_path).generate(torch.tensor([PROMPT]), max_new_tokens=10, eos_token_id=[])[0, 5:].tolist() \
        == expected


def test_ort_genai_generates_like_eager(llama, tmp_path):
    from exporters.generation.genai import run_ort_genai

    ids = torch.tensor([PROMPT])
    generator = get_exporter("onnx").export_for_generation(
        llama, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, get_exporter("onnx").config_class(dynamic=True))
    generator.save(tmp_path, runner=True)
    assert sorted(os.listdir(tmp_path)) == ["genai_config.json", "metadata.json", "model.onnx", "tokenizer.json",
                                           "tokenizer_config.json"]
    for n in (3, 12):
        got, stats = run_ort_genai(str(tmp_path), PROMPT, n)
        assert got == _eager(llama, n)
        assert stats == {"sequence_length": len(PROMPT) + len(got), "done": True}


def test_runner_folders_refuse_what_the_runner_would_misread(llama, tmp_path):
    ids = torch.tensor([PROMPT, PROMPT])
    padded = get_exporter("dynamo").export_for_generation(llama, {"input_ids": ids}, cache="static", max_cache_len=16)
    with pytest.raises(GenerationError, match="built for ExecuTorch's LLM runner"):
        padded.save(tmp_path / "a", runner=True)
    assert not (tmp_path / "a").exists()  # nothing written
    dynamic = get_exporter("dynamo").export_for_generation(llama, {"input_ids": ids[:1]})
    with pytest.raises(GenerationError, match="the runner folder is onnxruntime-genai's"):
        dynamic.save(tmp_path / "b", runner=True)
    onnx = get_exporter("onnx").export_for_generation(llama, {"input_ids": ids[:1]},
                                                      get_exporter("onnx").config_class(dynamic=True))
    onnx.save(tmp_path / "c")
    with pytest.raises(GenerationError, match="loaded from a folder"):
        load_generator(tmp_path / "c").save(tmp_path / "d", runner=True)


def test_runner_generation_settings_are_refused_only_where_they_name_a_token_of_the_vocabulary():
    from exporters.generation.runners import check_runner_generation

    inert = {"begin_suppress_tokens": [220, 50256], "suppress_tokens": [300], "forced_eos_token_id": 128}
    check_runner_generation(inert, "a runner", vocab=128)  # a tiny Whisper's: no id among its 128
    for setting, value in (("begin_suppress_tokens", [220, 5]), ("forced_eos_token_id", 2), ("suppress_tokens", [3])):
        with pytest.raises(GenerationError, match=setting):
            check_runner_generation({**inert, setting: value}, "a runner", vocab=128)
    with pytest.raises(GenerationError, match="begin_suppress_tokens"):  # no vocabulary given: named ids count
        check_runner_generation(inert, "a runner")
    with pytest.raises(GenerationError, match="min_new_tokens"):  # not a token id: refused whatever the vocabulary
        check_runner_generation({"min_new_tokens": 4}, "a runner", vocab=128)


def _genai_step(model):
    from exporters.generation.genai import GenaiStep, _layout

    shapes, positions, states, dtypes, indexers, histories = _layout(model, {"input_ids": torch.tensor([PROMPT])})
    return GenaiStep(model, shapes, positions, states, indexers, dtypes, histories).eval()


def test_ort_genai_gives_a_model_without_attention_layers_the_new_tokens_mask():
    """onnxruntime-genai's graph takes a mask over past and new tokens; Mamba's mixers multiply the new tokens by
    the mask they are given (generate passes none after the prompt), so a model without attention layers gets the
    new tokens' columns, and two tokens after a first call run (the scan from the given state: mamba_scan.py)."""
    from transformers import MambaConfig, MambaForCausalLM

    from exporters.generation.genai import _check_one_graph, model_patches
    from exporters.utils import apply_patches

    model = MambaForCausalLM(MambaConfig(vocab_size=32, hidden_size=16, state_size=4, num_hidden_layers=1)).eval()
    step = _genai_step(model)
    assert not step.shapes  # no attention layer
    with apply_patches(model_patches(get_exporter("onnx"))):
        _check_one_graph(step, torch.tensor([PROMPT]) % 32)


@pytest.mark.slow
def test_ort_genai_carries_linear_attention_states_in_one_graph(tmp_path):
    """A hybrid (Qwen3-Next: a gated delta rule layer beside an attention layer): the layer's conv and recurrent
    states are onnxruntime-genai's recurrent state (found by name, started at zero), and one graph runs the prompt
    and every step from the state it is given. The runner generates what eager generates, whose prompt runs from
    no state and whose steps take the one-token path."""
    import json

    import onnx
    from _tiny_hybrid import tiny_qwen3_next

    from exporters.generation.genai import export_genai_folder, run_ort_genai

    model = tiny_qwen3_next(eos_token_id=63, bos_token_id=0)
    onnx_exporter = get_exporter("onnx")
    export_genai_folder(tmp_path, onnx_exporter, model, {"input_ids": torch.tensor([PROMPT])},
                        onnx_exporter.config_class(dynamic=True, max_dim=64), {"eos_token_id": 63})
    graph = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False).graph
    assert {i.name for i in graph.input} == {"input_ids", "attention_mask", "position_ids", "past_key_values.1.key",
                                             "past_key_values.1.value", "past_key_values.0.conv_state",
                                             "past_key_values.0.recurrent_state"}
    assert {"present.0.conv_state", "present.0.recurrent_state", "present.1.key"} <= {o.name for o in graph.output}
    layout = json.loads((tmp_path / "metadata.json").read_text())["cache_layout"]
    assert layout["attention_layers"] == [1] and list(layout["states"]) == ["0"]
    expected = _eager(model, 12)
    assert len(set(expected)) > 3, expected
    got, stats = run_ort_genai(str(tmp_path), PROMPT, 12)
    assert got == expected
    assert stats["sequence_length"] == len(PROMPT) + len(got) - (got[-1] == 63)


def test_ort_genai_refuses_layers_whose_multi_token_path_ignores_the_given_state():
    """Jamba's Mamba layers run several tokens through a full-sequence scan that takes no initial state: a call
    after the prompt computes from zero state. The eager check measures it and refuses; under the model patches
    the export installs (mamba_scan.py: the scan from the cached state) the same check passes."""
    from exporters.generation.genai import _check_one_graph, model_patches
    from exporters.utils import apply_patches
    from sweeps.zoo import build_tiny

    step = _genai_step(build_tiny("JambaForCausalLM", seed=0).model)
    with pytest.raises(GenerationError, match=r"JambaForCausalLM: its linear-attention layers do not run their "
                                              r"multi-token path from the state they are given \(.*logits [0-9.e-]+ off"):
        _check_one_graph(step, torch.tensor([PROMPT]))
    with apply_patches(model_patches(get_exporter("onnx"))):
        _check_one_graph(step, torch.tensor([PROMPT]))


@pytest.mark.slow
def test_ort_genai_carries_an_indexers_keys_as_one_more_head(tmp_path):
    """DeepSeek-V3.2's sparse attention keeps its lightning indexer's keys [batch, past, size] beside keys and
    values (DynamicIndexedLayer). They travel as one more head of the layer's key tensor, which
    genai_config.json's num_key_value_heads counts, and the runner generates what eager generates."""
    import json

    from exporters.generation.genai import export_genai_folder, run_ort_genai
    from sweeps.zoo import build_tiny

    model = build_tiny("DeepseekV32ForCausalLM", seed=0, init_range=1.0).model
    model.generation_config.eos_token_id = None
    onnx_exporter = get_exporter("onnx")
    export_genai_folder(tmp_path, onnx_exporter, model, {"input_ids": torch.tensor([PROMPT])},
                        onnx_exporter.config_class(dynamic=True, max_dim=64), {"eos_token_id": 1})
    layout = json.loads((tmp_path / "metadata.json").read_text())["cache_layout"]
    assert layout["indexers"], layout
    heads = {json.dumps(shape[0]) for shape in layout["layer_shapes"].values()}
    config = json.loads((tmp_path / "genai_config.json").read_text())["model"]["decoder"]
    assert config["num_key_value_heads"] == max(k[0] for k, _ in layout["layer_shapes"].values()) + 1, heads
    expected = _eager(model, 10, eos=False)
    assert len(set(expected)) > 3, expected
    got, _ = run_ort_genai(str(tmp_path), PROMPT, 10)
    assert got[:len(expected)] == expected[:len(got)] and len(got) >= 8


@pytest.mark.slow
def test_ort_genai_carries_an_indexers_position_history_as_one_more_head(tmp_path):
    """Qwen4Exp's indexer keeps the 3-D positions it has seen ([3, batch, past] ids) beside its keys, a history
    that grows as keys do. It travels as one more head after the indexer's keys, as floats in its first 3
    columns, and comes back as the same ids; the runner generates what eager generates."""
    import json

    from exporters.generation.genai import export_genai_folder, run_ort_genai
    from sweeps.zoo import build_tiny

    model = build_tiny("Qwen4ExpForCausalLM", seed=0, init_range=1.0).model
    model.generation_config.eos_token_id = None
    onnx_exporter = get_exporter("onnx")
    artifact = export_genai_folder(tmp_path, onnx_exporter, model, {"input_ids": torch.tensor([PROMPT])},
                                   onnx_exporter.config_class(dynamic=True, max_dim=64), {"eos_token_id": 1})
    layout = json.loads((tmp_path / "metadata.json").read_text())["cache_layout"]
    (layer, dims), = layout["position_histories"].items()
    assert dims == 3
    # the present key's last head holds the positions 0 .. S-1 of a prompt at past 0, in each of the 3 dims
    ids = torch.tensor([PROMPT, PROMPT])  # the artifact's bounds start at batch 2 (onnxruntime-genai runs 1 too)
    given = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(len(PROMPT)).expand(2, -1),
             **_genai_step(model).zero_past(2, 0)}
    out = artifact(**{k: v for k, v in given.items() if k in artifact.input_names})
    history = out[f"present.{layer}.key"][0, -1, :, :3]
    assert history.tolist() == [[float(t)] * 3 for t in range(len(PROMPT))]
    expected = _eager(model, 10, eos=False)
    assert len(set(expected)) > 3, expected
    got, _ = run_ort_genai(str(tmp_path), PROMPT, 10)
    assert got[:len(expected)] == expected[:len(got)] and len(got) >= 8


def test_ort_genai_carries_keys_and_values_of_different_sizes(tmp_path):
    """Multi-head latent attention (DeepSeek-V3): its cache keys and values differ in size. The folder's cache
    tensors are all as wide as the wider, the narrower zero-padded, and the runner generates what eager generates."""
    import json

    from exporters.generation.genai import run_ort_genai

    model = tiny_deepseek_v3(eos_token_id=63, bos_token_id=0)
    ids = torch.tensor([PROMPT])
    generator = get_exporter("onnx").export_for_generation(
        model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, get_exporter("onnx").config_class(dynamic=True))
    generator.save(tmp_path, runner=True)
    layout = json.loads((tmp_path / "metadata.json").read_text())["cache_layout"]
    with torch.no_grad():
        layer = model(ids, use_cache=True).past_key_values.layers[0]
    sizes = (layer.keys.shape[-1], layer.values.shape[-1])
    assert sizes[0] != sizes[1]
    assert layout["head_size"] == max(sizes)
    assert [tuple(size for _, size in layer) for layer in layout["layer_shapes"].values()] == [sizes] * 2
    expected = _eager(model, 10)
    assert len(set(expected)) > 3, expected
    got, _ = run_ort_genai(str(tmp_path), PROMPT, 10)
    assert got == expected
