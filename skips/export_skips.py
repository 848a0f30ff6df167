"""EXPORT_SKIPS: model classes that cannot be exported as they are.

Each entry becomes ``pytest.mark.xfail(reason=..., strict=True)`` on the matching sweep
items, so its reason shows in every report and an entry whose model starts passing turns
the run red (XPASS strict): the list can only shrink.

Rule: every entry names the real cause (data-dependent control flow that cannot be
vectorized, a module passed as a forward argument, ...) AND the model-side change that
would remove it. "fails", "TODO", "flaky" are rejected at collection time. Fix the model
(or add a workaround in ``exporters``) instead of growing this list.

How to add an entry (keyword arguments only)::

    ExportSkip(
        classes=("SomeModelForCausalLM",),        # class names, or model_types=("some-family",)
        backends="all",                           # or ("onnx",), ("dynamo", "executorch")
        variants="all",                           # or ("dynamic",) / ("static",)
        stage="export",                           # where it is expected to fail (optional)
        reason="router loops over experts with a data-dependent count; vectorize the "
               "dispatch with a one-hot mask in the model to remove this entry",
        upstream="https://github.com/huggingface/transformers/issues/NNNNN",   # optional
    )

Unknown names, meaningless scopes, vague reasons and overlapping entries stop collection
(see ``skips.validate``).
"""

from __future__ import annotations

from skips.records import ExportSkip

