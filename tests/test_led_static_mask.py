"""LED over a static cache (exporters/workarounds/models/led.py): the decoder's one-token calls masked to the
slots written, so a decoder fed a token a call gives what the dynamic cache gives."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def tiny():
    from transformers import LEDConfig, LEDForConditionalGeneration

    torch.manual_seed(0)
    config = LEDConfig(vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=4,
                       decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, attention_window=4,
                       max_encoder_position_embeddings=64, max_decoder_position_embeddings=64, init_std=0.5)
    ids = torch.randint(4, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    return LEDForConditionalGeneration(config).eval(), ids


def _token_by_token(model, ids, cache, steps=4):
    """Each call's logits, the decoder fed one token a call (the start token, then greedy tokens)."""
    tokens = torch.full((ids.shape[0], 1), model.config.decoder_start_token_id)
    out = []
    with torch.no_grad():
        encoder = model.get_encoder()(input_ids=ids, attention_mask=torch.ones_like(ids))
        for _ in range(steps):
            step = model(input_ids=ids, attention_mask=torch.ones_like(ids), encoder_outputs=encoder,
                         decoder_input_ids=tokens, past_key_values=cache, use_cache=True)
            out.append(step.logits[:, -1])
            cache, tokens = step.past_key_values, step.logits[:, -1:].argmax(-1)
    return out


def _caches(model, ids):
    from transformers import DynamicCache, EncoderDecoderCache, StaticCache

    dynamic = EncoderDecoderCache(DynamicCache(config=model.config), DynamicCache(config=model.config))
    static = EncoderDecoderCache(StaticCache(config=model.config, max_cache_len=8),
                                 StaticCache(config=model.config, max_cache_len=ids.shape[1]))
    return dynamic, static


def test_a_static_cache_gives_the_dynamic_caches_logits_with_the_patch(tiny, monkeypatch):
    from transformers.models.led import modeling_led

    from exporters.workarounds.models.led import _patch_led_static_one_token_mask

    model, ids = tiny
    want = _token_by_token(model, ids, _caches(model, ids)[0])
    unpatched = _token_by_token(model, ids, _caches(model, ids)[1])
    assert max(float((u - w).abs().max()) for u, w in zip(unpatched, want, strict=True)) > 1e-3  # the defect
    patched = _patch_led_static_one_token_mask(modeling_led.LEDDecoderAttention.forward)
    monkeypatch.setattr(modeling_led.LEDDecoderAttention, "forward", patched)
    for got, w in zip(_token_by_token(model, ids, _caches(model, ids)[1]), want, strict=True):
        torch.testing.assert_close(got, w, atol=1e-5, rtol=1e-5)
    # over a dynamic cache the original forward runs: the same logits
    for got, w in zip(_token_by_token(model, ids, _caches(model, ids)[0]), want, strict=True):
        torch.testing.assert_close(got, w, atol=0, rtol=0)
