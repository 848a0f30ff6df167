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


# ---- classes with no tensor forward: listed with a reason, never silently dropped ----------------
UNTESTABLE = ["BarkModel", "GlmImageVQVAE", "Qwen2_5OmniForConditionalGeneration", "Qwen3OmniMoeForConditionalGeneration",
              "Sam2VideoModel", "Sam3VideoModel", "Sam3TrackerVideoModel", "EdgeTamVideoModel", "VoxtralRealtimeTextModel",
              "Gemma4AssistantForCausalLM", "Gemma4UnifiedAssistantForCausalLM"]


@pytest.mark.parametrize("name", UNTESTABLE)
def test_untestable_classes_are_listed_and_raise_no_tensor_forward(name):
    from sweeps.zoo import NoTensorForward, catalog

    entry = {e.class_name: e for e in catalog()}[name]
    assert entry.blocked_by and entry.blocked_by.startswith("needs ")  # read as "build: <reason>" by the sweep
    assert "untestable" in entry.blocked_by or "defines no " in entry.blocked_by
    with pytest.raises(NoTensorForward, match=name):
        build_tiny(entry)
    assert issubclass(NoTensorForward, BlockedByPackage)  # the sweep's xfail path for blocked builds


def test_untestable_table_matches_the_classes():
    """Each listed class really has no tensor forward: none defined, a session-object argument, a dict of
    (key, value) pairs from another model, or no class."""
    import inspect

    import transformers

    from sweeps.zoo.blocked import NO_TENSOR_FORWARD_BY_CLASS

    for name in NO_TENSOR_FORWARD_BY_CLASS:
        cls = getattr(transformers, name, None)
        if cls is None:
            continue
        fwd = cls.forward
        if fwd.__name__ == "_forward_unimplemented":
            continue
        params = inspect.signature(fwd).parameters
        assert "inference_session" in params or "shared_kv_states" in params, name


# ---- generic input rules ----------------------------------------------------------------------------
def test_documented_shapes_resolve_config_fields_lengths_and_arithmetic():
    from types import SimpleNamespace

    from sweeps.zoo.documented import _eval_dim
    from sweeps.zoo.inputs import B, S

    cfg = SimpleNamespace(hidden_size=32, state_dim=17, block_size=16, target_layer_ids=[1, 2, 3], image_size=24)
    assert _eval_dim("batch_size", cfg, S) == B
    assert _eval_dim("state_dim", cfg, S) == 17
    assert _eval_dim("episode_length", cfg, S) == S
    assert _eval_dim("config.block_size", cfg, S) == 16
    assert _eval_dim("dim * len(config.target_layer_ids)", cfg, S) == 96
    assert _eval_dim("number_of_previous_accepted_tokens + config.block_size", cfg, S) == S + 16
    assert _eval_dim("height", cfg, S) == 24
    assert _eval_dim("3", cfg, S) == 3
    assert _eval_dim("mystery_width", cfg, S) is None  # unknown names are not guessed


def test_domain_specific_forward_gets_documented_tensors():
    """DecisionTransformer takes trajectories only: shapes come from its forward docstring + config."""
    t = build_tiny("DecisionTransformerModel")
    cfg = t.config
    assert t.inputs["states"].shape == (2, 7, cfg.state_dim)
    assert t.inputs["actions"].shape == (2, 7, cfg.act_dim)
    assert t.inputs["timesteps"].dtype == torch.long
    assert t.inputs["attention_mask"].shape == (2, 7) and bool((t.inputs["attention_mask"] == 1).all())


def test_required_latents_come_from_the_docstring():
    t = build_tiny("MimiDecoderModel")
    assert t.inputs["latents"].shape == (2, t.config.hidden_size, 7)


def test_override_tensor_recipes():
    from types import SimpleNamespace

    from sweeps.zoo.documented import tensor_from_recipe

    cfg = SimpleNamespace(d_model=12, sub=SimpleNamespace(hidden_size=6), codebooks=2)
    gen = torch.Generator().manual_seed(0)
    out = {"pixel_values": torch.zeros(2, 3, 4, 4)}
    assert tensor_from_recipe(gen, cfg, {"shape": ["B", "S", "d_model"]}, out, 100, set()).shape == (2, 7, 12)
    assert tensor_from_recipe(gen, cfg, {"shape": ["B", "sub.hidden_size * 2"]}, out, 100, set()).shape == (2, 12)
    ids = tensor_from_recipe(gen, cfg, {"shape": ["B", "S", "codebooks + 1"], "kind": "int", "low": 3, "high": "S + 1"},
                             out, 100, set())
    assert ids.shape == (2, 7, 3) and ids.dtype == torch.long and int(ids.min()) >= 3 and int(ids.max()) <= 7
    like = tensor_from_recipe(gen, cfg, {"kind": "like", "of": "pixel_values"}, out, 100, set())
    assert like.shape == out["pixel_values"].shape and not torch.equal(like, out["pixel_values"])
    m = tensor_from_recipe(gen, cfg, {"shape": ["B", 1], "kind": "ones", "dtype": "bool"}, out, 100, set())
    assert m.dtype == torch.bool and bool(m.all())
    with pytest.raises(ValueError, match="does not resolve"):
        tensor_from_recipe(gen, cfg, {"shape": ["B", "nope"]}, out, 100, set())


