"""Layout-metadata inputs baked into the artifact with their values kept concrete while tracing.

Vision-language models take small integer tensors that describe another input's layout
(``image_grid_thw``, ``image_sizes``, ``target_sizes`` ...) and turn them into Python ints to
slice, split and reshape with. To ``torch.export`` an input's values are data, so each such int is
an unbacked symbol and the trace stops (``GuardOnDataDependentSymNode``). In a static export those
values are fixed by the input shapes anyway; the exporters therefore bake them in: the forward gets
a real copy, and under ``ConcreteValues`` (a torch function mode) every operation among baked
tensors runs eagerly on the real values outside the trace (so ``int(grid[0, 1])`` is a plain int),
while a baked tensor that meets a traced one enters the graph as an ordinary constant. The artifact keeps the values and
refuses others, naming the input (``Artifact.check_inputs``).

``ExportConfig.specialize`` chooses the inputs: ``None`` (default) bakes every integer input whose
name matches ``SPECIALIZED_INPUTS``; a tuple names them; ``()`` bakes none.

Scalar integer buffers are baked the same way (``constant_buffers_baked``): a 0-dim integer
buffer that is not saved with the weights (``persistent=False``) is a constant of the architecture
(Encodec's, Mimi's and PocketTTS's causal conv keep stride, kernel_size and padding_total so and
compute their padding from them). torch.export lifts buffers as traced inputs, so that padding
became an unbacked ``.item()``; baked, it is the int it always is.

Buffers named in ``CONSTANT_BUFFERS`` are baked too, whatever their dtype or shape: a schedule the
model keeps as state and reads back as Python numbers. EoMT's ``attn_mask_probs`` (the masked-
attention annealing probabilities, a persistent float buffer fixed after training) decides per
block ``if self.training or self.attn_mask_probs[i] > 0`` and ``if prob < 1``; traced, each is a
guard on a buffer's value ("Could not guard on data-dependent expression"). The artifact holds the
buffer's value either way; baked, the branches are decided by it while tracing.
"""

from __future__ import annotations

import contextlib
import re
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

SPECIALIZED_INPUTS = re.compile(r"(^|_)(grid_thws?|grid_hws?|sizes)$")
CONSTANT_BUFFERS = re.compile(r"^attn_mask_probs$")


def specialized_inputs(inputs: Mapping[str, Any], specialize: tuple[str, ...] | None) -> list[str]:
    """The tensor inputs an export bakes in (see the module docstring)."""
    if specialize is not None:
        unknown = [n for n in specialize if not isinstance(inputs.get(n), torch.Tensor)]
        if unknown:
            tensors = sorted(k for k, v in inputs.items() if isinstance(v, torch.Tensor))
            raise ValueError(f"ExportConfig.specialize names {unknown}, which are not tensor inputs; tensor inputs: {tensors}")
        return list(specialize)
    return [k for k, v in inputs.items() if isinstance(v, torch.Tensor) and SPECIALIZED_INPUTS.search(k)
            and not (v.is_floating_point() or v.is_complex() or v.dtype == torch.bool)]


_FROM_PYTHON_DATA = (torch.arange, torch.tensor, torch.as_tensor)


class ConcreteValues(TorchFunctionMode):
    """While tracing, run every torch call whose tensor arguments are all baked (or computed from
    baked ones only) on the real values, outside the trace; everything else traces as usual, a baked
    tensor that meets a traced one entering the graph as a constant."""

    def __init__(self, baked: Iterable[torch.Tensor]):
        super().__init__()
        self._known: dict[int, weakref.ref] = {}
        for tensor in baked:
            self._add(tensor)

    def _add(self, tensor: torch.Tensor) -> None:
        self._known[id(tensor)] = weakref.ref(tensor)

    def is_concrete(self, value: Any) -> bool:
        ref = self._known.get(id(value))
        return ref is not None and ref() is value

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = pytree.tree_leaves((args, kwargs))
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        symbolic = any(isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) for v in leaves)
        # a tensor made from plain Python numbers is concrete too: layout code builds its gather
        # indices from torch.arange(grid_h * grid_w), then compacts them with a mask
        # (get_vision_window_index), and reads config ints back from torch.tensor([merge_size])
        # .expand(n).tolist() (get_vision_position_ids), which traced is an unbacked symbol that
        # ExecuTorch's memory planning cannot bound
        fresh = func in _FROM_PYTHON_DATA and not tensors
        if (fresh or (tensors and all(self.is_concrete(t) for t in tensors))) and not symbolic:
            with untraced():
                out = func(*args, **kwargs)
            for value in pytree.tree_leaves(out):
                if isinstance(value, torch.Tensor):
                    self._add(value)
            return out
        return func(*args, **kwargs)


@contextlib.contextmanager
def untraced():
    """Run the block on real tensors, outside any active trace or torch function mode."""
    with _disable_current_modes(), torch._C.DisableTorchFunction():
        yield


def concrete(value: torch.Tensor) -> torch.Tensor:
    """A real (untraced) copy of a baked input, made outside any active trace."""
    with untraced():
        return value.detach().clone()


def constant_buffers(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
    """``(module, name)`` of every 0-dim integer non-persistent buffer and every buffer named in
    ``CONSTANT_BUFFERS`` (see the module docstring)."""
    found = []
    for module in model.modules():
        for name, buf in module._buffers.items():
            if buf is None:
                continue
            scalar_int = (buf.dim() == 0 and name in module._non_persistent_buffers_set
                          and not (buf.is_floating_point() or buf.is_complex() or buf.dtype == torch.bool))
            if scalar_int or CONSTANT_BUFFERS.search(name):
                found.append((module, name))
    return found


@contextlib.contextmanager
def constant_buffers_baked(model: torch.nn.Module):
    """While tracing, each constant buffer is a plain attribute holding a real copy (torch.export
    does not lift it); yields the copies, for ``ConcreteValues``. The buffers are back afterwards."""
    moved, copies = [], []
    try:
        for module, name in constant_buffers(model):
            buf = module._buffers.pop(name)
            moved.append((module, name, buf))
            copies.append(concrete(buf))
            module.__dict__[name] = copies[-1]
        yield copies
    finally:
        for module, name, buf in moved:
            module.__dict__.pop(name, None)
            module._buffers[name] = buf
