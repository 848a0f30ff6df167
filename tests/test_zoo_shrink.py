"""Constraint rules of the zoo's config shrinker (dict level and real configs; no model built)."""

import pytest

from sweeps.zoo import shrink
from sweeps.zoo.shrink import shrink_config_dict


def _llama_like(**kw):
    d = {"model_type": "x", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
         "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
         "max_position_embeddings": 4096, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 31999}
    d.update(kw)
    return d


def test_divisibility_and_kv_heads():
    d = shrink_config_dict(_llama_like())
    assert d["hidden_size"] % d["num_attention_heads"] == 0
    assert d["num_attention_heads"] % d["num_key_value_heads"] == 0
    assert d["num_key_value_heads"] < d["num_attention_heads"]  # GQA stays GQA
    assert d["head_dim"] * d["num_attention_heads"] == d["hidden_size"]
    assert d["num_hidden_layers"] == shrink.LAYERS
    assert d["intermediate_size"] <= shrink.FFN


def test_mha_stays_mha_and_mqa_stays_mqa():
    assert shrink_config_dict(_llama_like(num_key_value_heads=32))["num_key_value_heads"] == shrink.HEADS
    assert shrink_config_dict(_llama_like(num_key_value_heads=1))["num_key_value_heads"] == 1


def test_odd_head_counts_still_divide_hidden():
    d = shrink_config_dict(_llama_like(num_attention_heads=3, num_key_value_heads=3, head_dim=None))
    assert d["hidden_size"] % d["num_attention_heads"] == 0


def test_special_token_ids_inside_vocab_and_consistent():
    d = _llama_like(vocab_size=151936, bos_token_id=151643, eos_token_id=[151645, 151643], pad_token_id=151643,
                    text_config={"model_type": "t", "vocab_size": 151936, "eos_token_id": 151645, "hidden_size": 2048},
                    image_token_id=151655)
    out = shrink_config_dict(d)
    v = out["vocab_size"]
    ids = [out["bos_token_id"], out["pad_token_id"], out["image_token_id"], *out["eos_token_id"],
           out["text_config"]["eos_token_id"]]
    assert all(0 <= i < v for i in ids)
    # one old id -> one new id everywhere, distinct old ids stay distinct
    assert out["bos_token_id"] == out["pad_token_id"] == out["eos_token_id"][1]
    assert out["eos_token_id"][0] == out["text_config"]["eos_token_id"]
    assert len({out["bos_token_id"], out["eos_token_id"][0], out["image_token_id"]}) == 3
    # small ids already inside the vocab are left alone
    assert shrink_config_dict(_llama_like())["bos_token_id"] == 1


def test_layer_types_follow_layer_count_and_keep_each_kind():
    types = (["sliding_attention"] * 5 + ["full_attention"]) * 4
    d = shrink_config_dict(_llama_like(num_hidden_layers=24, layer_types=types))
    assert len(d["layer_types"]) == d["num_hidden_layers"]
    assert set(d["layer_types"]) == {"sliding_attention", "full_attention"}


def test_nested_sub_configs_are_shrunk():
    d = {"model_type": "vlm", "text_config": _llama_like(model_type="llama"),
         "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024, "intermediate_size": 4096,
                           "num_hidden_layers": 24, "num_attention_heads": 16, "image_size": 336, "patch_size": 14}}
    out = shrink_config_dict(d)
    vc, tc = out["vision_config"], out["text_config"]
    assert tc["hidden_size"] == vc["hidden_size"] == shrink.H
    assert vc["num_hidden_layers"] == shrink.LAYERS
    assert vc["image_size"] % vc["patch_size"] == 0
    assert vc["image_size"] // vc["patch_size"] >= 2


def test_input_dict_is_not_mutated():
    d = _llama_like(text_config={"model_type": "t", "hidden_size": 512})
    shrink_config_dict(d)
    assert d["hidden_size"] == 4096 and d["text_config"]["hidden_size"] == 512


def test_mrope_sections_sum_to_half_head_dim():
    d = _llama_like(rope_parameters={"rope_type": "default", "mrope_section": [16, 24, 24]})
    out = shrink_config_dict(d)
    assert sum(out["rope_parameters"]["mrope_section"]) == out["head_dim"] // 2


