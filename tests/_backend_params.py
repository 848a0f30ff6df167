"""Backend parametrization shared by the exporter test modules (``from _backend_params import ...``;
tests/ is on sys.path)."""

from __future__ import annotations

import pytest

from exporters import BACKENDS

# ExecuTorch lowering takes ~20 s per export: those items carry the `slow` marker (registered by sweeps.plugin).
_SLOW = [pytest.mark.slow]


def _backends():
    return [pytest.param(b, marks=_SLOW if b == "executorch" else []) for b in BACKENDS]

