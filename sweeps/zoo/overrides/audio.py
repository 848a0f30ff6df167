"""Overrides for audio models (data only; see sweeps/zoo/overrides/__init__.py for the format)."""

OVERRIDES: dict[str, dict] = {
    "audio-spectrogram-transformer": {
        "reason": "input_values are (B, max_length, mel) spectrograms; 1024 frames make ~1200 patches, 128 is enough",
        "config": {"max_length": 128},
    },
}
