"""State a model keeps in plain module attributes its forward sets, carried by the components as a cache is.

RecurrentGemma keeps each recurrent block's convolution state (``conv1d_state``) and its RG-LRU's recurrent
state (``rg_lru.recurrent_states``) on the modules, set in forward (transformers
models/recurrent_gemma/modeling_recurrent_gemma.py, RecurrentGemmaRecurrentBlock.forward and
RecurrentGemmaRglru.forward), and returns no cache holding them: an exported step would keep their value at
export as constants. Which attributes are such state is read off generate's calls (``steps.module_state``:
tensors of batch rows that the second decode step changed); each is carried where ``steps.uncarriable`` finds
nothing against it (one shape and dtype after every call; every call starts from what the call before left),
and any other is refused by name (``steps.check_no_module_state``).

Carrying (``HeldAttributes``): the component sets each attribute to its input before the model's forward and
reads it back after it, as an output, then puts back what the module held before. Neither the model nor
torch.export sees an assignment left behind (torch.export's non-strict trace compares module attributes
before and after the trace, warns of tensor attributes assigned in it and restores them: torch
_functorch/_aot_autograd/frontend_utils.py ``_detect_attribute_assignment``; the traced values are read back
inside the trace, as graph outputs).

- dynamic form: the tree ``module_state`` (``steps.MODULE_STATE``): the decode component takes
  ``module_state__<j>`` and returns ``module_state.<j>``, under the step rule ``attributes``; the prefill
  returns them, computed from the attributes cleared (None, as a module holds them before its first call: a
  model that keeps such state makes its own start, RecurrentGemma zeros of the batch's rows), checked in eager
  against what the captured prefill left (a prefill that reads the state before it is refused).
- static form (``StaticStep``, ``module_state=``): buffers ``state_<j>`` (dynamo, ExecuTorch) or inputs
  ``past_state_<j>`` returned as ``present_state_<j>`` (ONNX); the step runs one token a call and the call
  at position 0 starts each from zero, the model's own start, checked in eager (``zero_start``).
The attributes carried are recorded as ``module_state`` in each component's metadata and the generator's.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from exporters.generation.capture import GenerationError
from exporters.generation.component import FlatComponent, leaf_input_name
from exporters.generation.steps import MODULE_STATE, Returned

_MISSING = object()


class HeldAttributes:
    """The module attributes ``names`` (dotted paths under ``model``, as ``steps.module_attributes`` names them)."""

    def __init__(self, model: torch.nn.Module, names: Sequence[str]):
        self.names = list(names)
        modules = dict(model.named_modules())
        self.places = []
        for name in self.names:
            owner, _, attribute = name.rpartition(".")
            if owner not in modules:
                raise GenerationError(f"module state {name!r}: no submodule {owner!r}")
            self.places.append((modules[owner], attribute))

    @contextlib.contextmanager
    def holding(self, values: Sequence[torch.Tensor | None] | None):
        """Within the block each attribute is ``values[j]`` (None: cleared); ``read()`` gives them as the
        block's forward left them. What the modules held before is put back on leaving."""
        saved = [vars(module).get(attribute, _MISSING) for module, attribute in self.places]
        try:
            for j, (module, attribute) in enumerate(self.places):
                setattr(module, attribute, None if values is None else values[j])
            yield self.read
        finally:
            for (module, attribute), value in zip(self.places, saved):
                if value is _MISSING:
                    vars(module).pop(attribute, None)
                else:
                    vars(module)[attribute] = value

    def read(self) -> list[torch.Tensor]:
        values = [vars(module).get(attribute) for module, attribute in self.places]
        missing = [n for n, v in zip(self.names, values) if not isinstance(v, torch.Tensor)]
        if missing:
            raise GenerationError(f"the forward left no tensor in the module state {missing}, which it sets at "
                                  "every call of generate")
        return values


class StateComponent(FlatComponent):
    """A ``FlatComponent`` that carries ``state``: takes ``module_state__<j>`` (``takes``: the decode step; else
    the attributes cleared, the prefill) and returns ``module_state`` beside the model's outputs."""

    def __init__(self, model: torch.nn.Module, call, baked: tuple[str, ...], returned: tuple[str, ...],
                 state: HeldAttributes, takes: bool):
        super().__init__(model, call, baked, returned)
        self.state, self.takes = state, takes

    def forward(self, **flat: torch.Tensor) -> Any:
        values = [flat.pop(leaf_input_name(MODULE_STATE, j)) for j in range(len(self.state.names))] if self.takes else None
        with self.state.holding(values) as read:
            out = super().forward(**flat)
            new = read()
        items = out.items() if isinstance(out, Mapping) else vars(out).items()
        return {**{k: v for k, v in items if v is not None}, MODULE_STATE: new}


