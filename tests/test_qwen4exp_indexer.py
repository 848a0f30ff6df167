"""exporters/workarounds/models/qwen4_exp.py: the vectorized QSA indexer keeps the same keys as the loop
it replaces (causal and padded masks, several lengths, several budgets), and Qwen4Exp exports (it
does not without the patch)."""

from __future__ import annotations

import os

import pytest
import torch

from exporters import DynamoExporter
from exporters.utils import DEFAULT_REGISTRY
from exporters.workarounds.models.qwen4_exp import _patch_qwen4exp_indexer_vectorized

os.environ.setdefault("HF_HUB_OFFLINE", "1")
NAME = "patch:dynamo:transformers.models.qwen4_exp.modeling_qwen4_exp.Qwen4ExpTextQSAIndexer.forward"


def _indexer(budget: int, ratio: int, seed: int):
    import copy

    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpTextQSAIndexer

    from sweeps.runner import reference

    config = copy.deepcopy(reference("Qwen4ExpTextModel").tiny.model.config)
    config.hidden_size, config.indexer_n_heads, config.indexer_kv_heads, config.indexer_head_dim = 32, 8, 1, 8
    config.indexer_budget, config.indexer_compress_ratio = budget, ratio
    torch.manual_seed(seed)
    indexer = Qwen4ExpTextQSAIndexer(config, layer_idx=1).eval()
    with torch.no_grad():
        for norm in (indexer.q_layernorm, indexer.k_layernorm):
            norm.weight.normal_(0, 0.5)
    return indexer


def _inputs(batch: int, seq: int, pad: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, seq, 32, generator=g)
    angles = torch.randn(batch, seq, 4, generator=g)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    mask = causal.expand(batch, 1, seq, seq).clone()
    mask[0, :, :, :pad] = False  # left padding on the first row
    return hidden, (cos, sin), mask


@pytest.mark.parametrize("budget,ratio", [(4, 2), (6, 3), (8, 2)])
@pytest.mark.parametrize("seq,pad", [(7, 0), (9, 3), (12, 1)])
def test_same_keys_as_the_loop(budget, ratio, seq, pad):
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpTextQSAIndexer

    indexer = _indexer(budget, ratio, seed=seq)
    hidden, pos, mask = _inputs(2, seq, pad, seed=budget)
    patched = _patch_qwen4exp_indexer_vectorized(Qwen4ExpTextQSAIndexer.forward)
    with torch.no_grad():
        expected = Qwen4ExpTextQSAIndexer.forward(indexer, hidden, pos, mask, None)
        got = patched(indexer, hidden, pos, mask, None)
    assert got.dtype == torch.bool and got.shape == expected.shape
    assert torch.equal(got, expected)
    if seq // ratio > budget // ratio:  # more complete blocks than the budget keeps: the top-k choice is exercised
        assert not torch.equal(got, mask)


def test_additive_mask_same_as_boolean():
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpTextQSAIndexer

    indexer = _indexer(4, 2, seed=0)
    hidden, pos, mask = _inputs(2, 9, 2, seed=1)
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    patched = _patch_qwen4exp_indexer_vectorized(Qwen4ExpTextQSAIndexer.forward)
    with torch.no_grad():
        assert torch.equal(patched(indexer, hidden, pos, additive, None), patched(indexer, hidden, pos, mask, None))


def test_exports():
    from sweeps.runner import reference

    tiny = reference("Qwen4ExpTextModel").tiny
    with pytest.raises(Exception, match="(?i)data.dependent"):
        DynamoExporter(registry=DEFAULT_REGISTRY.without(NAME)).export(tiny.model, tiny.inputs)
    art = DynamoExporter().export(tiny.model, tiny.inputs)
    assert NAME in art.workarounds_fired
    with torch.no_grad():
        expected = tiny.model(**tiny.inputs).last_hidden_state
    torch.testing.assert_close(art(**tiny.inputs)["last_hidden_state"], expected)
