"""Helpers shared by the stage test modules (imported as ``from _stage_helpers import ...``; tests/ is on sys.path)."""

from __future__ import annotations

import re

import pytest
import torch

import exporters.exporter_executorch as et
from exporters import ExportStageError
from exporters.utils import DEFAULT_REGISTRY, Registry


def _node_fix(fn):
    """The registered executorch node fix whose function is ``fn``, as apply_fx_node_fixes takes it."""
    return [e for e in DEFAULT_REGISTRY.fixes("executorch", "node") if e.fn is fn]


def _assert_fix_supplies_missing_kernel(model, inputs, kernel: str, fix: str) -> None:
    """Without any workaround the program fails to load naming ``kernel``; with them ``fix`` fires
    and every output matches eager."""
    with pytest.raises(ExportStageError, match=f"no kernel for {re.escape(kernel)}"):
        et.ExecutorchExporter(registry=Registry()).export(model, inputs)
    art = et.ExecutorchExporter().export(model, inputs)
    assert f"fix:executorch:{fix}" in art.workarounds_fired
    expected = model(**inputs)
    for got, want in zip(art(**inputs).values(), expected if isinstance(expected, tuple) else (expected,)):
        torch.testing.assert_close(got, want)


def _assert_fix_repairs_a_run(model, inputs, error: str, fix: str) -> None:
    """Without any workaround the program lowers but its run fails with ``error``; with them ``fix``
    fires and every output matches eager."""
    bare = et.ExecutorchExporter(registry=Registry()).export(model, inputs)
    with pytest.raises(RuntimeError, match=error):
        bare(**inputs)
    art = et.ExecutorchExporter().export(model, inputs)
    assert f"fix:executorch:{fix}" in art.workarounds_fired
    expected = model(**inputs)
    for got, want in zip(art(**inputs).values(), expected if isinstance(expected, tuple) else (expected,)):
        torch.testing.assert_close(got, want)


class _PositionInRound(torch.nn.Module):
    """Reformer's LSH sort: flat indices over hash rounds taken modulo the (dynamic) sequence length;
    ``start=-1`` begins one before the first, a negative dividend."""

    def __init__(self, start: int = 0):
        super().__init__()
        self.start = start

    def forward(self, x):
        flat = torch.arange(3 * x.shape[1]).expand(x.shape[0], -1) + self.start
        return x.gather(1, flat % x.shape[1])
