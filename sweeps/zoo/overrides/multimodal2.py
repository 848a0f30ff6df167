"""Overrides for multimodal models, second half of the alphabet (data only; format in __init__)."""

OVERRIDES: dict[str, dict] = {}
