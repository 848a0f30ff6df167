"""The form the capture gives a compressed-attention cache layer (exporters/generation/compressed_forms.py):
the model computes with it what it computes with its own layer, and a decode step's cache has one structure
from step to step (no Python count, no buffer whose length cycles)."""

from __future__ import annotations

import torch

from exporters.generation.capture import flatten_tree
from exporters.generation.compressed_forms import PlainCompressedLayer
from exporters.generation.sliding_forms import plain_sliding_layers

HCA, CSA = "heavily_compressed_attention", "compressed_sparse_attention"


def _tiny_model():
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    torch.manual_seed(0)
    cfg = DeepseekV4Config(vocab_size=64, hidden_size=32, moe_intermediate_size=32, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=1, head_dim=8, q_lora_rank=16, o_groups=8,
                           o_lora_rank=16, num_experts_per_tok=2, n_routed_experts=4, n_shared_experts=1,
                           layer_types=[HCA, CSA], compress_rates={CSA: 4, HCA: 8}, sliding_window=4,
                           index_n_heads=4, index_head_dim=8, index_topk=2, initializer_range=0.2,
                           max_position_embeddings=64)
    model = DeepseekV4ForCausalLM(cfg).eval()
    with torch.no_grad():  # _init_weights zeroes them: a window's slots read with the wrong bias would not show
        for name, param in model.named_parameters():
            if name.endswith("position_bias"):
                param.normal_()
    return model


def _steps(model, cache, ids, prompt):
    """The prompt in one call, then one token a call, as generate calls the model: each call's last logits and,
    after each one-token call, the cache's layout (tree spec, Nones and constants)."""
    logits, layouts = [], []
    with torch.no_grad():
        for start, end in [(0, prompt), *((t, t + 1) for t in range(prompt, ids.shape[1]))]:
            positions = torch.arange(start, end)[None].expand(ids.shape[0], -1)
            out = model(input_ids=ids[:, start:end], position_ids=positions, past_key_values=cache, use_cache=True)
            logits.append(out.logits[:, -1])
            if end - start == 1:
                layouts.append(flatten_tree("past_key_values", cache)[1])
    return torch.stack(logits), layouts


def test_compressed_layers_compute_eagers_logits_with_one_structure_per_step():
    """DeepseekV4's HCA layer (windows of 8) and CSA layer (windows of 4, overlap and indexer) become
    PlainCompressedLayer; over prompts of 3 and 6 tokens and one-token steps well past several windows of each,
    the logits, the compressed entries (each in the slot of the position its window ends at), the overlap state
    and eager's pending tokens (the last of the form's buffer) equal eager's, and every one-token step leaves the
    cache with the same layout (eager's layers count positions and entries in Python ints and cut their buffers
    at each window: their layout changes every step)."""
    from transformers.cache_utils import DynamicCache

    model = _tiny_model()
    for prompt in (3, 6):
        ids = torch.randint(0, 64, (2, 21), generator=torch.Generator().manual_seed(prompt))
        eager = DynamicCache(config=model.config)
        want, eager_layouts = _steps(model, eager, ids, prompt)
        mine = DynamicCache(config=model.config)
        assert plain_sliding_layers(mine) == 2
        got, layouts = _steps(model, mine, ids, prompt)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert len({str(layout) for layout in layouts}) == 1, "the form's layout changes from step to step"
        assert len({str(layout) for layout in eager_layouts}) > 1  # what the form removes
        for theirs, layer in zip(eager.layers, mine.layers, strict=True):
            assert type(layer) is PlainCompressedLayer
            assert layer.keys.shape[-2] == ids.shape[1]  # every position: the model's sliding mask keeps the window
            rate = theirs.compress_rate
            for name, entries in theirs.compressed_kv.items():
                assert entries.shape[1] == ids.shape[1] // rate
                assert layer.entry_slots[name].shape[1] == ids.shape[1]  # one slot a position, as the keys
                torch.testing.assert_close(layer.entry_slots[name][:, rate - 1::rate], entries, atol=1e-5, rtol=1e-5)
                pending = theirs.buffer_kv[name].shape[1]
                assert layer.buffer_kv[name].shape[1] == theirs.compress_rate - 1
                torch.testing.assert_close(layer.buffer_kv[name][:, layer.buffer_kv[name].shape[1] - pending:],
                                           theirs.buffer_kv[name], atol=1e-5, rtol=1e-5)
                if hasattr(theirs, "overlap_kv"):
                    torch.testing.assert_close(layer.overlap_kv[name], theirs.overlap_kv[name], atol=1e-5, rtol=1e-5)
                    torch.testing.assert_close(layer.overlap_gate[name], theirs.overlap_gate[name], atol=1e-5,
                                               rtol=1e-5)
            state = [v for k, v in vars(layer).items() if k not in ("is_initialized", "compress_rate", "dtype", "device",
                                                                    "_closing")]
            assert all(isinstance(t, torch.Tensor) for v in state for t in (v.values() if isinstance(v, dict) else [v]))
            assert layer._closing == {}  # nothing of one call's is left for the next
