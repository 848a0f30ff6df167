"""Overrides for audio models (data only; see sweeps/zoo/overrides/__init__.py for the format)."""

_SEAMLESS_TEXT = {
    "reason": "the any-to-any model takes either text or speech; with both, the text mask is applied to speech",
    "inputs": {"drop": ["input_features"]},
}

OVERRIDES: dict[str, dict] = {
    "SeamlessM4TModel": _SEAMLESS_TEXT,
    "SeamlessM4Tv2Model": _SEAMLESS_TEXT,
    "qwen2_audio": {
        "reason": "legacy merge: one audio_token_index per sample in input_ids, expanded by the model itself",
        "inputs": {"place": {"audio_token_index": [1]}},
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
