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
name matches ``SPECIALIZED_INPUTS``, and the inputs ``LAYOUT_INPUTS_OF_MODULES`` names for a module the
model holds; a tuple names them; ``()`` bakes none.

A baked boolean mask that indexes a traced tensor (``features[mask]``) is replaced by the integer
indices of its True elements, computed on the real values (``ConcreteValues``): the same selection
(a boolean index is its ``nonzero()`` in place, as torch's own indexing expands it), but of a size
the trace knows, where the mask itself would select a data-dependent number of rows (an unbacked
size). Qwen2.5-Omni's and Qwen3-Omni's audio encoders select the valid frames that way
(``input_features.permute(0, 2, 1)[feature_attention_mask.bool()]``) and then split them by lengths
summed from the same mask (``chunk_and_pad_features``: ``.split(chunk_lengths.tolist())``); with the
mask baked both are static.

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
import dataclasses
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
# Inputs a module of these config types turns into Python sizes (module docstring), baked by default for
# a model that holds one. Qwen2AudioEncoder reads feature_attention_mask as an attention mask only, so
# its artifacts keep the audio length dynamic.
LAYOUT_INPUTS_OF_MODULES = {
    "qwen2_5_omni_audio_encoder": ("feature_attention_mask",),
    "qwen3_omni_moe_audio_encoder": ("feature_attention_mask",),
}


# the mark an export records when ConcreteValues replaced a baked boolean mask by its indices (module docstring)
BAKED_MASK_FIX = "fix:dynamo:baked_mask_as_indices"
BAKED_MASK_RULE = [True]  # switched off by sweeps.recheck (``switched_off``) to re-run an item without the rule
BAKED_MASK_DOC = ("A baked boolean mask indexing a traced tensor is replaced by the indices of its True elements "
                  "(computed on the real values): the same selection, of a static size")


def module_layout_inputs(model: torch.nn.Module | None) -> list[str]:
    """The inputs ``LAYOUT_INPUTS_OF_MODULES`` names for the modules ``model`` holds."""
    if model is None:
        return []
    found: list[str] = []
    for module in model.modules():
        for name in LAYOUT_INPUTS_OF_MODULES.get(getattr(getattr(module, "config", None), "model_type", None), ()):
            if name not in found:
                found.append(name)
    return found


def specialized_inputs(inputs: Mapping[str, Any], specialize: tuple[str, ...] | None,
                       model: torch.nn.Module | None = None) -> list[str]:
    """The tensor inputs an export of ``model`` bakes in (see the module docstring); without ``model``,
    the name rule only (``with_layout_inputs`` resolves a model's at the export's start)."""
    if specialize is not None:
        unknown = [n for n in specialize if not isinstance(inputs.get(n), torch.Tensor)]
        if unknown:
            tensors = sorted(k for k, v in inputs.items() if isinstance(v, torch.Tensor))
            raise ValueError(f"ExportConfig.specialize names {unknown}, which are not tensor inputs; tensor inputs: {tensors}")
        return list(specialize)
    return _baked_by_default(inputs, module_layout_inputs(model))


def _baked_by_default(inputs: Mapping[str, Any], layout: list[str]) -> list[str]:
    """The inputs ``specialize=None`` bakes: those ``layout`` names and the integer ones ``SPECIALIZED_INPUTS`` matches."""
    return [k for k, v in inputs.items() if isinstance(v, torch.Tensor) and (k in layout or (
        SPECIALIZED_INPUTS.search(k) and not (v.is_floating_point() or v.is_complex() or v.dtype == torch.bool)))]


def with_layout_inputs(config: Any, model: torch.nn.Module, inputs: Mapping[str, Any]) -> Any:
    """``config`` with ``specialize`` spelled out when ``model`` holds a module whose inputs
    ``LAYOUT_INPUTS_OF_MODULES`` names, so that every trace of the export (stage 0's, the wrapped quantized
    model's, a lowering's retry) bakes the same inputs; ``config`` itself otherwise."""
    if config.specialize is not None:
        return config
    layout = module_layout_inputs(model)  # one walk over the model's modules
    if not any(isinstance(inputs.get(n), torch.Tensor) for n in layout):
        return config
    return dataclasses.replace(config, specialize=tuple(_baked_by_default(inputs, layout)))


_FROM_PYTHON_DATA = (torch.arange, torch.tensor, torch.as_tensor)


class ConcreteValues(TorchFunctionMode):
    """While tracing, run every torch call whose tensor arguments are all baked (or computed from
    baked ones only) on the real values, outside the trace; everything else traces as usual, a baked
    tensor that meets a traced one entering the graph as a constant."""

    def __init__(self, baked: Iterable[torch.Tensor]):
        super().__init__()
        self._known: dict[int, weakref.ref] = {}
        self.masks_as_indices = 0  # baked boolean masks replaced by their indices (module docstring)
        for tensor in baked:
            self._add(tensor)

    def _add(self, tensor: torch.Tensor) -> None:
        self._known[id(tensor)] = weakref.ref(tensor)

    def is_concrete(self, value: Any) -> bool:
        ref = self._known.get(id(value))
        return ref is not None and ref() is value

    def _masks_as_indices(self, index: Any) -> tuple | None:
        """``index`` with each baked boolean mask of one or more dims replaced by the integer indices of
        its True elements (``mask.nonzero(as_tuple=True)``, computed on the real values); None when it
        holds no such mask."""
        items = index if isinstance(index, tuple) else (index,)
        masks = [isinstance(i, torch.Tensor) and i.dtype == torch.bool and i.dim() > 0 and self.is_concrete(i)
                 for i in items]
        if not any(masks):
            return None
        expanded: list[Any] = []
        for item, is_mask in zip(items, masks, strict=True):
            if not is_mask:
                expanded.append(item)
                continue
            with untraced():
                positions = item.nonzero(as_tuple=True)
            self.masks_as_indices += 1
            for p in positions:
                self._add(p)
            expanded.extend(positions)
        return tuple(expanded)

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
        if func is torch.Tensor.__getitem__ and len(args) == 2 and BAKED_MASK_RULE[0] and not self.is_concrete(args[0]):
            index = self._masks_as_indices(args[1])
            if index is not None:  # a baked boolean mask selecting from a traced tensor (module docstring)
                return func(args[0], index)
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
