"""The forms the capture gives a model's generate in place of its sliding-window cache layers
(exporters/generation/sliding_forms.py): what each keeps, and that the model computes with it what it
computes with its own layer."""

from __future__ import annotations

import torch

from exporters.generation.sliding_forms import REFERENCE, PlainReferenceLayer, plain_sliding_layers


def _tiny_reference_model():
    from transformers.models.unlimited_ocr.configuration_unlimited_ocr import UnlimitedOcrTextConfig
    from transformers.models.unlimited_ocr.modeling_unlimited_ocr import UnlimitedOcrTextModel

    torch.manual_seed(0)
    cfg = UnlimitedOcrTextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, n_routed_experts=4,
                                 num_experts_per_tok=2, n_shared_experts=1, sliding_window=3, initializer_range=0.2,
                                 max_position_embeddings=64)
    cfg._attn_implementation = "sdpa"
    return UnlimitedOcrTextModel(cfg).eval()


def _steps(model, cache, ids, prompt):
    """The prompt in one call, then one token a call, as generate calls the model: each call's last hidden state."""
    out = []
    with torch.no_grad():
        for start, end in [(0, prompt), *((t, t + 1) for t in range(prompt, ids.shape[1]))]:
            positions = torch.arange(start, end)[None].expand(ids.shape[0], -1)
            o = model(input_ids=ids[:, start:end], position_ids=positions, past_key_values=cache, use_cache=True)
            out.append(o.last_hidden_state[:, -1])
    return torch.stack(out)


def test_reference_layer_form_keeps_every_position_and_the_prompt_length_as_a_tensor():
    """UnlimitedOcr's reference sliding-window layer (the prompt kept whole, decoded tokens in a window of 3, a
    Python count of each) becomes PlainReferenceLayer: every position in its keys, the prompt's length a 0-d
    tensor the model's reference mask reads. Its hidden states equal eager's layer's at every step, well past
    the window, and the form does not take the place of eager's layer in DynamicCache(config)."""
    from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING, DynamicCache

    model = _tiny_reference_model()
    prompt, new = 5, 8
    ids = torch.randint(0, 64, (2, prompt + new), generator=torch.Generator().manual_seed(1))
    eager = DynamicCache(config=model.config)
    for layer in eager.layers:  # what generate does before the prompt's call (UnlimitedOcrGenerationMixin._prefill)
        layer.set_prefill_length(prompt)
    want = _steps(model, eager, ids, prompt)
    mine = DynamicCache(config=model.config)
    assert plain_sliding_layers(mine) == 2
    got = _steps(model, mine, ids, prompt)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    layer = mine.layers[0]
    assert type(layer) is PlainReferenceLayer and layer._layer_type == REFERENCE
    assert isinstance(layer.prefill_length, torch.Tensor) and int(layer.prefill_length) == prompt
    assert layer.keys.shape[-2] == prompt + new and eager.layers[0].keys.shape[-2] == 2  # eager's: window - 1
    torch.testing.assert_close(layer.keys[..., :prompt, :], eager.layers[0].prefill_keys)
    assert set(vars(layer)) >= {"keys", "values", "prefill_length"} and "cumulative_length" not in vars(layer)
    assert DYNAMIC_LAYER_TYPE_MAPPING[REFERENCE] is not PlainReferenceLayer
    assert plain_sliding_layers(mine) == 0  # a layer that holds positions already stays as it is


def test_sliding_subclass_with_state_of_its_own_stays():
    """A model's own sliding-window layer whose state is more than a window gets a form only where it is one of
    the kinds a form exists for: DeepseekV4's compressed-attention layers (their compressor protocol and its
    state: exporters/generation/compressed_forms.py) do, a layer with a reference layer's type and more state than
    that layer's does not, and is left as it is."""
    from transformers import DeepseekV4Config
    from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4CSACache, DeepseekV4HCACache

    from exporters.generation.compressed_forms import PlainCompressedLayer

    config = DeepseekV4Config(sliding_window=4)
    class Windowed(DynamicSlidingWindowLayer):  # no _layer_type of its own: it registers nothing
        pass

    odd = Windowed(sliding_window=4)
    odd._layer_type, odd.extra = REFERENCE, None  # a reference layer's type, with more state than that layer's
    extra = DeepseekV4HCACache(config)
    extra.more = None  # the compressor protocol with state the form does not know
    cache = DynamicCache()
    cache.layers = [DeepseekV4HCACache(config), DeepseekV4CSACache(config), odd, DynamicSlidingWindowLayer(sliding_window=4),
                    extra]
    assert plain_sliding_layers(cache) == 3
    assert [type(layer) for layer in cache.layers] == [PlainCompressedLayer, PlainCompressedLayer, Windowed,
                                                       DynamicLayer, DeepseekV4HCACache]
    assert not hasattr(cache.layers[0], "overlap_kv") and set(cache.layers[1].overlap_kv) == {"compressor", "indexer"}


def test_layers_without_the_initialized_flag_are_left_alone():
    """A cache of linear-attention layers (Mamba's, Qwen3-Next's states: LinearAttentionLayer has no is_initialized)
    passes through untouched; reading the flag on every layer made the capture of every such model raise
    AttributeError (test_runners at 74f5a6e)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer, LinearAttentionLayer


    cache = DynamicCache()
    cache.layers = [LinearAttentionLayer(), DynamicLayer()]
    assert not hasattr(cache.layers[0], "is_initialized")
    assert plain_sliding_layers(cache) == 0
    assert isinstance(cache.layers[0], LinearAttentionLayer)
