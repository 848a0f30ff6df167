"""exporters.executorch.constant_scalars: an ``.item()`` no input can change is folded to its int; one that an
input, a random op or an in-place write of an input reaches is left alone."""

import pytest
import torch

from exporters import exporter_executorch as et
from exporters.executorch.constant_scalars import fold_input_independent_scalars, input_dependent_nodes
from exporters.executorch.unbacked import traced_unbacked_values


class _ConstantOffsets(torch.nn.Module):
    """Ernie 4.5-VL's resampler: offsets written into torch.empty from a constant table, read back
    with .item() as arange bounds."""

    def __init__(self):
        super().__init__()
        self.sizes = torch.tensor([3, 5])

    def forward(self, x):
        offsets = torch.empty(2, dtype=torch.int64)
        offsets[0] = 0
        offsets[1:] = self.sizes.cumsum(0)[:-1]
        index = torch.cat([torch.arange(offsets[i] + 0, offsets[i] + self.sizes[i]) for i in range(2)])
        return x[index] * 2


def _items(program):
    return [n for n in program.graph.nodes if n.target in (torch.ops.aten.item.default,
                                                           torch.ops.aten._local_scalar_dense.default)]


def _export(model, *args):
    return torch.export.export(model, args, strict=False)


def test_items_of_constants_are_folded():
    model, x = _ConstantOffsets(), torch.randn(8, 4)
    program = _export(model, x)
    assert _items(program)
    assert not set(_items(program)) & input_dependent_nodes(program)
    assert fold_input_independent_scalars(program, traced_unbacked_values(program, [x])) == len(_items(_export(model, x)))
    assert not _items(program)
    torch.testing.assert_close(program.module()(x), model(x))


class _InputCount(torch.nn.Module):
    def forward(self, x):
        return torch.arange(0, (x > 0).sum().item())


class _WrittenFromInput(torch.nn.Module):
    """The read slot holds a constant, but the buffer it is read from was written from the input."""

    def forward(self, x):
        buf = torch.full((2,), 3, dtype=torch.int64)
        buf[0] = (x > 0).sum()
        return torch.arange(0, buf[1].item()) + buf[0]


class _Random(torch.nn.Module):
    def forward(self, x):
        return x[: torch.randint(1, 4, ()).item()]


@pytest.mark.parametrize("model", [_InputCount(), _WrittenFromInput(), _Random()],
                         ids=["input", "written-from-input", "random"])
def test_items_an_input_or_randomness_reaches_are_kept(model):
    x = torch.randn(6)
    program = _export(model, x)
    assert _items(program) and set(_items(program)) <= input_dependent_nodes(program)
    assert fold_input_independent_scalars(program, traced_unbacked_values(program, [x])) == 0
    assert _items(program)


def test_executorch_plans_an_arange_between_constant_offsets():
    """Without the fold, memory planning finds no bound for the arange's length u1 - u0."""
    model, inputs = _ConstantOffsets(), {"x": torch.randn(8, 4)}
    art = et.ExecutorchExporter().export(model, inputs)
    assert "fix:executorch:fold_input_independent_scalars" in art.workarounds_fired
    (actual,) = art(**inputs).values()
    torch.testing.assert_close(actual, model(**inputs))