def state_components(model: torch.nn.Module, carried: Sequence[str], prefill, decode, baked: tuple[str, ...],
                     updated: tuple[str, ...], left: Returned) -> dict[str, tuple[StateComponent, dict]]:
    """The prefill's and the decode step's components carrying ``carried``, each with the inputs it adds to its
    call's (the decode step's: what the prefill left). ``left``: what the captured prefill left, which the
    prefill component, run in eager from cleared attributes, must give."""
    from exporters.generation.component import flat_call_inputs

    state = HeldAttributes(model, carried)
    prefill_component = StateComponent(model, prefill, baked, updated, state, takes=False).eval()
    with torch.no_grad():
        out = prefill_component(**flat_call_inputs(prefill, baked), **prefill.constants)
    wrong = [n for n, v in zip(carried, out[MODULE_STATE]) if not _close(v, left.attributes[n])]
    if not _close(out.get("logits"), left.outputs.get("logits")):
        wrong.insert(0, "logits")
    if wrong:
        raise GenerationError(f"{type(model).__name__}'s prompt call, run from its module state {carried[:3]} cleared, "
                              f"does not give what generate's gave ({wrong[:3]} differ): its prompt call reads state the "
                              "call before it left, which the components do not carry")
    # contiguous, as every runtime is handed them (a state the forward sliced out of a transposed tensor keeps its
    # strides in the clone: RecurrentGemma's conv state; ExecuTorch's program would expect that dim order)
    decode_inputs = {leaf_input_name(MODULE_STATE, j): left.attributes[n].contiguous() for j, n in enumerate(carried)}
    return {"prefill": (prefill_component, {}),
            "decode": (StateComponent(model, decode, (), updated, state, takes=True).eval(), decode_inputs)}


def _close(a, b) -> bool:
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape \
        and torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-5)


def batch_only(config, example: Mapping[str, Any]):
    """``config`` with each state input of ``example`` dynamic in its batch dim only, where the export's dims are
    all dynamic (``config.dynamic`` without ``dynamic_shapes``): a state keeps one shape after every call, so
    its other dims are the model's sizes (RecurrentGemma's conv width, which Dim.AUTO left a symbol in [1, 4]
    that the runtime would check against the weights')."""
    if not getattr(config, "dynamic", False) or getattr(config, "dynamic_shapes", None) is not None:
        return config
    from exporters.tracing import auto_dynamic_shapes

    tensors = {k: v for k, v in example.items() if isinstance(v, torch.Tensor)}
    shapes = auto_dynamic_shapes(tensors, config.max_dim, 1 if config.accept_size_one else 2)
    for name, dims in shapes.items():
        if name.startswith(leaf_input_name(MODULE_STATE, "")):
            shapes[name] = {d: spec if d == 0 else None for d, spec in dims.items()}
    return dataclasses.replace(config, dynamic_shapes=shapes)


class StepState:
    """The static step's module state (module docstring): ``initial`` maps each carried attribute to its value
    after the prompt's call of the static generate (its shape and dtype); ``state``: ``"buffers"`` or ``"inputs"``."""

    def __init__(self, model: torch.nn.Module, initial: Mapping[str, torch.Tensor], state: str):
        self.names, self.state = list(initial), state
        self.held = HeldAttributes(model, self.names)
        self.like = [v.detach().contiguous() for v in initial.values()]

    def register(self, step: torch.nn.Module) -> None:
        if self.state == "buffers":
            for j, value in enumerate(self.like):
                step.register_buffer(f"state_{j}", torch.zeros_like(value))

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The state inputs ``past_state_<j>`` (outputs ``present_state_<j>``) and their shapes."""
        return {f"past_state_{j}": tuple(v.shape) for j, v in enumerate(self.like)}

    def zeros(self) -> dict[str, torch.Tensor]:
        return {f"past_state_{j}": torch.zeros_like(v) for j, v in enumerate(self.like)}

    @contextlib.contextmanager
    def holding(self, step: torch.nn.Module, given: Mapping[str, torch.Tensor], fresh: torch.Tensor | None):
        """Within the block the attributes hold the step's state (zero at position 0: ``fresh`` is False there,
        for the buffers; the loop gives zeros as inputs); ``finish()`` then stores what the forward left (the
        buffers) or gives it as ``present_state_<j>`` outputs."""
        if self.state == "inputs":
            values = [given[f"past_state_{j}"] for j in range(len(self.names))]
        else:
            values = [getattr(step, f"state_{j}") for j in range(len(self.names))]
            values = [v if fresh is None else v * fresh.to(v.dtype) for v in values]
        with self.held.holding(values) as read:
            def finish() -> dict[str, torch.Tensor]:
                new = read()
                if self.state == "inputs":
                    return {f"present_state_{j}": v for j, v in enumerate(new)}
                for j, v in enumerate(new):
                    getattr(step, f"state_{j}").copy_(v)
                return {}

            yield finish
