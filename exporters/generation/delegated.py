"""A model whose ``generate`` runs no forward of its own: it computes a sub-model's inputs in Python and returns
what that sub-model's ``generate`` returns. Blip-2 and InstructBlip(Video) run the image through the vision tower
and the Q-Former and merge it into the language model's ``inputs_embeds``; Blip hands its text decoder the image
embeddings as ``encoder_hidden_states``; Kosmos-2 hands its text model ``image_embeds``.

Its generation export is two parts: a ``handoff`` component, the model's own ``generate`` run up to the call of
the sub-model's ``generate`` and returning the tensors that call is given (exported like any module, over the
caller's inputs), and the sub-model's generation export over those tensors (any cache form). ``DelegatedGenerator``
runs the one, then the other; both parts come from the model's own code, nothing of a family's loop is re-written.

Found by running the model's ``generate`` once (``find_delegate``), and taken only where it called no forward of
its own, called one sub-model's ``generate`` once and returned that call's result unchanged: anything it did
after the call would be missing from the exported loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import torch

from exporters.generation.capture import GenerationError, forward_wrapped

HANDOFF = "handoff"
# what generate takes to run its loop, never handed on as an input: the caller's own, passed to the inner loop
LOOP_ARGS = ("max_new_tokens", "min_new_tokens", "do_sample", "return_dict_in_generate", "output_logits")
# the handed-on constants the inner loop takes as its own arguments (Blip: its text decoder's end and pad ids)
LOOP_CONSTANTS = ("eos_token_id", "pad_token_id")


class _HandedOff(Exception):  # noqa: N818 - not an error: how the handoff component stops generate at the call
    def __init__(self, kwargs: dict[str, Any]):
        super().__init__("handed off")
        self.kwargs = kwargs


@dataclasses.dataclass
class Delegate:
    """``child``: the attribute naming the sub-model; ``kwargs``: what the model's generate passed its generate;
    ``passthrough``: those of its tensors that are the caller's own inputs unchanged (name -> the input's name)."""

    child: str
    kwargs: dict[str, Any]
    passthrough: dict[str, str] = dataclasses.field(default_factory=dict)

    def computed(self) -> list[str]:
        """The tensors the model's generate computed before the call: the handoff component's outputs."""
        return [k for k in self.tensors() if k not in self.passthrough]

    def tensors(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.kwargs.items() if isinstance(v, torch.Tensor)}

    def constants(self) -> dict[str, Any]:
        return {k: v for k, v in self.kwargs.items()
                if v is not None and not isinstance(v, torch.Tensor) and k not in LOOP_ARGS}


def _generating_children(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    from transformers import GenerationMixin

    return {name: child for name, child in model.named_children()
            if isinstance(child, GenerationMixin) and callable(getattr(child, "generate", None))}


def find_delegate(model: torch.nn.Module, inputs: Mapping[str, Any]) -> Delegate | None:
    """The sub-model ``model.generate`` hands its work to, or None (it runs its own forward, as most do). Only a
    model whose class overrides ``generate`` and has a sub-model that can generate is run."""
    from transformers import GenerationMixin

    if getattr(type(model), "generate", None) is GenerationMixin.generate:
        return None
    children = _generating_children(model)
    if not children:
        return None
    handed: list[tuple[str, dict[str, Any], Any]] = []
    forwards: list[int] = []

    def recorded(name):
        def around(generate, args, kwargs):
            if args:
                raise GenerationError(f"{type(model).__name__}.generate calls {name}.generate with positional "
                                      "arguments; generation export takes keyword calls")
            out = generate(**kwargs)
            handed.append((name, dict(kwargs), out))
            return out
        return around

    with contextlib.ExitStack() as stack:
        stack.enter_context(forward_wrapped(model, lambda forward, args, kwargs: forwards.append(1) or forward(*args, **kwargs)))
        for name, child in children.items():
            stack.enter_context(forward_wrapped(child, recorded(name), "generate"))
        stack.enter_context(torch.no_grad())
        # on copies: generate may write its inputs in place (Blip sets input_ids[:, 0] to its bos id)
        own = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        result = model.generate(**own, max_new_tokens=2, do_sample=False)
    if forwards or not handed:
        return None
    if len(handed) != 1 or result is not handed[0][2]:
        raise GenerationError(f"{type(model).__name__}.generate calls {[n for n, _, _ in handed]}.generate and returns "
                              "something else than one such call's result: generation export takes a generate that hands "
                              "one sub-model's generate its inputs and returns what it returns")
    name, kwargs, _ = handed[0]
    passthrough = {k: n for k, v in kwargs.items() if isinstance(v, torch.Tensor)
                   for n, t in own.items() if t is v}
    return Delegate(name, {k: v for k, v in kwargs.items() if k not in LOOP_ARGS}, passthrough)


class HandoffComponent(torch.nn.Module):
    """``model.generate(**inputs)`` run until it calls ``<child>.generate``; returns the ``outputs`` among the tensors
    that call was given (those it computed; the caller's own inputs it hands on unchanged are passed on as they are)."""

    def __init__(self, model: torch.nn.Module, child: str, outputs: list[str]):
        super().__init__()
        self.model = model
        self.child = child
        self.outputs = list(outputs)

    def forward(self, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        def stop(generate, args, kwargs):
            raise _HandedOff(kwargs)

        # on copies: generate may write its inputs in place (Blip sets input_ids[:, 0] to its bos id)
        own = {k: v.clone() for k, v in inputs.items()}
        try:
            with forward_wrapped(getattr(self.model, self.child), stop, "generate"), torch.no_grad():
                self.model.generate(**own, max_new_tokens=1, do_sample=False)
        except _HandedOff as handoff:
            return {k: handoff.kwargs[k] for k in self.outputs}
        raise GenerationError(f"{type(self.model).__name__}.generate returned without calling {self.child}.generate")


def export_delegated(exporter, model, inputs: Mapping[str, Any], config, delegate: Delegate, export_inner,
                     quantization) -> DelegatedGenerator:
    """The handoff component over the caller's tensors and ``export_inner(child, handed_inputs, quantization)``,
    the sub-model's generation export."""
    name = type(model).__name__
    odd = [k for k in delegate.constants() if k not in LOOP_CONSTANTS]
    if odd:
        raise GenerationError(f"{name}.generate hands {delegate.child}.generate {odd}, which the exported loop does not "
                              f"take (it takes {list(LOOP_CONSTANTS)} beside the tensors)")
    if quantization and HANDOFF in quantization:
        raise GenerationError(f"quantization names {HANDOFF!r}: {name}'s handoff component (its generate up to "
                              f"{delegate.child}.generate) takes no recipe; name the sub-model's components")
    given = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    handoff_module = HandoffComponent(model, delegate.child, delegate.computed()).eval()
    with torch.no_grad():  # generate is a no_grad function: under grad mode the export would hold a grad-mode switch
        handoff = exporter.export(handoff_module, given, config if config is not None else exporter.config_class())
    handoff.extra_metadata["component"] = HANDOFF
    # the sub-model's inputs as find_delegate's run of generate handed them on
    inner_inputs = {**delegate.tensors(), **{k: given[src] for k, src in delegate.passthrough.items()},
                    **delegate.constants()}
    inner = export_inner(getattr(model, delegate.child), inner_inputs, quantization)
    return DelegatedGenerator(handoff, inner, delegate.child, delegate.passthrough, delegate.constants(), name)


class DelegatedGenerator:
    """The handoff component, then the sub-model's generator (``inner``: a ``Generator`` or ``StaticGenerator``)
    over what it returns. Everything but ``generate``, ``components``, ``save`` and ``loop_inputs`` is the inner
    generator's (its rules, cache form, metadata)."""

    def __init__(self, handoff, inner, child: str, passthrough: Mapping[str, str], constants: Mapping[str, Any],
                 model_class: str):
        self.handoff = handoff
        self.inner = inner
        self.child = child
        self.passthrough = dict(passthrough)
        self.constants = dict(constants)
        self.model_class = model_class
        self.source = None

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (copy / unpickle): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def components(self) -> dict[str, Any]:
        return {HANDOFF: self.handoff, **self.inner.components}

    @property
    def loop_inputs(self) -> list[str]:
        """What ``generate`` takes: the handoff component's inputs (the model's own generate's)."""
        return list(self.handoff.input_names)

    def generate(self, teacher_tokens: torch.Tensor | None = None, **given: Any):
        tensors = {k: v for k, v in given.items() if isinstance(v, torch.Tensor)}
        loop = {k: v for k, v in given.items() if not isinstance(v, torch.Tensor) and v is not None}
        unknown = [k for k in tensors if k not in self.handoff.input_names]
        missing = [k for k in self.handoff.input_names if k not in tensors]
        if unknown or missing:
            raise GenerationError(f"{self.model_class}'s generator takes {self.handoff.input_names}"
                                  + (f"; missing {missing}" if missing else "") + (f"; unexpected {unknown}" if unknown else ""))
        clash = [k for k in self.constants if k in loop]
        if clash:  # eager's generate would refuse a second value for them too
            raise GenerationError(f"{self.model_class}.generate sets {clash} itself ({self.constants}) for "
                                  f"{self.child}.generate: do not pass them")
        handed = self.handoff(**tensors)
        inner_inputs = {**handed, **{k: tensors[src] for k, src in self.passthrough.items()}}
        return self.inner.generate(**inner_inputs, **self.constants, **loop, teacher_tokens=teacher_tokens)

    def save(self, directory: str | os.PathLike, runner: bool = False) -> str:
        if runner:
            raise GenerationError(f"save(runner=True): {self.model_class}'s generate runs its {HANDOFF} component "
                                  "before the language model, which a runner folder has no place for")
        path = self.inner.save(directory)
        self.handoff.save(os.path.join(directory, HANDOFF))
        with open(path) as f:
            doc = json.load(f)
        doc["delegated"] = {"child": self.child, "passthrough": self.passthrough, "constants": self.constants,
                            "model_class": self.model_class}
        with open(path, "w") as f:
            json.dump(doc, f, indent=2)
        return path


def delegated_from(spec: Mapping[str, Any], handoff, inner) -> DelegatedGenerator:
    """The generator ``DelegatedGenerator.save`` described in ``spec`` (its generator.json's "delegated"), over the
    loaded handoff artifact and inner generator; a ValueError names what does not fit (a key missing, an input the
    handoff does not take, a constant the loop does not take)."""
    missing = [k for k in ("child", "passthrough", "constants", "model_class") if k not in spec]
    if missing:
        raise ValueError(f"'delegated' has no {missing}")
    unknown = sorted(set(spec["passthrough"].values()) - set(handoff.input_names))
    if unknown:
        raise ValueError(f"'delegated' passes on {unknown}, which the handoff component does not take "
                         f"({handoff.input_names})")
    odd = sorted(set(spec["constants"]) - set(LOOP_CONSTANTS))
    if odd:
        raise ValueError(f"'delegated' sets {odd}; the loop takes {list(LOOP_CONSTANTS)} only")
    return DelegatedGenerator(handoff, inner, spec["child"], spec["passthrough"], spec["constants"], spec["model_class"])
