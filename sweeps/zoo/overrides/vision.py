"""Overrides for vision models (data only; see sweeps/zoo/overrides/__init__.py for the format)."""

OVERRIDES: dict[str, dict] = {
    "efficientnet": {
        "reason": "top conv width is hard-coded as round_filters(1280) (x width_coefficient); hidden_dim must match it",
        "config": {"width_coefficient": 0.25, "depth_coefficient": 1.0, "hidden_dim": 320},
    },
}
