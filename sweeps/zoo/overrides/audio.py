"""Overrides for audio models (data only; see sweeps/zoo/overrides/__init__.py for the format)."""

_SEAMLESS_TEXT = {
    "reason": "the any-to-any model takes either text or speech; with both, the text mask is applied to speech",
    "inputs": {"drop": ["input_features"]},
}

_GRANITE_SPEECH = {
    "reason": "Q-Former projector has window_size // downsample_rate queries (generic window 4 < rate 5 gives none); "
              "input_features_mask masks projected features, not frames; no LoRA adapter (peft absent); "
              "64 frames -> 5 windows x 3 queries = 15 audio tokens per sample",
    "config": {"window_size": 15, "has_lora_adapter": False},
    "inputs": {"drop": ["input_features_mask"], "seq_len": 20, "place": {"audio_token_id": list(range(2, 17))}},
}

_GRANITE_SPEECH5 = {
    "reason": "input_features are (B, T, 4 * mel) (delta-expanded x2, stacked in pairs x2); num_stacked_frames is read "
              "only by the zoo's input builder to make that layout",
    "config": {"num_stacked_frames": 4},
}

_NEMOTRON_FEATS = ("the mel width lives in asr_config/diarization audio_config (128), not on the audio config the input "
                   "builder reads; feature_size (read only by the zoo) makes (B, T, 128) features")

_XCODEC2 = {
    "reason": "the semantic wav2vec2-bert tower takes (B, T, 160) features (semantic_model_config.feature_projection_input_dim), "
              "a sub-config the input builder does not read; feature_size (read only by the zoo) gives that width; "
              "semantic and acoustic frames are concatenated: hop 240 makes 15360 samples 64 frames like the features; "
              "quantization_dim = hidden_size + semantic hidden_size (2048 upstream)",
    "config": {"feature_size": 160, "downsampling_ratios": [2, 2, 4, 3, 5], "quantization_dim": 64},
}

