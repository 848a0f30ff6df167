"""Moshi over a cache that keeps every position (exporters/workarounds/models/moshi.py): the mask gets the window
eager's sliding-window cache gives, so a prompt and decode steps give eager's logits."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def tiny():
    from transformers import MoshiConfig, MoshiForCausalLM

    torch.manual_seed(0)
    config = MoshiConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, ffn_dim=64, sliding_window=4, max_position_embeddings=64,
                         audio_vocab_size=32, num_codebooks=2, depth_hidden_size=16, depth_num_hidden_layers=1,
                         depth_num_attention_heads=2, depth_ffn_dim=32)
    model = MoshiForCausalLM(config).eval()
    return model, torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))


def _loop(model, ids, cache, steps=5):
    """The last position's logits of the prompt call and of ``steps - 1`` greedy one-token calls after it."""
    out, tokens = [], ids
    with torch.no_grad():
        for _ in range(steps):
            step = model(input_ids=tokens, past_key_values=cache, use_cache=True)
            out.append(step.logits[:, -1])
            cache, tokens = step.past_key_values, step.logits[:, -1:].argmax(-1)
    return out


def test_a_cache_keeping_every_position_gives_the_sliding_caches_logits_with_the_patch(tiny, monkeypatch):
    from transformers import DynamicCache
    from transformers.models.moshi import modeling_moshi

    from exporters.workarounds.models.moshi import _patch_moshi_window

    model, ids = tiny
    assert model.config.sliding_window < ids.shape[1]  # the prompt is longer than the window
    want = _loop(model, ids, DynamicCache(config=model.config))  # eager's: DynamicSlidingWindowLayers
    unpatched = _loop(model, ids, DynamicCache())  # plain layers: every position kept
    assert max(float((u - w).abs().max()) for u, w in zip(unpatched, want, strict=True)) > 1e-2  # the defect
    monkeypatch.setattr(modeling_moshi, "create_causal_mask", _patch_moshi_window(modeling_moshi.create_causal_mask))
    for got, w in zip(_loop(model, ids, DynamicCache()), want, strict=True):
        torch.testing.assert_close(got, w, atol=1e-5, rtol=1e-5)
    # over eager's own sliding-window layers the original mask is built: the same logits
    for got, w in zip(_loop(model, ids, DynamicCache(config=model.config)), want, strict=True):
        torch.testing.assert_close(got, w, atol=0, rtol=0)


def test_the_window_condition_is_counted_from_the_calls_first_position():
    from exporters.workarounds.models.moshi import kept_by_window

    visible = kept_by_window(torch.tensor(6), 4)
    kv = torch.arange(8)
    assert visible(0, 0, torch.tensor(6), kv).tolist() == [False, False, False, True, True, True, True, True]