def test_patch_position_ids_rule():
    t = build_tiny("Gemma4VisionModel")
    pv, pos = t.inputs["pixel_values"], t.inputs["pixel_position_ids"]
    assert pv.dim() == 3 and pos.shape == (*pv.shape[:2], 2)
    k = t.config.pooling_kernel_size
    assert pv.shape[1] % (k * k) == 0 and int(pos.max()) + 1 == int(pv.shape[1] ** 0.5)


def test_qformer_gets_encoder_states_and_idefics_an_image_mask():
    q = build_tiny("Blip2QFormerModel")
    assert q.inputs["encoder_hidden_states"].shape[-1] == q.config.encoder_hidden_size
    i = build_tiny("IdeficsModel")
    assert i.inputs["image_attention_mask"].shape == (*i.inputs["input_ids"].shape, i.inputs["pixel_values"].shape[1])


def test_gemma4_assistants_cannot_build_and_take_a_kv_dict():
    """The listed reason holds: the tiny assistant config raises at model init, and the forward's KV input is a dict."""
    import inspect

    import transformers

    from sweeps.zoo.build import tiny_config

    for model_type, name in (("gemma4_assistant", "Gemma4AssistantForCausalLM"),
                             ("gemma4_unified_assistant", "Gemma4UnifiedAssistantForCausalLM")):
        cls = getattr(transformers, name)
        assert "dict" in str(inspect.signature(cls.forward).parameters["shared_kv_states"].annotation)
        with pytest.raises(ValueError, match="producing a cache"):
            cls._from_config(tiny_config(model_type))


def test_crop_pooled_images_follow_the_molmo2_processor_layout():
    from sweeps.zoo.inputs import _pooling_windows

    # a 3x3 patch grid pooled 2x2: padded to 4x4 with -1 (pad after, as the processor's arange_for_pooling)
    w = _pooling_windows(10, 3, 3, 2, 2)
    assert w.shape == (4, 4) and w[0].tolist() == [10, 11, 13, 14] and w[3].tolist() == [18, -1, -1, -1]
    t = build_tiny("Molmo2Model")
    x, pool, grids = t.inputs["pixel_values"], t.inputs["image_token_pooling"], t.inputs["image_grids"]
    crops, patches, _ = x.shape
    assert patches == t.config.vision_config.num_position_embeddings
    assert t.inputs["image_num_crops"].tolist() == [2, 2] and crops == 4
    assert int(pool.max()) == crops * patches - 1 and int(pool.min()) >= 0  # every patch pooled, no padding at 4x4
    per_image = (grids[:, 0] * grids[:, 1] + grids[:, 2] * grids[:, 3]).tolist()
    assert sum(per_image) == pool.shape[0]
    image_tok = t.config.image_token_id
    assert image_tok < t.config.text_config.vocab_size + t.config.text_config.additional_vocab_size  # shrunk "_patch_id"
    assert (t.inputs["input_ids"] == image_tok).sum(-1).tolist() == per_image
    assert bool((t.inputs["mm_token_type_ids"] == 1).eq(t.inputs["input_ids"] == image_tok).all())


def test_packed_patches_with_hw_grid_alternative():
    t = build_tiny("NemotronH_Omni_Reasoning_V3")
    pv, grid = t.inputs["pixel_values"], t.inputs["image_grid_hw"]
    assert pv.dim() == 2 and grid.shape == (2, 2) and int(grid.prod(-1).sum()) == pv.shape[0]
    r = build_tiny("RadioModel")  # the grid is optional there: dense images still come first
    assert "image_grid_hw" not in r.inputs and r.inputs["pixel_values"].dim() == 4


