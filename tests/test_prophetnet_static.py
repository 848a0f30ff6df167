"""ProphetNet over a static cache (exporters/workarounds/models/prophetnet.py): the decoder's masks and relative
buckets over the cache's slots, so the model's own generate(cache_implementation='static') runs and gives what the
dynamic cache gives; and the static step's cache sized under the export's model patches where the model refuses
the one-token sizing call without them (exporters/generation/static_layers.py)."""

from __future__ import annotations

import pytest
import torch


def _config(**extra):
    from transformers import ProphetNetConfig

    return ProphetNetConfig(vocab_size=64, hidden_size=32, encoder_ffn_dim=64, decoder_ffn_dim=64,
                            num_encoder_layers=2, num_decoder_layers=2, num_encoder_attention_heads=4,
                            num_decoder_attention_heads=4, max_position_embeddings=64, ngram=2, num_buckets=16,
                            relative_max_distance=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                            decoder_start_token_id=1, init_std=0.5, **extra)


@pytest.fixture(scope="module")
def causal():
    from transformers import ProphetNetForCausalLM

    torch.manual_seed(0)
    model = ProphetNetForCausalLM(_config(is_encoder_decoder=False, add_cross_attention=False)).eval()
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # a left-padded row
    return model, {"input_ids": ids, "attention_mask": mask}


@pytest.fixture(scope="module")
def seq2seq():
    from transformers import ProphetNetForConditionalGeneration

    torch.manual_seed(0)
    model = ProphetNetForConditionalGeneration(_config()).eval()
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(1))
    decoder = torch.randint(3, 64, (2, 4), generator=torch.Generator().manual_seed(2))
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "decoder_input_ids": decoder}


def _generate(model, inputs, **extra):
    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=6, return_dict_in_generate=True,
                             output_logits=True, **extra)
    return out.sequences, out.logits


@pytest.mark.parametrize("which", ["causal", "seq2seq"])
def test_static_generate_gives_the_dynamic_caches_tokens_and_logits_with_the_patch(which, request, monkeypatch):
    from transformers.models.prophetnet import modeling_prophetnet

    from exporters.workarounds.models.prophetnet import _patch_prophetnet_static_decoder

    model, inputs = request.getfixturevalue(which)
    want_sequences, want_logits = _generate(model, inputs)
    with pytest.raises(RuntimeError, match="must match the size"):  # the defect: masks sized to the tokens fed
        _generate(model, inputs, cache_implementation="static")
    original = modeling_prophetnet.ProphetNetDecoder.forward
    monkeypatch.setattr(modeling_prophetnet.ProphetNetDecoder, "forward", _patch_prophetnet_static_decoder(original))
    sequences, logits = _generate(model, inputs, cache_implementation="static")
    assert torch.equal(sequences, want_sequences)
    for got, want in zip(logits, want_logits, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # over a dynamic cache the original forward runs: the same tokens and logits as unpatched, exactly
    sequences, logits = _generate(model, inputs)
    assert torch.equal(sequences, want_sequences)
    for got, want in zip(logits, want_logits, strict=True):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_the_masks_see_the_written_slots_and_the_prompts_n_gram_bias_at_past_zero(causal):
    from exporters.workarounds.models.prophetnet import static_masks_and_buckets

    decoder = causal[0].prophetnet.decoder
    low = torch.finfo(torch.float32).min
    main, predict, _, _ = static_masks_and_buckets(decoder, torch.tensor(0), 3, 6, None, torch.float32, "cpu")
    assert (main[0, 0] == 0).tolist() == [[True, False, False, False, False, False],
                                         [True, True, False, False, False, False],
                                         [True, True, True, False, False, False]]
    # the second stream sees the slots before its query (and slot 0), as the original's prompt bias
    assert (predict[0, 0, 1, :, :6] == 0).tolist() == [[True, False, False, False, False, False],
                                                      [True, False, False, False, False, False],
                                                      [True, True, False, False, False, False]]
    main, predict, _, _ = static_masks_and_buckets(decoder, torch.tensor(4), 1, 6, None, torch.float32, "cpu")
    assert (main[0, 0] == 0).tolist() == [[True] * 5 + [False]]
    assert (predict[0, 0, 1, :, :6] == 0).tolist() == [[True] * 5 + [False]]  # a later call has no n-gram bias
    assert predict[0, 0, 1, 0, 5] == low and predict[0, 0, 1, 0, 6] == 0  # the unwritten slot; its own key


def test_the_step_cache_is_sized_under_the_patches_where_the_model_refuses_the_call_without_them(causal):
    from exporters.generation.capture import GenerationError
    from exporters.generation.static_layers import static_cache
    from exporters.utils import DEFAULT_REGISTRY

    model, inputs = causal
    patches = [e for e in DEFAULT_REGISTRY.patches("dynamo") if e.path.startswith("transformers.models.prophetnet.")]
    with pytest.raises(GenerationError, match="one token over a static cache fails"):
        static_cache(model, 2, 16, torch.float32)
    cache = static_cache(model, 2, 16, torch.float32, patches=patches)
    assert cache.sized_under_patches
    assert tuple(cache.layers[0].keys.shape) == (2, 4, 16, 8)
    assert not cache.layers[0].keys.any()  # zeroed again after the sizing call


def test_the_seq2seq_static_form_runs_the_decoder_prompt_in_one_call_as_generate_does(seq2seq):
    """ProphetNet's n-gram streams gather relative-position terms across a multi-token call's positions, so its
    decoder prompt fed one token a call gives other logits (4.6e-4 in the sweep's model): the static form exports a
    decoder_prompt component (exporters/generation/static_encdec.py) and matches eager generate (at this test's
    sizes the largest teacher-forced logit gap was 1.2e-05 with the component, 1.67 fed a token a call)."""
    from exporters import DynamoExporter

    model, inputs = seq2seq
    want_sequences, want_logits = _generate(model, inputs)
    exporter = DynamoExporter()

    def gap(generator) -> float:
        out = generator.generate(**inputs, max_new_tokens=6, return_dict_in_generate=True, output_logits=True,
                                 teacher_tokens=want_sequences[:, -6:])
        return max(float((got - want).abs().max()) for got, want in zip(out.logits, want_logits, strict=True))

    generator = exporter.export_for_generation(model, inputs, cache="static", max_cache_len=16)
    assert list(generator.components) == ["encoder", "decoder_prompt", "step"]
    assert torch.equal(generator.generate(**inputs, max_new_tokens=6), want_sequences)
    one = exporter.export_for_generation(model, inputs, cache="static", max_cache_len=16, prompt="step")
    whole, token_by_token = gap(generator), gap(one)
    print(f"largest logit gap to eager generate: decoder prompt in one call {whole:.3g}, a token a call {token_by_token:.3g}")
    assert whole < 1e-4 < token_by_token