def test_codec_encoder_width_starts_small_when_it_doubles_per_stage():
    # DAC-style conv encoders double encoder_hidden_size per downsampling stage (x16-x32)
    codec = shrink_config_dict({"model_type": "dac", "encoder_hidden_size": 64, "downsampling_ratios": [2, 4, 8, 8],
                                "decoder_hidden_size": 1536, "hidden_size": 1024})
    assert codec["encoder_hidden_size"] == 4
    assert codec["downsampling_ratios"] == [2, 4, 8, 8]  # the hop length (input length) is unchanged
    assert codec["hidden_size"] == shrink.H
    # without a downsampling stack it is an ordinary width
    assert shrink_config_dict({"model_type": "x", "encoder_hidden_size": 768})["encoder_hidden_size"] == shrink.H


def test_vq_gan_levels_keep_their_count_at_base_width():
    d = shrink_config_dict({"model_type": "vq", "base_channels": 128, "channel_multiplier": [1, 1, 2, 2, 4],
                            "num_res_blocks": 2})
    assert d["channel_multiplier"] == [1] * 5  # same number of resolutions (downsampling factor)
    assert d["num_res_blocks"] == 1
    assert d["base_channels"] == 32


def test_float_width_multipliers_follow_the_channel_division():
    d = shrink_config_dict({"model_type": "m", "width_multiplier": 1.0, "depth_multiplier": 0.5})
    assert d["width_multiplier"] == d["depth_multiplier"] == 1 / shrink.CHANNEL_DIV
    assert shrink_config_dict({"model_type": "m", "width_multiplier": 0.1})["width_multiplier"] == 0.1


def test_prefixed_feature_sizes_and_singular_out_channels_are_widths():
    d = shrink_config_dict({"model_type": "maskformer", "fpn_feature_size": 256, "mask_feature_size": 256,
                            "feature_size": 80, "ext_pw_out_channel": 1024, "depthwise_separable_out_channel": 1024,
                            "hidden_size": 1024})
    assert d["fpn_feature_size"] == d["mask_feature_size"] == shrink.H
    assert d["ext_pw_out_channel"] == d["depthwise_separable_out_channel"] == d["hidden_size"] == shrink.H
    assert d["feature_size"] == 80  # bare feature_size stays an (audio) input feature dim


@pytest.mark.parametrize("model_type", ["llama", "bert", "t5", "vit", "qwen2_vl", "llava", "whisper", "swin"])
def test_real_configs_shrink_and_validate(model_type):
    from sweeps.zoo.build import tiny_config
    from sweeps.zoo.inputs import special_token_ids, text_vocab

    cfg = tiny_config(model_type)
    vocab = text_vocab(cfg)
    assert all(i < vocab for i in special_token_ids(cfg) if i >= 0)
    for sub in [cfg, *(getattr(cfg, k) for k in getattr(cfg, "sub_configs", {}) if getattr(cfg, k, None) is not None)]:
        for name in ("hidden_size", "d_model"):
            if isinstance(getattr(sub, name, None), int):
                assert getattr(sub, name) <= 256
        lt = getattr(sub, "layer_types", None)
        if lt is not None:
            assert len(lt) == sub.num_hidden_layers


def test_overrides_duplicate_keys_are_an_error(monkeypatch):
    from sweeps.zoo import overrides
    from sweeps.zoo.overrides import text, vision

    monkeypatch.setattr(text, "OVERRIDES", {"dup": {"reason": "a"}})
    monkeypatch.setattr(vision, "OVERRIDES", {"dup": {"reason": "b"}})
    with pytest.raises(ValueError, match="dup"):
        overrides._merge()


def test_overrides_need_a_reason(monkeypatch):
    from sweeps.zoo import overrides
    from sweeps.zoo.overrides import audio

    monkeypatch.setattr(audio, "OVERRIDES", {"x": {"config": {}}})
    with pytest.raises(ValueError, match="reason"):
        overrides._merge()


def test_overrides_generate_entry_takes_inputs_and_generation_config_only(monkeypatch):
    from sweeps.zoo import overrides
    from sweeps.zoo.overrides import audio

    monkeypatch.setattr(audio, "OVERRIDES", {"x": {"reason": "r", "generate": {"config": {}}}})
    with pytest.raises(ValueError, match="'generate' takes"):
        overrides._merge()