def test_override_batch_size_cuts_batch_major_inputs_only():
    from sweeps.zoo.inputs import first_samples

    t = build_tiny("TvpModel")  # upstream batch-1 bug (modeling_tvp.py:242), see overrides/vision.py
    assert {v.shape[0] for v in t.inputs.values()} == {1}
    cut = first_samples({"a": torch.arange(4).reshape(2, 2)}, 1)
    assert cut["a"].tolist() == [[0, 1]]
    with pytest.raises(ValueError, match="not batch-major"):
        first_samples({"packed": torch.zeros(5, 3)}, 1)


def test_mrope_models_get_their_own_position_ids_as_an_input():
    # Qwen2-VL's 3D rope positions come from per-sample Python loops over input_ids: the zoo computes
    # them as the model does and passes them, as deployments do; the outputs must not change
    from sweeps.zoo.build import _mrope_positions, run_forward

    tiny = build_tiny("Qwen2VLModel")
    assert tiny.inputs["position_ids"].shape[0] == 3
    without = {k: v for k, v in tiny.inputs.items() if k != "position_ids"}
    tiny.model.rope_deltas = None
    assert torch.equal(_mrope_positions(tiny.model, without), tiny.inputs["position_ids"])
    assert tiny.model.rope_deltas is None  # computing them left no cached state behind
    expected = run_forward(tiny.model, without).last_hidden_state
    torch.testing.assert_close(tiny.outputs.last_hidden_state, expected, rtol=0, atol=0)
    assert "position_ids" not in build_tiny("LlamaModel").inputs  # 1D rope: left to the model


def test_random_masking_and_sampling_models_get_deterministic_inputs():
    # forwards that draw torch.rand / randn unless told otherwise (ViT-MAE's random_masking, VibeVoice's
    # sample=True): the zoo passes a seeded `noise` / sample=False so that eager and export can be compared
    from sweeps.zoo.build import run_forward

    tiny = build_tiny("ViTMAEModel")
    noise = tiny.inputs["noise"]
    assert isinstance(noise, torch.Tensor) and noise.shape == (2, 16)  # (B, num_patches): 32 px / 8 px patches
    a, b = run_forward(tiny.model, tiny.inputs), run_forward(tiny.model, tiny.inputs)
    torch.testing.assert_close(a.last_hidden_state, b.last_hidden_state, rtol=0, atol=0)
    assert torch.equal(a.ids_restore, b.ids_restore)
    assert build_tiny("VibeVoiceAcousticTokenizerModel").inputs["sample"] is False


# one class per RT-DETR-family model type (pp_doclayout_v2 has no bare *Model)
QUERY_TOPK_CLASSES = ["RTDetrModel", "RTDetrV2Model", "DFineModel", "Deimv2Model",
                      "PPDocLayoutV2ForObjectDetection", "PPDocLayoutV3Model", "PPDocLayoutV4Model"]


@pytest.mark.parametrize("name", QUERY_TOPK_CLASSES)
def test_detr_query_scores_have_no_topk_ties(name, monkeypatch):
    # the decoder queries are torch.topk(encoder scores, num_queries); on (near-)tied scores ONNX TopK and
    # torch.topk pick different anchors, so the overrides' init std must keep the scores well apart
    seen = []
    real_topk = torch.topk

    def spy(x, k, *args, **kwargs):
        if not seen:  # the first top-k of the forward is the encoder's query selection
            seen.append((x.detach().clone(), k))
        return real_topk(x, k, *args, **kwargs)

    monkeypatch.setattr(torch, "topk", spy)
    t = build_tiny(name)  # runs one eager forward
    scores, k = seen[0]
    assert k == t.config.num_queries and k < scores.shape[1]
    ranked = scores.sort(dim=1, descending=True).values[:, : k + 1]
    min_gap = (ranked[:, :-1] - ranked[:, 1:]).min().item()
    assert min_gap > 1e-4, f"{name}: encoder query scores within {min_gap:.2g} of each other around the top-{k}"


def test_reinit_redraws_matching_parameters_seeded_and_names_a_pattern_that_matches_nothing():
    import torch

    from sweeps.zoo.weights import reinit

    def gated():
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        torch.nn.init.zeros_(model[1].weight)
        return model

    a, b = gated(), gated()
    before = a[0].weight.clone()
    reinit(a, {"1.weight": 0.02}, seed=0, model_type="toy")
    reinit(b, {"1.weight": 0.02}, seed=0, model_type="toy")
    assert a[1].weight.abs().sum() > 0 and torch.equal(a[1].weight, b[1].weight)
    assert torch.equal(a[0].weight, before)  # only the matching parameter is re-drawn
    with pytest.raises(KeyError, match=r"reinit pattern '\*\.router\.gate\.weight' matches no parameter"):
        reinit(a, {"*.router.gate.weight": 0.02}, seed=0, model_type="toy")


