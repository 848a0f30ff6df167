"""build_tiny on a few small classes: determinism, fp32/eval, inputs, errors."""

import pytest
import torch

from sweeps.zoo import BlockedByPackage, UnknownModelError, build_tiny, resolve_models

CLASSES = ["LlamaForCausalLM", "BertModel", "ViTModel", "T5ForConditionalGeneration"]


@pytest.mark.parametrize("name", CLASSES)
def test_same_seed_same_weights_and_inputs(name):
    a = build_tiny(name, seed=0)
    b = build_tiny(resolve_models([name])[0], seed=0)
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    assert a.inputs.keys() == b.inputs.keys()
    for k in a.inputs:
        assert torch.equal(a.inputs[k], b.inputs[k]), k


def test_other_seed_other_weights():
    a = build_tiny("LlamaForCausalLM", seed=0)
    b = build_tiny("LlamaForCausalLM", seed=1)
    assert not torch.equal(a.model.lm_head.weight, b.model.lm_head.weight)


@pytest.mark.parametrize("name", CLASSES)
def test_tiny_model_contract(name):
    import inspect

    t = build_tiny(name)
    assert not t.model.training
    assert all(p.dtype == torch.float32 for p in t.model.parameters())
    assert t.num_parameters < 5_000_000
    assert t.model.config._attn_implementation in ("sdpa", "eager")
    params = inspect.signature(t.model.forward).parameters
    assert set(t.inputs) <= set(params)
    for k, v in t.inputs.items():
        assert isinstance(v, torch.Tensor)
        assert v.shape[0] == 2, k
    if "input_ids" in t.inputs:
        ids = t.inputs["input_ids"]
        assert ids.shape[1] > 2
        assert int(ids.max()) < t.config.get_text_config().vocab_size
        assert int(ids.min()) >= 0
    if "decoder_input_ids" in t.inputs:
        assert t.inputs["decoder_input_ids"].shape[1] != t.inputs["input_ids"].shape[1]
    with torch.no_grad():
        out = t.model(**t.inputs)
    leaves = [v for v in (out.values() if hasattr(out, "values") else out) if isinstance(v, torch.Tensor)]
    assert leaves and all(torch.isfinite(v).all() for v in leaves)


def test_special_ids_avoided_in_text():
    t = build_tiny("LlamaForCausalLM")
    cfg = t.config
    ids = set(t.inputs["input_ids"].flatten().tolist())
    for special in (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id):
        if isinstance(special, int):
            assert special not in ids


def test_blocked_class_raises_blocked_by_package():
    with pytest.raises(BlockedByPackage, match="timm"):
        build_tiny("TimmWrapperModel")


def test_bad_input_errors_name_the_fix():
    with pytest.raises(UnknownModelError, match="Closest"):
        build_tiny("LlamaForCausalLMM")
    with pytest.raises(TypeError, match="CatalogEntry"):
        build_tiny(42)
    with pytest.raises(TypeError, match="seed"):
        build_tiny("BertModel", seed="0")
    with pytest.raises(UnknownModelError, match="matches"):
        build_tiny("bert")  # a model type with many classes: ambiguous
