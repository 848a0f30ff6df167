"""Overrides for vision models (data only; see sweeps/zoo/overrides/__init__.py for the format)."""

OVERRIDES: dict[str, dict] = {
}