OVERRIDES: dict[str, dict] = {
    "clap": {
        "reason": "the Swin audio tower ends at patch_embeds_hidden_size * 2**(stages-1), which must equal audio hidden_size "
                  "(96 * 8 = 768 upstream): 4 * 8 = 32",
        "config": {"audio_config.patch_embeds_hidden_size": 4},
    },
    "vibevoice": {
        "reason": "the speech path needs a (B, samples) padding_mask (it counts audio tokens from it), which no input recipe "
                  "makes: text-only prompt; the conv tokenizers double num_filters over 6 stages (4 -> 256, 4M params): start at 1",
        "config": {"audio_config.num_filters": 1, "semantic_model_config.num_filters": 1},
        "inputs": {"drop": ["input_values"]},
    },
    "vibevoice_acoustic_tokenizer_encoder": {
        "reason": "the bare conv encoder's `hidden_states` is the (B, channels, samples) waveform: 3 frames of the 3200x "
                  "downsampling (2*2*4*5*5*8); filters double over 6 stages (4 -> 256): start at 1",
        "config": {"num_filters": 1},
        "inputs": {"tensors": {"hidden_states": {"shape": ["B", "channels", 9600]}}},
    },
    "vibevoice_acoustic_tokenizer_decoder": {
        "reason": "the bare conv decoder's `hidden_states` are channel-first latents (B, hidden_size, frames); filters double "
                  "over 6 stages (4 -> 256): start at 1",
        "config": {"num_filters": 1},
        "inputs": {"tensors": {"hidden_states": {"shape": ["B", "hidden_size", "S"]}}},
    },
    "kyutai_speech_to_text": {
        "reason": "input_ids are (B, S, 1 + num_codebooks): a text column plus one audio-codebook column each, offset into "
                  "one shared table; codebooks 32 x 2049 ids shrunk to 2 x 17 (ids < 17 are valid in every column: the "
                  "codec's 16 codes, a power of 2, and the audio BOS 16, as 2048 codes + BOS 2048 upstream); generate takes the text "
                  "prompt (B, S) and the waveform input_values (B, 1, samples), whose frames (frame_size samples each) "
                  "bound the new tokens: 16 frames; the Mimi codec that encodes them as mimi's own entry (quantizer width == codebook_dim)",
        "config": {"num_codebooks": 2, "codebook_vocab_size": 17, "codec_config.codebook_size": 16,
                   "audio_bos_token_id": 16, "codec_config.vector_quantization_hidden_dimension": 32},
        "generate": {"inputs": {"tensors": {"input_values": {"shape": ["B", 1, "codec_config.frame_size * 16"]}}}},
        "inputs": {"tensors": {"input_ids": {"shape": ["B", "S", "num_codebooks + 1"], "kind": "int", "low": 3,
                                             "high": "codebook_vocab_size"}}},
    },
    "SpeechT5Model": {
        "reason": "the bare model has no speech/text pre-nets: encoder and decoder take already-embedded (B, len, hidden_size) "
                  "states, not waveforms or mel frames",
        "inputs": {"drop": ["attention_mask"], "tensors": {"input_values": {"shape": ["B", "S", "hidden_size"]},
                                                           "decoder_input_values": {"shape": ["B", "T", "hidden_size"]}}},
    },
    "csm": {
        "reason": "input_values (context audio) need input_values_cutoffs per sample, which no input recipe makes: text-only prompt",
        "inputs": {"drop": ["input_values"]},
    },
    "fastspeech2_conformer_with_hifigan": {
        "reason": "the phoneme vocab (78) sits in model_config, which the input builder does not read (it draws ids < 100): "
                  "a 100-id vocab",
        "config": {"model_config.vocab_size": 100},
    },
    "pop2piano": {
        "reason": "the encoder takes input_features (B, T, d_model) as its inputs_embeds, so not input_ids too; feature_size "
                  "(read only by the zoo) gives width d_model; generate prepends a composer embedding, whose index it "
                  "reads from generation_config.composer_to_feature_token (a checkpoint's generation_config.json: one "
                  "id per composer, composer_vocab_size 21 consecutive ids)",
        "config": {"feature_size": 32},
        "inputs": {"drop": ["input_ids", "attention_mask"]},
        "generate": {"generation_config": {"composer_to_feature_token": {f"composer{i + 1}": i for i in range(21)}}},
    },
    "voxtral_realtime": {
        "reason": "audio embeddings are added position-wise to the text embeddings: the 64 generic frames give 8 audio steps, "
                  "so 8 text tokens; generate stops at one token per audio step (audio_length_per_tok 8 frames), so it "
                  "takes 128 frames for the 8-token prompt and 8 new tokens",
        "inputs": {"seq_len": 8},
        "generate": {"inputs": {"seq_len": 8, "tensors": {"input_features": {
            "shape": ["B", "audio_config.num_mel_bins", "audio_length_per_tok * 16"]}}}},
    },
    "dia": {
        "reason": "2-D decoder ids are read as (B, num_channels * T): one channel (delay pattern [0]) makes the generic (B, 5) ids 5 steps; "
                  "generate takes decoder ids only as (B, T, channels) audio prompts with their mask (DiaProcessor): the "
                  "text alone, the decoder started from its BOS (generation_config.json; the pad id would be read as "
                  "padding and leave no prompt)",
        "config": {"decoder_config.num_channels": 1, "delay_pattern": [0]},
        "generate": {"inputs": {"drop": ["decoder_input_ids"]},
                     "generation_config": {"decoder_start_token_id": "bos_token_id"}},
    },
    "musicgen": {
        "reason": "decoder ids are (B * num_codebooks, T); with one codebook the generic (B, T) ids keep the text encoder's batch; "
                  "MusicgenForCausalLM.generate pads its delay pattern with decoder_start_token_id (the pad id in "
                  "generation_config.json) and reads num_return_sequences without the generic defaults; a decoder prompt "
                  "starts with that id (the delay pattern writes it over position 0)",
        "config": {"decoder.num_codebooks": 1},
        "generate": {"inputs": {"place": {"pad_token_id": [0]}},
                     "generation_config": {"decoder_start_token_id": "pad_token_id", "num_return_sequences": 1}},
    },
    "musicgen_melody": {
        "reason": "decoder ids are (B * num_codebooks, T): one codebook keeps the batch; the melody conditioning is "
                  "(B, T, num_chroma=12) chroma, feature_size (read only by the zoo) gives that width; generate pads its "
                  "delay pattern with decoder_start_token_id (the pad id in generation_config.json); a decoder prompt starts with "
                  "that id (the delay pattern writes it over position 0)",
        "config": {"decoder.num_codebooks": 1, "feature_size": 12},
        "generate": {"inputs": {"place": {"pad_token_id": [0]}},
                     "generation_config": {"decoder_start_token_id": "pad_token_id"}},
    },
    "xcodec2": _XCODEC2,
    "neucodec": _XCODEC2,
    "xcodec": {
        "reason": "codebook_dim must equal hidden_size = acoustic + semantic hidden sizes (1024 = 256 + 768 upstream; 32 + 32 "
                  "here)",
        "config": {"codebook_dim": 64},
    },
    "mimi": {
        "reason": "the quantizer projects to vector_quantization_hidden_dimension, which must equal codebook_dim (256 == 256 upstream)",
        "config": {"vector_quantization_hidden_dimension": 32},
    },
    "clvp": {
        "reason": "the conditioning mel width is decoder_config.feature_size (80), on no sub-config the input builder reads; "
                  "speech_config.num_mel_bins (read only by the zoo) gives (B, 80, T) features; the encoders' rotary dim is "
                  "at least 32, so their head_dim must be >= 32 (one head of 32)",
        "config": {"speech_config.num_mel_bins": 80, "text_config.num_attention_heads": 1,
                   "speech_config.num_attention_heads": 1},
    },
    "univnet": {
        "reason": "kernel-predictor residual blocks are built with model_in_channels but run on kernel_predictor_hidden_channels "
                  "(64 == 64 upstream); the predicted kernels have 24 * model_hidden_channels**2 channels: 8 keeps that small; "
                  "the vocoder's Gaussian noise_sequence is an input (forward draws torch.randn when it is None, which "
                  "no backend can match and ONNX cannot lower): (B, frames of input_features, model_in_channels)",
        "config": {"kernel_predictor_hidden_channels": 8, "model_hidden_channels": 8},
        "inputs": {"tensors": {"input_features": {"shape": ["B", 64, "num_mel_bins"]},
                               "noise_sequence": {"shape": ["B", 64, "model_in_channels"]}}},
    },
    "moonshine_streaming": {
        "reason": "the decoder layers read config.num_key_value_heads, which the config class does not define (MHA decoder)",
        "config": {"num_key_value_heads": 4},
    },
    "nemotron3_5_transcribe_audio": {"reason": _NEMOTRON_FEATS, "config": {"feature_size": 128}},
    "nemo_speechlm": {
        "reason": _NEMOTRON_FEATS + "; the NemotronH text stack's length is len(layers_block_type) (52): one layer of each kind",
        "config": {"audio_config.feature_size": 128,
                   "text_config.layers_block_type": ["linear_attention", "moe", "full_attention"]},
    },
    "granite_speech5_encoder": _GRANITE_SPEECH5,
    "granite_speech5_ctc": {**_GRANITE_SPEECH5, "config": {"encoder_config.num_stacked_frames": 4}},
    "granite_speech": _GRANITE_SPEECH,
    "granite_speech_plus": _GRANITE_SPEECH,
    "SeamlessM4TModel": _SEAMLESS_TEXT,
    "SeamlessM4Tv2Model": _SEAMLESS_TEXT,
    "qwen2_audio": {
        "reason": "processor layout: one audio token per encoder frame, 128 mel frames -> (128-1)//2+1 = 64 -> (64-2)//2+1 = 32 "
                  "per sample (the legacy 1-token merge is eager-only: export takes the expanded path)",
        "inputs": {"seq_len": 40, "place": {"audio_token_index": list(range(1, 33))}},
    },
    "vits": {
        "reason": "the duration predictor and the prior add torch.randn * noise_scale(_duration): zero scales make the "
                  "forward deterministic (eager and export draw different noise)",
        "config": {"noise_scale": 0.0, "noise_scale_duration": 0.0},
    },
    "vibevoice_acoustic_tokenizer": {
        "reason": "sample=True (default) adds vae_std * randn noise to the latents: sample=False keeps the forward deterministic",
        "inputs": {"values": {"sample": False}},
    },
    "vibevoice_asr": {
        "reason": "sample=True (default) adds vae_std * randn noise to the acoustic latents: sample=False keeps it deterministic",
        "inputs": {"values": {"sample": False}},
    },
    "fun_asr_nano": {
        "reason": "validator: adaptor_config.intermediate_size must equal text_config.hidden_size // 4",
        "config": {"adaptor_config.intermediate_size": 8},
    },
    "audio-spectrogram-transformer": {
        "reason": "input_values are (B, max_length, mel) spectrograms; 1024 frames make ~1200 patches, 128 is enough",
        "config": {"max_length": 128},
    },
}