def test_generate_setup_gives_generate_its_own_inputs_and_generation_settings():
    """An override's ``generate`` entry: Dia's generate takes the text alone (its decoder prompt is a 3-D audio
    prompt) and starts the decoder at its BOS, named (ids are remapped by shrinking); Kyutai's generate takes the
    waveform input_values, which its forward does not; a class without an entry gets the forward's inputs."""
    from sweeps.zoo import generate_setup

    dia = build_tiny("DiaForConditionalGeneration", check=False)
    inputs, settings = generate_setup(dia)
    assert "decoder_input_ids" in dia.inputs and "decoder_input_ids" not in inputs
    assert torch.equal(inputs["input_ids"], dia.inputs["input_ids"])  # rebuilt from the same seed
    assert settings == {"decoder_start_token_id": dia.model.generation_config.bos_token_id}
    assert dia.model.generation_config.decoder_start_token_id == dia.model.generation_config.bos_token_id

    kyutai = build_tiny("KyutaiSpeechToTextForConditionalGeneration", check=False)
    inputs, _ = generate_setup(kyutai)
    assert kyutai.inputs["input_ids"].dim() == 3 and inputs["input_ids"].dim() == 2
    frame = kyutai.config.codec_config.frame_size
    assert inputs["input_values"].shape == (inputs["input_ids"].shape[0], 1, frame * 16)

    llama = build_tiny("LlamaForCausalLM", check=False)
    assert generate_setup(llama) == (llama.inputs, {})


def test_generation_values_name_a_generation_config_field_or_a_config_path():
    from types import SimpleNamespace

    from sweeps.zoo.generate_call import _generation_value

    model = SimpleNamespace(generation_config=SimpleNamespace(pad_token_id=7, bos_token_id=None),
                            config=SimpleNamespace(bos_token_id=3, audio=SimpleNamespace(width=5)))
    assert _generation_value(model, "pad_token_id") == 7
    assert _generation_value(model, "bos_token_id") == 3  # unset in the generation config: the config's
    assert _generation_value(model, "audio.width") == 5
    assert _generation_value(model, 1) == 1
    with pytest.raises(KeyError, match="nothing_here"):
        _generation_value(model, "nothing_here")


def test_vision_towers_defaulting_to_a_degenerate_init_range_are_built_at_the_usual_one():
    """BlipVisionConfig (like SAM's, GOT-OCR2's...) defaults to initializer_range=1e-10: at random weights its
    tower's outputs are ~1e-9 and every image embeds alike. The zoo builds it at 0.02, so two images differ."""
    from transformers import BlipTextConfig, BlipVisionConfig

    from sweeps.zoo.weights import DEGENERATE_INIT_RANGE

    assert BlipVisionConfig().initializer_range < DEGENERATE_INIT_RANGE  # still transformers' default
    tiny = build_tiny("BlipModel", seed=0)
    assert tiny.config.vision_config.initializer_range == 0.02
    assert tiny.config.text_config.initializer_range == BlipTextConfig().initializer_range  # not touched
    with torch.no_grad():
        image_embeds = tiny.model(**tiny.inputs).image_embeds
    assert image_embeds.shape[0] == 2
    assert not torch.allclose(image_embeds[0], image_embeds[1], atol=1e-3)
    pooled = tiny.model.vision_model(pixel_values=tiny.inputs["pixel_values"]).pooler_output
    assert float(pooled.abs().max()) > 1e-2



def test_a_config_drawing_at_init_std_above_the_items_range_is_built_at_that_range():
    """CpmAntConfig has no initializer_range; transformers draws its weights at init_std, 1.0 by default, where its
    logits reach ~20 and float32 eager is already 1.4e-4 from float64 (the generate item's onnx/dynamic logits were
    off by that much). The generate items' range reaches it; a config whose init_std is below the range (Bart's
    0.02) is left as it was."""
    from transformers import BartConfig, CpmAntConfig

    from sweeps.zoo.weights import set_init_range

    cpmant, bart = CpmAntConfig(), BartConfig()
    assert cpmant.init_std == 1.0 and bart.init_std == 0.02  # still transformers' defaults
    set_init_range(cpmant, 0.2)
    set_init_range(bart, 0.2)
    assert (cpmant.init_std, bart.init_std) == (0.2, 0.02)
    set_init_range(cpmant := CpmAntConfig(), 0.02, below=1e-4)  # raising degenerate ranges leaves init_std alone
    assert cpmant.init_std == 1.0
