"""GPT-Neo over a static cache (exporters/workarounds/models/gpt_neo.py): the bias rows at the queries'
positions, so a prompt and a step give what the dynamic cache gives."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def tiny():
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    torch.manual_seed(0)
    config = GPTNeoConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, max_position_embeddings=32,
                          attention_types=[[["global", "local"], 1]], window_size=4)
    return GPTNeoForCausalLM(config).eval(), torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(1))


def _prompt_then_step(model, ids, cache):
    with torch.no_grad():
        first = model(input_ids=ids, past_key_values=cache, use_cache=True)
        step = model(input_ids=first.logits[:, -1:].argmax(-1), past_key_values=first.past_key_values, use_cache=True)
    return first.logits, step.logits


def test_a_static_cache_gives_the_dynamic_caches_logits_with_the_patch(tiny, monkeypatch):
    from transformers import DynamicCache, StaticCache
    from transformers.models.gpt_neo import modeling_gpt_neo

    from exporters.workarounds.models.gpt_neo import _patch_gpt_neo_static_bias

    model, ids = tiny
    want = _prompt_then_step(model, ids, DynamicCache(config=model.config))
    unpatched = _prompt_then_step(model, ids, StaticCache(config=model.config, max_cache_len=16))
    assert (unpatched[0] - want[0]).abs().max() > 1e-2  # the defect the patch removes
    original = modeling_gpt_neo.GPTNeoSelfAttention.forward
    monkeypatch.setattr(modeling_gpt_neo.GPTNeoSelfAttention, "forward", _patch_gpt_neo_static_bias(original))
    got = _prompt_then_step(model, ids, StaticCache(config=model.config, max_cache_len=16))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    # without a cache or over a dynamic one the original forward runs
    torch.testing.assert_close(_prompt_then_step(model, ids, DynamicCache(config=model.config))[0], want[0])
