"""exporters/workarounds/executorch/guards_code_cache.py: the programs ExecuTorch builds per partition print the shared
shape environment's guards once per environment state."""

from __future__ import annotations

import torch
from torch.export import Dim
from torch.export.exported_program import _convert_guards_to_code, _get_shape_env

from exporters.workarounds.executorch.guards_code_cache import PATH, _patch_guards_code_printed_once


class _Guarded(torch.nn.Module):
    def forward(self, x):
        if x.shape[0] > 2:  # a guard on the dynamic size
            return x * 2
        return x


def _program():
    return torch.export.export(_Guarded(), (torch.randn(4, 3),), dynamic_shapes=({0: Dim.AUTO(min=2, max=64)},))


def _patched_counting_torchs():
    """The patch around torch's own function, and the list of the calls that reached torch's."""
    calls = []

    def counting(graph_module):
        calls.append(graph_module)
        return _convert_guards_to_code(graph_module)

    return _patch_guards_code_printed_once(counting), calls


def test_printed_once_per_state_and_equal_to_torchs():
    gm = _program().graph_module
    patched, calls = _patched_counting_torchs()
    first = patched(gm)
    assert first == _convert_guards_to_code(gm) and len(calls) == 1 and not patched.acted()
    second = patched(gm)
    assert second == first and second is not first and len(calls) == 1 and patched.acted()


def test_a_new_guard_prints_again():
    gm = _program().graph_module
    patched, calls = _patched_counting_torchs()
    patched(gm)
    env = _get_shape_env(gm)
    assert env.guards  # the branch on x.shape[0] left one
    (symbol,) = env.var_to_sources
    env.guards.append(env.guards[0]._replace(expr=symbol < 60))  # a ShapeGuard (a named tuple)
    printed = patched(gm)
    assert printed == _convert_guards_to_code(gm) and any("60" in line for line in printed)
    assert len(calls) == 2


def test_installed_around_the_executorch_lowering():
    import exporters.exporter_executorch as et

    assert PATH.startswith(et._EXECUTORCH_INTERNALS)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4)).eval()
    inputs = {"input": torch.randn(3, 4)}
    art = et.ExecutorchExporter().export(model, inputs, et.ExecutorchConfig(dynamic=True))
    assert f"patch:executorch:{PATH}" in art.workarounds_fired
    for batch in (2, 5):
        x = torch.randn(batch, 4)
        (actual,) = art(input=x).values()
        torch.testing.assert_close(actual, model(x), atol=1e-5, rtol=1e-5)
