"""exporters.workarounds.models.reformer.py: Reformer's LSH buckets without the branch on mask values, equal to
``_hash_vectors``; an exported Reformer traced with one mask runs other masks (padded or not) as eager."""

from __future__ import annotations

import pytest
import torch
from transformers import ReformerConfig, ReformerModel
from transformers.models.reformer.modeling_reformer import LSHSelfAttention

from exporters import DynamoExporter
from exporters.utils import DEFAULT_REGISTRY
from exporters.workarounds.models.reformer import lsh_buckets

NAME = "patch:dynamo:transformers.models.reformer.modeling_reformer.LSHSelfAttention._hash_vectors"
MASKS = {"none": None, "full": torch.ones(2, 8, dtype=torch.long), "padded": torch.tensor([[1] * 8, [1] * 5 + [0] * 3])}


@pytest.mark.parametrize("num_buckets", [4, [2, 4]], ids=["single", "factorized"])
@pytest.mark.parametrize("mask", list(MASKS), ids=list(MASKS))
@pytest.mark.parametrize("increase", [False, True], ids=["", "increased"])
def test_buckets_equal_upstream(num_buckets, mask, increase):
    config = ReformerConfig(hidden_size=32, num_attention_heads=2, attention_head_size=8, num_buckets=num_buckets,
                            hash_seed=3, num_hashes=2, lsh_attn_chunk_length=4)
    attention = LSHSelfAttention(config)
    vectors = torch.randn(2, 2, 8, 8)
    expected = LSHSelfAttention._hash_vectors(attention, vectors, 2, MASKS[mask], increase)
    assert torch.equal(lsh_buckets(attention, vectors, 2, MASKS[mask], increase), expected)


def _tiny_reformer():
    torch.manual_seed(0)
    config = ReformerConfig(vocab_size=64, hidden_size=32, num_attention_heads=2, attention_head_size=8,
                            attn_layers=["local", "lsh"], axial_pos_shape=[4, 4], axial_pos_embds_dim=[16, 16],
                            max_position_embeddings=16, local_attn_chunk_length=4, lsh_attn_chunk_length=4,
                            num_buckets=4, num_hashes=2, hash_seed=0, feed_forward_size=32, is_decoder=False,
                            use_cache=False)
    return ReformerModel(config).eval()


def test_exported_reformer_runs_any_mask_as_eager():
    model = _tiny_reformer()
    ids = torch.randint(1, 64, (2, 8))
    assert NAME in {e.name for e in DEFAULT_REGISTRY.patches("dynamo")}
    with pytest.raises(Exception, match="data-dependent"):  # the branch on mask.sum().item()
        DynamoExporter(registry=DEFAULT_REGISTRY.without(NAME)).export(model, {"input_ids": ids, "attention_mask": MASKS["full"]})
    art = DynamoExporter().export(model, {"input_ids": ids, "attention_mask": MASKS["full"]})
    assert NAME in art.workarounds_fired
    for mask in (MASKS["full"], MASKS["padded"]):
        (got, *_) = art(input_ids=ids, attention_mask=mask).values()
        with torch.no_grad():
            expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
        torch.testing.assert_close(got, expected)


def _outputs(out):
    cache = out.past_buckets_states
    tensors = [out.last_hidden_state]
    if cache is not None:
        tensors += list(cache.states_cache) + list(cache.buckets_cache) + [torch.tensor(cache._seen_tokens)]
    return tensors


@pytest.mark.parametrize("length", [5, 7, 8, 11, 16])
@pytest.mark.parametrize("given", ["ids+mask", "ids", "embeds"])
@pytest.mark.parametrize("use_cache", [False, True], ids=["", "cache"])
def test_padding_before_the_model_equals_upstream(length, given, use_cache):
    from transformers.models.reformer.modeling_reformer import ReformerModel as Upstream

    from exporters.workarounds.models.reformer import _patch_pad_before_the_model

    model = _tiny_reformer()
    ids = torch.randint(1, 64, (2, length))
    kwargs = {"input_ids": ids} if given != "embeds" else {"inputs_embeds": model.get_input_embeddings()(ids)}
    if given == "ids+mask":
        kwargs["attention_mask"] = torch.ones(2, length, dtype=torch.long)
        kwargs["attention_mask"][1, -2:] = 0
    patched = _patch_pad_before_the_model(Upstream.forward)
    with torch.no_grad():
        expected = _outputs(Upstream.forward(model, use_cache=use_cache, **kwargs))
        got = _outputs(patched(model, use_cache=use_cache, **kwargs))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


def test_exported_reformer_runs_every_length_with_the_traced_chunk_count():
    from exporters import DynamoConfig, InputError

    model = _tiny_reformer()
    art = DynamoExporter().export(model, {"input_ids": torch.randint(1, 64, (2, 7))}, DynamoConfig(dynamic=True))
    for length in (5, 6, 7, 8):  # a trace at 7 used to pin length % 4 == 3 (7 only)
        ids = torch.randint(1, 64, (2, length))
        (got, *_) = art(input_ids=ids).values()
        with torch.no_grad():
            torch.testing.assert_close(got, model(input_ids=ids).last_hidden_state)
    # LSHSelfAttention still pins the padded length with int(buckets.shape[-1]) (modeling_reformer.py:564)
    with pytest.raises(InputError, match="input_ids"):
        art(input_ids=torch.randint(1, 64, (2, 10)))
