"""FSMT over a static cache (exporters/workarounds/models/fsmt.py): the decoder's self-attention masked to
the positions written, so a prompt and steps give what the dynamic cache gives."""

from __future__ import annotations

import pytest
import torch
from _tiny_fsmt import tiny_fsmt


@pytest.fixture(scope="module")
def tiny():
    return tiny_fsmt()


def _three_steps(model, ids, cache):
    """Logits of a 4-token decoder prompt (every position: FSMT masks none of them with a cache, as generate
    calls it) and of two greedy steps after it, over ``cache``, then the cache's written self-attention keys."""
    start = torch.randint(4, 64, (ids.shape[0], 4), generator=torch.Generator().manual_seed(2))
    out = []
    with torch.no_grad():
        encoder = model.get_encoder()(input_ids=ids, attention_mask=torch.ones_like(ids))
        tokens = start
        for _ in range(3):
            step = model(input_ids=ids, attention_mask=torch.ones_like(ids), encoder_outputs=encoder,
                         decoder_input_ids=tokens, past_key_values=cache, use_cache=True)
            out.append(step.logits)
            cache = step.past_key_values
            tokens = step.logits[:, -1:].argmax(-1)
    return out + [layer.keys[..., :6, :] for layer in cache.self_attention_cache.layers]


def _static(model, ids):
    from transformers import EncoderDecoderCache, StaticCache

    return EncoderDecoderCache(StaticCache(config=model.config, max_cache_len=12),
                               StaticCache(config=model.config, max_cache_len=ids.shape[1]))


def test_a_static_cache_gives_the_dynamic_caches_logits_with_the_patch(tiny, monkeypatch):
    from transformers import DynamicCache, EncoderDecoderCache
    from transformers.models.fsmt import modeling_fsmt

    from exporters.workarounds.models.fsmt import _patch_fsmt_static_self_attention

    model, ids = tiny

    def dynamic():
        return EncoderDecoderCache(DynamicCache(config=model.config), DynamicCache(config=model.config))

    want = _three_steps(model, ids, dynamic())
    unpatched = _three_steps(model, ids, _static(model, ids))
    assert max((u - w).abs().max() for u, w in zip(unpatched, want, strict=True)) > 1e-4  # the defect
    original = modeling_fsmt.Attention.forward
    monkeypatch.setattr(modeling_fsmt.Attention, "forward", _patch_fsmt_static_self_attention(original))
    got = _three_steps(model, ids, _static(model, ids))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    # over a dynamic cache the original forward runs: the same logits as unpatched
    for g, w in zip(_three_steps(model, ids, dynamic()), want, strict=True):
        torch.testing.assert_close(g, w, atol=0, rtol=0)


def test_the_mask_sees_the_slots_written_including_this_calls():
    from exporters.workarounds.models._static_slots import written_slots_mask

    mask = written_slots_mask(torch.tensor(2), 2, 5, torch.float32)
    assert (mask == 0).tolist() == [[True, True, True, True, False]]
    assert mask[0, -1] == torch.finfo(torch.float32).min