EXPORT_SKIPS: tuple[ExportSkip, ...] = (
    ExportSkip(
        classes=("Swin2SRForImageSuperResolution",),
        backends=("executorch",),
        variants=("dynamic",),
        stage="run",
        reason="the final crop runs the portable slice_copy on a channels-last input into a contiguous output, which "
               "it refuses: 'Check failed (tensors_have_same_dim_order(in, out))' at instruction 0:378 "
               "(aten::slice_copy.Tensor_out, 0x12) at the traced shape. The crop reconstruction[:, :, :height*upscale, "
               ":width*upscale] (models/swin2sr/modeling_swin2sr.py:1043) takes the upsampler's XNNPACK output, whose "
               "strides are channels-last (dim order (0, 2, 3, 1)), while the slice_copy output is planned contiguous; "
               "in the static export the crop covers the whole image and is dropped. Its memory plan now loads "
               "(17,416.9 MiB planned exactly, fix:executorch:exact_bounds_to_fit_memory; it planned 19.8 TB by "
               "interval bounds; seen at c832c16, sweep and a debug run). Remove when an executorch node fix makes "
               "a cropped channels-last input contiguous first (or ExecuTorch plans slice_copy's output in its "
               "input's dim order); Swin2SRModel, without the upsampler, passes",
    ),
    ExportSkip(
        classes=("SwinForMaskedImageModeling", "Swinv2ForMaskedImageModeling"),
        backends=("executorch",),
        variants=("dynamic",),
        stage="lower",
        reason="the decoder's grid side is float math on a size: height = width = math.floor(sequence_length**0.5) "
               "(models/swin/modeling_swin.py:963, models/swinv2/modeling_swinv2.py:1053), so the program computes "
               "torch.sym_float(L) ** 0.5 and math.floor of it at run time, and ExecuTorch's runtime has no prim op "
               "for either (executorch_prim has sym_float, ceil, trunc, no pow or floor): to_executorch's out-variant "
               "pass stops on the builtin, \"'builtin_function_or_method' object has no attribute '_schema'\" "
               "(seen at 77267c8 with exporters/workarounds/executorch/memory_planning.py, which plans the size's bound; before it, "
               "memory planning stopped on the float bound: 'Expect upper bound to be sympy.Integer or int_oo. but "
               "got oo'). Remove when the decoder takes its side from the encoder's integer input_dimensions, or "
               "ExecuTorch adds pow and floor prims",
    ),
    ExportSkip(
        classes=("Aimv2Model",),
        stage="compare",
        reason="eager is wrong, not the export: with sdpa and an attention_mask without padding, "
               "create_causal_mask skips the mask and Aimv2Attention has is_causal=False, so the eager "
               "text tower attends bidirectionally while every export (mask kept) is causal; eager sdpa vs "
               "eager 'eager' attention differ by 1.29 on the tiny model. Remove when Aimv2's text "
               "attention sets is_causal=True (or the mask skip is disabled for it) in transformers",
    ),
    ExportSkip(
        classes=("InformerModel",),
        tests=("export", "quantized"),  # the quantized items stop in stage 0's trace, the same trace (quantize)
        stage="export",
        reason="InformerEncoder builds the (B, 1, L, L) attention mask once (models/informer/modeling_informer.py:835) "
               "but the distil conv_layer halves the sequence after each layer (line 856), so the next "
               "InformerProbSparseAttention raises 'Attention mask should be of size (2, 1, 4, 4), but is (2, 1, 8, 8)' "
               "(line 544); eager only passes because create_bidirectional_mask drops an all-ones mask, which it never "
               "does under torch.export (masking_utils.py:368). The ProbSparse attention also samples keys with "
               "torch.randint in forward (line 510), so parity would fail next. Remove when the encoder downsamples "
               "the mask with the conv_layer and ProbSparse key sampling takes a generator/seed or is deterministic "
               "in eval",
    ),
    ExportSkip(
        classes=("ColPaliForRetrieval",),
        stage="compare",
        reason="eager is not what the export computes: PaliGemmaConfig defaults text_config.use_bidirectional_attention "
               "to True (models/paligemma/configuration_paligemma.py:92), so every Gemma attention has is_causal=False, "
               "while PaliGemmaModel.forward builds a causal mask with create_causal_mask "
               "(models/paligemma/modeling_paligemma.py:261; ColPali passes no token_type_ids). In eager sdpa without "
               "padding that mask is skipped and attention is bidirectional; under torch.export it is kept and "
               "attention is causal (embeddings differ by 0.0909, the same as eager with the mask forced). Remove when "
               "PaliGemma builds its mask from use_bidirectional_attention (bidirectional mask when is_causal is "
               "False) in transformers",
    ),
    ExportSkip(
        classes=("SpeechT5ForTextToSpeech",),
        stage="compare",
        reason="SpeechT5SpeechDecoderPrenet applies dropout even in eval by design (Tacotron 2 prenet): "
               "_consistent_dropout draws torch.bernoulli(inputs_embeds[0], p) in forward "
               "(models/speecht5/modeling_speecht5.py:672), so every run (eager or exported) gives a different "
               "spectrogram and there is no input to fix the mask. Remove when the prenet takes a dropout mask or "
               "generator argument (or an eval-time switch to disable the always-on dropout)",
    ),
    ExportSkip(
        classes=("SpeechT5ForTextToSpeech",),
        tests=("quantized",),
        reason="SpeechT5SpeechDecoderPrenet applies dropout even in eval (_consistent_dropout draws "
               "torch.bernoulli, models/speecht5/modeling_speecht5.py:672), so two runs of the quantized reference on "
               "the same inputs differ and there is nothing to compare an artifact with: onnx stops at the reference's "
               "determinism check (it had passed once and failed once on the draws, fe12b87 / 084ec21), executorch at "
               "lowering ('Missing out variants: aten::bernoulli', d00c10b). Remove when the prenet takes a dropout "
               "mask or generator argument (or an eval-time switch to disable the always-on dropout)",
    ),
    ExportSkip(
        classes=("BailingHybridForCausalLM", "BailingHybridModel", "Glm5NextForConditionalGeneration",
                 "Glm5NextModel"),
        tests=("quantized",),
        stage="compare",
        reason="the int8 reference is chaotic, so no element-wise check against it can tell a correct artifact from a "
               "broken one: their Kimi delta attention (chunk_kimi_delta_attention, "
               "models/bailing_hybrid/modeling_bailing_hybrid.py:548, models/glm5_next/modeling_glm5_next.py:517: a "
               "per-channel forget gate, g.cumsum then exp of pairwise differences into decay_mask, k_cumdecay, and "
               "the recurrent state updated by exp(g) at every chunk) runs on activations the recipe quantizes to one "
               "per-tensor int8 grid each, so the quantized model is useless against fp32 (SQNR 1.7-1.9 dB "
               "BailingHybrid, -0.6 to -0.2 dB Glm5Next; recurrent state -4.7 dB while the conv state before it keeps "
               "24 dB) and moving 0.5% of its quantized activations one step moves its outputs 111 to 219 steps, "
               "past the 64-step cap; ONNX Runtime and XNNPACK, rounding a few values the other way, land 67 to 139 "
               "steps off on a few elements (test_quantized both backends at 50da7a3 and dc8e278, spread the worst "
               "of 12 seeds, results/s42). Qwen3-Next's and Qwen3.5's gated delta rule (one gate per head) passes on both "
               "backends at 13-28 dB. Remove when the recipe keeps the delta rule's decay products and state update "
               "in fp32 (an annotation that leaves chunk_kimi_delta_attention's mul/matmul over exp(g) unquantized), "
               "or transformers' Kimi delta attention computes them in a form int8 keeps (log-space decay)",
    ),
    ExportSkip(
        classes=("KimiLinearForCausalLM", "KimiLinearModel"),
        backends=("onnx",),
        tests=("quantized",),
        stage="compare",
        reason="the same Kimi delta attention as the entry above (chunk_kimi_delta_attention, "
               "models/kimi_linear/modeling_kimi_linear.py:466), less destroyed at this tiny size: the recurrent "
               "state is at -4.6 dB SQNR against fp32, the logits at 11.4 dB, and one-step rounding of 0.5% of the "
               "reference's activations moves its outputs up to 42-44 steps (worst of 12 seeds); ONNX Runtime's "
               "artifact is 30 steps off on 1 of 56 elements of the attention layer's value cache where that output's "
               "own spread is 28 (test_quantized onnx at eaa444e, results/s42). executorch passes (24-28 steps off, "
               "within its spreads). Remove as the entry above: the recipe keeps the delta rule's decay products and "
               "state update in fp32",
    ),
    ExportSkip(
        classes=("Glm5NextTextModel",),
        backends=("executorch",),
        tests=("quantized",),
        stage="compare",
        reason="the same Kimi delta attention as the entry above (models/glm5_next/modeling_glm5_next.py:517): the "
               "quantized reference is at 9.4 dB SQNR against fp32, under the 10 dB floor, and moves 51 steps under "
               "one-step rounding (worst of 12 seeds); XNNPACK's artifact is 34.4 steps off on 1 of 14 elements of "
               "the MoE router's input (selection.2.input) whose own spread is 26.7 (test_quantized executorch at "
               "eaa444e, results/s42). onnx passes (40 steps off against a 51-step spread, dc8e278). Remove as the "
               "entry above",
    ),
    ExportSkip(
        classes=("FastSpeech2ConformerModel",),
        backends=("onnx",),
        tests=("quantized",),
        stage="compare",
        reason="ONNX Runtime's fused integer kernels round more often than the rounding spread models, and this "
               "model grows each difference layer by layer: at its first convolution's QuantizeLinear, ORT with its "
               "graph optimizations (QLinearConv, requantizing in fixed point) is one step from its own unfused "
               "session (DequantizeLinear -> Conv -> QuantizeLinear, the reference's arithmetic) on 12 of 448 "
               "elements (2.7%, against the 0.5% exporters/quantization/rounding.py nudges), 3-5 steps at the "
               "encoder's later convolutions and 17-31 in the variance predictors (python "
               "benchmarks/ort_int8_divergence.py FastSpeech2ConformerModel --level all, at dc8e278); the energy "
               "predictor's output ends 8.1 steps off on 1 of 14 elements, bound 8 (test_quantized onnx at dc8e278; "
               "the quantized reference is at 8.3 dB SQNR against fp32, under the 10 dB floor). executorch passes. "
               "Remove when ONNX Runtime's QLinearConv/QLinearMatMul round as their unfused float sequence does, or "
               "the rounding spread is measured at the backend's own disagreement rate",
    ),
    ExportSkip(
        classes=("MusicFlamingoForConditionalGeneration", "MusicFlamingoModel"),
        backends=("executorch",),
        tests=("quantized",),
        stage="compare",
        reason="the int8 reference is discontinuous at the language model's text positions: their hidden states' "
               "mean of squares (the RMS norm's statistic) lies below half of the grid step XNNPACK's quantizer floors "
               "it at (scale 2**-12), so it rounds to 0 and rsqrt gives inf (batch 0, positions 2 on, at every "
               "layer), which the next quantize saturates (scale 0.66: a normalization factor of 169 where one step "
               "more of the statistic gives 64). Any one-step rounding in the audio encoder moves layer 1's key cache "
               "at [0, 3, 2, 3] by exactly 72 of its steps (each of 20 of the encoder's quantizes nudged alone; the "
               "projector's and the language model's own move it 1 step or none: results/s43/amplifier.py, "
               "around.py), and the artifact is 72 steps off there, 76 on the value cache (2 of 2496 elements each; "
               "rounding spread 105 and 82 steps, past the 64 cap; test_quantized executorch at eaa444e, the same at "
               "ec4daa2 by repro). onnx passes. Remove when the int8 recipe keeps a norm's statistics (mean of "
               "squares, rsqrt) in float, which no int8 kernel runs anyway",
    ),
    ExportSkip(
        classes=("VideoMAEForPreTraining",),
        variants=("dynamic",),
        stage="export",
        reason="the visible-token count is data-dependent: VideoMAEEmbeddings keeps embeddings[~bool_masked_pos] "
               "(models/videomae/modeling_videomae.py:121), and with a dynamic batch torch's scaled_dot_product_attention "
               "kernel tests the per-sample count for zero ('Could not guard on data-dependent expression Eq((u0//2), 0)', "
               "unhinted u0//s64, from integrations/sdpa_attention.py:193), which a static batch decides (the static "
               "variant passes since patch_sdpa_query_length answers transformers' own 'q_length > 1'). Remove when "
               "VideoMAE gathers the visible patches with a static count (the same number masked per sample, from "
               "config.mask_ratio) or torch's SDPA stops guarding on an empty query",
    ),
    ExportSkip(
        classes=("VideoMAEForPreTraining",),
        backends=("executorch",),
        variants=("static",),
        tests=("export", "quantized"),  # the int8 program's to_edge stops at the same assertion (d00c10b)
        stage="lower",
        reason="to_edge re-traces the two boolean-mask selections (embeddings[~bool_masked_pos] in the encoder and "
               "position_embeddings[bool_masked_pos] at models/videomae/modeling_videomae.py:576-577) into fresh "
               "unbacked symbols and evaluates the export's runtime assertion that relates them, which it cannot: "
               "'Runtime assertion failed for expression Eq(u3, (u2//2))' in _generate_edge_program. dynamo and onnx "
               "static pass. Remove when VideoMAE gathers with a static count (config.mask_ratio) or executorch keeps "
               "the relations between unbacked symbols when it re-traces",
    ),
    ExportSkip(
        classes=("LightGlueForKeypointMatching",),
        tests=("export", "quantized"),  # the quantized items stop in stage 0's trace, the same trace (quantize)
        stage="export",
        reason="adaptive depth decides control flow from the data: with depth_confidence > 0 (default 0.95) each "
               "layer tests 'if torch.any(early_stopped_pairs)' on the keypoint confidences and drops the stopped "
               "pairs by boolean indexing (models/lightglue/modeling_lightglue.py:780-800; keypoint pruning at "
               "width_confidence > 0 likewise). SuperPoint's keypoint count is handled "
               "(exporters/workarounds/models/superpoint.py). Remove when LightGlue runs every layer for every pair and "
               "applies early stopping and pruning as masks",
    ),
    ExportSkip(
        classes=("Sam3Model", "Sam3LiteTextModel"),
        tests=("quantized",),
        stage="export",  # stage 0's trace (quantize)
        reason="stage 0 traces under torch.no_grad() (exporters/quantization/__init__.py: with grad enabled, "
               "torch.export wraps every @torch.no_grad function, rotary embeddings among them, in a "
               "wrap_with_set_grad_enabled submodule that PT2E's annotation does not enter: LlamaForCausalLM's program "
               "differs), and under no_grad the C++ dispatch of scaled_dot_product_attention tests the fused CPU "
               "kernel's conditions on the DETR decoder's text cross-attention, whose query length is data-dependent: "
               "'Could not guard on data-dependent expression Eq(u0*u1, 16)' "
               "(models/sam3_lite_text/modeling_sam3_lite_text.py:646; the fp32 trace, grad enabled, passes). Remove "
               "when SDPA's kernel choice uses guard_or_false on unbacked sizes, or stage 0 traces with grad enabled "
               "and PT2E annotates inside set-grad submodules",
    ),
    ExportSkip(
        classes=("VitsModel",),
        backends=("executorch",),
        tests=("quantized",),
        stage="lower",
        reason="the int8 model (ExecuTorch's recipe: 8-bit per-channel weights) fails VITS's own spline check on the "
               "sweep's input, in PyTorch too: the inverse rational-quadratic spline of the stochastic duration "
               "predictor's flows computes discriminant = b.pow(2) - 4 * a * c from int8-quantized terms (4*a*c on a "
               "grid of step 2.76, zero point -112) and torch_compilable_check(torch.all(discriminant >= 0)) "
               "(models/vits/modeling_vits.py:284-288) fails: the quantized reference raises 'Runtime assertion "
               "failed for expression u3 >= 1', and the lowering's run of the program on the traced inputs (to bound "
               "its data-dependent sizes) 'Runtime assertion failed for expression 1 <= Piecewise((1, Eq(u3, 1)), "
               "(0, True))'. Not a lowering defect: the quantized program is invalid for this input (one-step nudges "
               "of the ONNX recipe's reference fail the same check in 3 of 5 seeds). Remove when the quantizer keeps "
               "the spline's arithmetic (VitsConvFlow in the duration predictor) in float, or VITS clamps the "
               "discriminant at 0 instead of asserting",
    ),
    ExportSkip(
        classes=("VitsModel",),
        backends=("onnx",),
        tests=("quantized",),
        stage="compare",
        reason="the output length is data-dependent and int8 rounding moves it: VITS sizes the spectrogram by "
               "sum(ceil(exp(log_duration))) over the tokens (models/vits/modeling_vits.py:1348-1349), and the "
               "durations come out of the stochastic duration predictor's flows, where one-step rounding differences "
               "between ONNX Runtime's integer kernels and the quantized reference's float arithmetic change a ceil: "
               "the artifact gives 92 frames (waveform (2, 23552)) against the reference's 91 ((2, 23296)), "
               "sequence_lengths differ in both rows. The reference itself is no steadier: with 0.5% of its "
               "activations moved one step (exporters/quantization/rounding.py's nudge) its lengths are [3072, 22784] "
               "or [2816, 23040] instead of [5120, 23296], or its spline check fails (3 of 5 seeds). Remove when the "
               "comparison can run the reference at the artifact's durations (as selections.py does for top-k), or "
               "the quantizer keeps the duration predictor in float",
    ),
    ExportSkip(
        classes=("ViltForQuestionAnswering", "ViltModel"),
        tests=("export", "quantized"),  # the quantized items stop in stage 0's trace, the same trace (quantize)
        stage="export",
        reason="ViltEmbeddings.visual_embed interpolates the position embeddings to per-image sizes read from the "
               "pixel mask (x_h, x_w from pixel_mask sums; nn.functional.interpolate(size=(h, w)) at "
               "models/vilt/modeling_vilt.py:107), then selects patches with nonzero / unique and samples them with "
               "torch.multinomial (lines 142-158). Remove when Vilt has a fixed-size path for full images (no "
               "per-image sizes from mask values, no random patch sampling in eval)",
    ),
    ExportSkip(
        classes=("BitBackbone",),
        backends=("executorch",),
        stage="compare",
        reason="fp32 rounding, not a lowering defect: weight standardization gives BiT's tiny model activations "
               "up to 49 (stem) and ~20 (stage 4), so XNNPACK's convolutions differ from ATen's by 3e-5 after the "
               "stem, growing to 2e-4 at stage 4, where the checked output has elements near 0.25 "
               "(atol 1e-4 + rtol 1e-4 * 0.25); eager fp32 itself is 8.6e-5 off its fp64 result there. The dynamic "
               "program differs the same way (feature_maps.0: 3 of 512 elements, 1.3e-4 at -0.2499). BitModel "
               "and BitForImageClassification pass. Remove when parity scales its tolerance to each output's "
               "magnitude (or compares against an fp64 reference)",
    ),
    ExportSkip(
        classes=("DepthProForDepthEstimation", "DepthProModel"),
        backends=("dynamo", "onnx"),
        variants=("dynamic",),
        stage="shapes",
        reason="the image size is Python math: split_to_patches branches on 'height == width == patch_size' "
               "(models/depth_pro/modeling_depth_pro.py:78; guard math.trunc(0.25 * pixel_values.size(3)) == 16), "
               "torch_int(math.log2(width / self.out_size)) (lines 293, 369, 866) pins the width (guard "
               "size(2) / 4 == 24.0 when traced at 96 px), and merge_patches takes torch_int(n_patches ** 0.5) "
               "(line 107) and loops over range() of it (lines 147-149), so the artifact refuses every other size "
               "eager takes (no traced size avoids it). Remove when DepthPro computes the patch grid and the "
               "feature-map sizes with integer size arithmetic (no math.log2 / sqrt / Python loops over patch counts)",
    ),
    # ── test_runner, onnxruntime-genai (scoped to its cache form, dynamic): what its folder cannot carry ──
    ExportSkip(
        classes=("DeepseekV4ForCausalLM",),
        backends=("onnx",),
        variants=("dynamic",),
        tests=("runner",),
        stage="export",
        reason="caches that grow along the sequence beside keys and values, other than an indexer's keys and "
               "position history (which travel as more heads of a layer's keys): DeepseekV4 keeps "
               "compressed-attention caches of its own (DeepseekV4CSACache / HCACache, compressed every few "
               "tokens, not one entry a token; the capture's form of them, PlainCompressedLayer, "
               "exporters/generation/compressed_forms.py, keeps the compressors' buffers, entries and overlap "
               "beside the keys); genai_config.json names key, value, conv and recurrent tensors "
               "only, and genai.py refuses them by name (GenerationError at f1651b0; the form's name, "
               "'PlainCompressedLayer', since the form). Remove when genai.py packs "
               "these into tensors the runner grows (or onnxruntime-genai names such caches)",
    ),
    ExportSkip(
        classes=("RecurrentGemmaForCausalLM",),
        backends=("onnx",),
        variants=("dynamic",),
        tests=("runner",),
        stage="export",
        reason="RecurrentGemma's forward returns no past_key_values (its recurrent and convolution states live in "
               "its modules as attributes its forward sets, and its prompt path restarts them rather than continuing), "
               "and its generate does not re-feed the sequence either. The generate items carry those attributes "
               "(exporters/generation/module_state.py), but the onnxruntime-genai form reads the static generate's "
               "calls without them (genai_state.py's _forward_arguments): GenerationError 'RecurrentGemmaForCausalLM "
               "carries state from step to step in module attributes its forward sets ([...conv1d_state, "
               "...rg_lru.recurrent_states])' (runner:ort-genai, export, at helper-rgstate on df86520). Remove when "
               "GenaiStep carries module_state as onnxruntime-genai conv / recurrent inputs, with a prompt path that "
               "continues from them (or runs the prompt one token a call, as the static step does)",
    ),
    ExportSkip(
        classes=("XLNetLMHeadModel",),
        tests=("runner",),
        stage="export",
        reason="no key/value cache, and generate feeds forward more than the sequence so far: XLNet appends a dummy "
               "token, builds perm_mask / target_mapping and keeps mems of its own. Both runners' forms of a model "
               "without a cache re-read the token sequence (ExecuTorch's runner without a KV cache, exporters/generation/"
               "static_whole.py; onnxruntime-genai with the ids so far as its state, genai_state.py; OpenAIGPT and XLM, "
               "whose appended mask column the step makes itself, pass in both): XLNet's calls are neither a "
               "re-fed sequence nor a transformers Cache (GenerationError '... generate(cache_implementation=static) "
               "passes no cache' on executorch-llm, '... returns no past_key_values ... does not re-feed the whole "
               "sequence either' on ort-genai: python -m sweeps.repro runner:<runner>-XLNetLMHeadModel). Its dynamic "
               "generate item replays the window and mems with step rules, which neither runner has a form for. "
               "Remove when XLNet's generate feeds forward the plain ids (or keeps a transformers Cache)",
    ),
    ExportSkip(
        classes=("ProphetNetForCausalLM",),
        backends=("onnx",),
        variants=("dynamic",),
        tests=("runner",),
        stage="export",
        reason="ProphetNet's decoder asserts 'At the moment use_cache is only supported for decoder_input_ids of "
               "length 1' (models/prophetnet/modeling_prophetnet.py), so no one graph can take the prompt at once "
               "and return a cache, as onnxruntime-genai's decoder does (export, at 86526eb). Remove when ProphetNet's "
               "decoder computes a multi-token step with a cache",
    ),
    ExportSkip(
        classes=("CpmAntForCausalLM",),
        backends=("onnx",),
        variants=("dynamic",),
        tests=("runner",),
        stage="run",
        reason="CpmAntModel.forward prepends config.prompt_length (32) learned prompt tokens to input_ids at every "
               "call (models/cpmant/modeling_cpmant.py:606-617), so a call over S tokens writes S + 32 positions to "
               "the cache; onnxruntime-genai allocates each present_* output as past + S positions and the run stops "
               "('output present_0_key has shape {1,4,7,8} but the computed output shape is {1,4,39,8}', test_runner "
               "onnx/genai at 705c599). genai_config.json has no key for a cache that grows by more than the tokens "
               "fed. Remove when onnxruntime-genai lets the graph size its present outputs, or CpmAnt keeps its "
               "prompt tokens out of the cache",
    ),
    # ── test_runner, both runners: generation settings and inputs a runner cannot express ──
    ExportSkip(
        classes=("BartForCausalLM", "BlenderbotForCausalLM", "BlenderbotSmallForCausalLM", "MBartForCausalLM",
                 "MarianForCausalLM", "PLBartForCausalLM", "PegasusForCausalLM"),
        tests=("runner",),
        stage="export",
        reason="the generation config sets forced_eos_token_id to a token of the vocabulary (Bart family, Marian, "
               "Pegasus, PLBart; Blenderbot also encoder_no_repeat_ngram_size), which neither ExecuTorch's "
               "TextLLMRunner nor onnxruntime-genai's greedy search has a setting for: generate forces the end "
               "token at the step before max_length, a length the exported graph is never told, so the tokens "
               "would differ at the last step, and save(runner=True) refuses (GenerationError at 86526eb and "
               "95d2c43). Remove when a runner applies forced end tokens (or the model's generation config drops it)",
    ),
    ExportSkip(
        classes=("MusicgenForCausalLM", "MusicgenMelodyForCausalLM"),
        tests=("runner",),
        stage="eager",
        reason="the decoder generates num_codebooks token streams at once (input_ids [batch * num_codebooks, seq] "
               "under a delay pattern, build_delay_pattern_mask), while a runner feeds one sequence of token ids: "
               "the item's one-row prompt is no Musicgen input, and eager generate fails on it (TypeError in "
               "build_delay_pattern_mask, at 86526eb and 95d2c43). Remove when a runner takes parallel codebook "
               "streams and the sweep gives Musicgen a prompt of num_codebooks rows",
    ),
    # ── test_runner, ExecuTorch's LLM runner (static cache): what the static step does not hold yet ──
    ExportSkip(
        classes=("ReformerModelWithLMHead",),
        tests=("runner",),
        stage="eager",
        reason="the model's own eager generate fails on the item's one-row prompt, before anything is exported: in "
               "cached decoding the LSH attention layer hashes query/key vectors already split to 5 dims "
               "(_hash_vectors' einsum 'bmtd,mdhr->bmhtr', models/reformer/modeling_reformer.py:731, called from "
               "line 535: 'the number of subscripts in the equation (4) does not match the number of dimensions "
               "(5)'; at 1539693 and ca5c0ac). Remove when transformers' Reformer decodes with its LSH cache",
    ),
    ExportSkip(
        classes=("ReformerModelWithLMHead",),
        tests=("generate",),
        stage="eager",
        reason="the model's own eager generate fails before anything is exported, on any prompt once the sequence "
               "passes lsh_attn_chunk_length (4 in the tiny config; a 2-token prompt fails at its 4th new token, "
               "independent of the zoo's inputs): in cached decoding, once the cache holds buckets, "
               "ReformerLSHAttention.forward splits query_key_vectors by hash (5 dims) and then re-hashes them "
               "(line 535) with _hash_vectors' 4-dim einsum 'bmtd,mdhr->bmhtr' (models/reformer/modeling_reformer.py:731: "
               "'the number of subscripts in the equation (4) does not match the number of dimensions (5)'; "
               "test_generate dynamo/dynamic at 8f88f7d). Remove when transformers' Reformer hashes the unsplit "
               "vectors there (or only when the cache holds no buckets yet)",
    ),
    ExportSkip(
        classes=("MusicgenForCausalLM",),
        backends=("executorch",),
        variants=("dynamic",),
        tests=("generate",),
        stage="run",
        reason="its prefill runs on the prompt's last token (a bug in transformers' MusicgenForCausalLM."
               "prepare_inputs_for_generation: it keeps only the last token whenever past_key_values is not None, "
               "models/musicgen/modeling_musicgen.py:789, and generate hands the first call an empty cache; the "
               "generation export applies it as the prefill rule last_tokens:input_ids:1), so the decode component is "
               "exported from a call whose cache holds one position (dim 2 traced at 1, range [1, 64] under "
               "backed_size_oblivious). ExecuTorch's lowering re-traces outside that mode, where guard_or_false(s == 1) "
               "is answered from the traced size: run_decompositions in _gen_edge_manager_for_partitioners (the matmul "
               "decomposition's _broadcast_shapes; check_contiguous_sizes_strides, _prims_common/__init__.py:285, from "
               "each node's _extract_tensor_metadata), _generate_edge_program's passes (expand's _broadcast_in_dim_meta) "
               "and to_executorch's LegalizePortableDimOrderPass (dim_order()); each records Eq(s, 1) (s28 for the cache), and the frozen "
               "shape environment still refines the range (_refine_ranges) to [1, 2]. The plan is made at the upper "
               "bound: PlannedShapeError 'input past_key_values__0 dim 2 is 3, but the ExecuTorch program was planned "
               "for at most 2' at the second decode step (dynamo and onnx pass; at 43ec87e). Lowering under "
               "backed_size_oblivious (both calls), with size_one_strides' reshape/contiguous patches around the "
               "lowering (the matmul decomposition's reshape guards s == 1 in C++ computeStride) and XNNPACK's "
               "ChannelsLastTaggedReshapePass._is_nhwc_tensor asked guard-free, passes this item (branch "
               "helper-etsize1-wip, 1adfd8e) but breaks DeepseekV4ForCausalLM's executorch dynamic decode (view_copy "
               "'tensors_have_same_dim_order' at run: a delegate output [s14, 1, 8] viewed as [s14, s70, 1//s70, 8], "
               "the token dim specialized to 1 in some tensors only). Remove when the lowering keeps the range of a dim "
               "traced at 1 without that (or the transformers bug above is fixed: the cache then starts at the "
               "prompt's length)",
    ),
    ExportSkip(
        classes=("Glm5NextForConditionalGeneration",),
        backends=("executorch",),
        variants=("dynamic",),
        tests=("generate",),
        stage="run",
        reason="the same re-trace narrowing as the Musicgen entry above, on a size expression traced at 1: the decode "
               "step's DSA indexer groups the cache into k-pools of 16 (get_pooled_states, number_of_pools = (seq_len + "
               "15) // 16, models/glm5_next/modeling_glm5_next.py:967), 1 for the item's 13-position cache. In "
               "run_decompositions (_gen_edge_manager_for_partitioners) clamp's _broadcast_shapes "
               "(torch/_refs/__init__.py:448) asks guard_or_false(((s56//16)) + 1 == 1) outside backed_size_oblivious, "
               "the traced size answers it and the frozen environment narrows the cache length s56 from [1, 64] to "
               "[1, 15]; the kept pools' nonzero count u (pool_keys[:, keep], :1009) then lies in [0, 1], the matmul "
               "decomposition's contiguity check (fake_impls._is_contiguous_with_hinted_checks) takes its hint 1 as "
               "torch._check(u == 1), and the edge program expands relu's [s27, 1, 4, u] to the constant [s27, 1, 4, 1] "
               "(index_scores = matmul(weights.unsqueeze(-2), scores), :867). The runtime meets u = 0 (no pool complete "
               "yet): 'expand_copy: The expanded size of the tensor (1) must match the existing size (0) at "
               "non-singleton dimension 3' at the first decode call (attention_mask [2, 14], cache [2, 1, 13, 16]; "
               "dynamo and onnx dynamic pass; measured at 7911af1). Answering guard_or_false in a frozen shape "
               "environment from static evaluation alone (torch's own rule under backed_size_oblivious) keeps the "
               "range of a 4-wide pool toy but loops for ever in this model's vision-encoder lowering "
               "(_reshape_view_helper_core_alg's tail squeeze, whose torch._check(size == 1) a frozen environment does "
               "not record); doing it for _broadcast_shapes alone is not enough (check_contiguous_sizes_strides, "
               "_prims_common/__init__.py:285, narrows the same range). Remove when the lowering keeps the range of a "
               "size traced at 1 (the Musicgen entry's condition)",
    ),
    ExportSkip(
        classes=("DiaForConditionalGeneration",),
        tests=("generate",),
        stage="export",
        reason="Dia's generate (generation_dia.py) starts the decoder with (batch, 1, num_channels) ids built from "
               "a delay mask in _prepare_decoder_input_ids_for_generation, reshapes them to 2-D between steps and "
               "applies the delay mask in prepare_inputs_for_generation, so the prefill's 3-D decoder_input_ids "
               "match no prefill rule (the decoder_start rule makes (batch, 1); GenerationError 'the prefill call "
               "of generate takes decoder_input_ids, which the caller does not give', test_generate dynamo/dynamic "
               "at 8f88f7d). Remove when exporters/generation has a rule for channel-wise decoder starts and the "
               "delay mask (or Dia's generate feeds forward the 2-D layout); static: the same Python-built decoder "
               "inputs, GenerationError 'passes decoder_attention_mask to its decoder calls, changed from call to call', "
               "test_generate dynamo/static at 5cb5c06",
    ),
    ExportSkip(
        classes=("XLNetLMHeadModel",),
        tests=("generate",),
        variants=("static",),
        stage="export",
        reason="XLNet keeps no transformers Cache: its prepare_inputs_for_generation (models/xlnet/modeling_xlnet.py) "
               "re-feeds the last token fed, the chosen one and a dummy 0, with perm_mask / target_mapping over them, "
               "and mems of its own (the call before's output, cut by two), so generate(cache_implementation='static') "
               "hands forward no cache (GenerationError 'passes no cache (past_key_values or cache_params)', "
               "test_generate dynamo/static), and its calls are no whole-sequence re-read either (mems computed "
               "window by window, not one recomputation of the sequence so far). The dynamic "
               "variant replays it (window_token, as_prefill, outputs_trimmed: exporters/generation/steps.py). Remove "
               "when the static form has a step over a fixed-size mems buffer whose unwritten slots XLNet's "
               "attention masks (it attends to every mems position today: a model patch)",
    ),
    ExportSkip(
        classes=("VoxtralRealtimeForConditionalGeneration", "KyutaiSpeechToTextForConditionalGeneration"),
        tests=("generate",),
        variants=("dynamic",),
        stage="export",
        reason="their generate builds the forward's inputs from the audio inside GenerationMixin.generate's own hooks, "
               "not in a generate override that hands the generic loop tensors it computed (the handoff rule of "
               "exporters/generation/delegated.py, which Pop2Piano's passes by): VoxtralRealtime embeds "
               "input_features with the audio tower's embedder (_prepare_model_inputs) and slices "
               "encoder_inputs_embeds by position each step; Kyutai's override only passes input_values on (no "
               "handoff), and it encodes them with its Mimi codec in prepare_inputs_for_generation and stacks the "
               "codes beside the text ids as 3-D input_ids; so the prefill's encoder_inputs_embeds / input_ids "
               "cannot be derived from the caller's (GenerationError, test_generate dynamo/dynamic at "
               "8f88f7d). Remove when exporters/generation exports that Python as an encoder component (and a "
               "per-step slice or codec step as a rule)",
    ),
    ExportSkip(
        classes=("KyutaiSpeechToTextForConditionalGeneration",),
        tests=("generate",),
        variants=("static",),
        stage="export",
        reason="as in the dynamic entry above, Kyutai's prepare_inputs_for_generation encodes input_values with its Mimi "
               "codec and stacks the codes beside the text ids, so a step over plain token ids does not fit its forward: "
               "the static step's one-token sizing call fails ('The size of tensor a (3) must match the size of tensor b "
               "(32) at non-singleton dimension 1', test_generate dynamo/static at 868b47e); and the model's own eager "
               "generate(cache_implementation='static') leaves its dynamic-cache generate at step 0 (the zoo's tiny "
               "model, max_new_tokens=8: logits 1.40 apart at step 0, tokens apart within the 8), so a static cache gives other "
               "tokens in eager as well. Remove when Kyutai's generate runs with a static cache (transformers) and "
               "exporters/generation exports the codec step as the dynamic entry asks",
    ),
    ExportSkip(
        classes=("VoxtralRealtimeForConditionalGeneration",),
        tests=("generate",),
        variants=("static",),
        stage="export",
        reason="its generate builds the forward's inputs from the audio in Python, as in its dynamic entry: "
               "VoxtralRealtime's generate passes encoder_inputs_embeds and an encoder cache to every decoder call "
               "(GenerationError 'generate with a static cache passes [encoder_inputs_embeds, "
               "encoder_past_key_values] to forward'), test_generate dynamo/static at 5cb5c06. Remove when "
               "exporters/generation exports the Python that builds these inputs as an encoder component (and a "
               "static form carries VoxtralRealtime's streaming encoder cache)",
    ),
    ExportSkip(
        classes=("VibeVoiceForConditionalGeneration",),
        tests=("generate",),
        stage="export",
        reason="its generate is no token loop over forward: each decode call takes inputs_embeds that _sample builds "
               "in Python (models/vibevoice/generation_vibevoice.py), the new token's embedding or, for a row that "
               "picked audio_token_id (both rows at step 0 in the zoo's tiny model), a speech latent denoised from "
               "torch.randn noise by the diffusion head over num_diffusion_steps of diffusers' "
               "DPMSolverMultistepScheduler, decoded by the acoustic tokenizer, re-encoded by the semantic tokenizer "
               "and projected by the connectors; and a classifier-free-guidance negative branch calls the same forward "
               "with a second DynamicCache (from one audio_bos token) between the positive steps. Eager's own logits "
               "are a function of that noise: two unseeded generate calls on the same prompt agree at step 0 and "
               "differ by 2.11 at step 1. Captured: static, GenerationError 'generate with a static cache passes "
               "[inputs_embeds] to forward'; dynamic, the negative branch's calls read as decode steps, the error "
               "following which calls the noise leads to: its first call (an empty cache), GenerationError \"the "
               "decode steps' 'past_key_values' changes structure from step to step\" (dynamo and onnx in one run), "
               "or a later call given inputs_embeds and no input_ids, 'the decode steps feed neither one token per "
               "call nor the whole sequence so far (query lengths [N, N, N, N, None])' (executorch in that run) "
               "(test_generate, all three backends, both variants, diffusers 0.42.1, at 195e834 with the added "
               "attention mask). Remove when VibeVoice's generate takes its diffusion noise as an input (a "
               "generator or latents) and exporters/generation exports the per-step speech path (diffusion head "
               "loop, acoustic decoder, semantic encoder, connectors) as components and carries the negative branch's "
               "cache as a second stream",
    ),
    ExportSkip(
        classes=("JetMoeForCausalLM",),
        backends=("onnx",),
        tests=("generate",),
        stage="compare",
        reason="an exact tie in JetMoe's attention router, broken differently by torch and ONNX Runtime: eager's "
               "greedy tokens include the pad token (0), whose embedding row is zero (padding_idx, "
               "models/jetmoe/modeling_jetmoe.py:574-577), so RMSNorm and the bias-free router give all-zero "
               "logits and logits.topk(top_k) (:184) picks among 4 equal experts. torch's CPU topk returns [2, 3] "
               "(nth_element, no stable order on ties), ONNX TopK the lower indices [0, 1]; both are valid, and the "
               "experts' outputs differ from there: teacher-forced logits at step 2 differ by 4.75 (test_generate "
               "onnx/dynamic at 705c599, the same 4.75 at step 2 on onnx/static at a128670; the first differing "
               "node is the topk indices, every node before matches). "
               "Remove when the sweep's tiny models give padding_idx rows random values like the other rows (a "
               "change to every generate item's model, to be re-run on all backends), so no token embeds to zero",
    ),
    ExportSkip(
        classes=("CpmAntForCausalLM", "DeepseekV4ForCausalLM"),
        tests=("generate", "runner"),
        variants=("static",),
        stage="export",
        reason="the model's own generate fails with transformers' static cache and over the step's own (every layer "
               "full length), so there is no static-cache call to read the step from (test_generate dynamo/static at "
               "bc76b56; the same errors in test_runner executorch, whose .pte is that static step, at 95d2c43 and "
               "705c599; both caches at this entry's commit): CpmAnt prepends prompt_length tokens the cache was not "
               "sized for (index_copy_(): index 9 out of bounds for size 9; the static form now counts the 32 slots "
               "its prompt's call writes beyond its 7 ids and sizes the step's own cache for them, static.py's "
               "prompt_extra_slots, and the one-token sizing call over that cache then fails: 'The size of tensor a "
               "(42) must match the size of tensor b (33) at non-singleton dimension 3', CpmAnt's mask spanning the "
               "positions written, not a static cache's slots: test_generate dynamo/static, --runxfail, at 7f53409); "
               "DeepseekV4 has no static layer for its "
               "compressed attention (KeyError 'heavily_compressed_attention'). Remove when each model's generate runs "
               "with a static cache (transformers)",
    ),
    ExportSkip(
        classes=("GitForCausalLM",),
        backends=("executorch",),
        tests=("runner",),
        variants=("static",),
        stage="export",
        reason="GitModel.forward branches in Python on the cache's length (models/git/modeling_git.py:839-852: past "
               "length > 0 with a 2-D mask widens the mask by image_patch_tokens, for image tokens the cache would "
               "hold), so one step cannot serve both the prompt (position 0) and the later calls: "
               "GuardOnDataDependentSymNode 'u0 > 0' (test_runner executorch at 705c599). Remove when Git widens the "
               "mask without a branch on the cache length (for example only when the cache holds image tokens)",
    ),
)
