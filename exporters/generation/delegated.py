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

The sub-model may be the model itself: a class whose ``generate`` override runs Python over the caller's tensors
and then hands the generic loop (``super().generate``, ``GenerationMixin.generate``) tensors it computed (Pop2Piano
prepends a composer embedding to ``input_features`` and passes the result as ``inputs_embeds``). The handoff
component is then the override up to that call, and the inner export is the model with the generic ``generate``
(``GENERIC``). Taken only where the override computed a tensor it hands on, ran no forward outside the generic
loop and returned its result unchanged; an override that only passes the caller's inputs on (GraniteSpeech,
Kyutai) or does more around the loop (Whisper) is captured through its own ``generate`` as before. The
override's plain arguments (Pop2Piano's ``composer``: the caller's, in ``inputs``, or its signature's default)
are fixed in the handoff component at export and recorded as its metadata's ``arguments``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import inspect
import json
import os
import types
from collections.abc import Mapping
from typing import Any

import torch

from exporters.generation.capture import GenerationError, _by_name, forward_wrapped

HANDOFF = "handoff"
# what generate takes to run its loop, never handed on as an input: the caller's own, passed to the inner loop
LOOP_ARGS = ("max_new_tokens", "min_new_tokens", "do_sample", "return_dict_in_generate", "output_logits")
# the handed-on constants the inner loop takes as its own arguments (Blip: its text decoder's end and pad ids)
LOOP_CONSTANTS = ("eos_token_id", "pad_token_id")
# Delegate.child where the model's generate override hands the generic loop on the model itself its inputs
GENERIC = "GenerationMixin.generate"
PLAIN = (str, int, float, bool)  # the override's arguments the handoff component fixes at export


def callee(child: str) -> str:
    """What the model's generate hands its inputs to, for messages."""
    return child if child == GENERIC else f"{child}.generate"


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
    # the plain arguments the model's generate ran with: the caller's (in inputs) or its signature's defaults
    arguments: dict[str, Any] = dataclasses.field(default_factory=dict)

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


def _generic(model: torch.nn.Module) -> bool:
    """Whether ``model.generate`` is the generic loop (its class's, or the inner export's view: ``generic_view``)."""
    from transformers import GenerationMixin

    generate = getattr(model, "generate", None)
    return getattr(type(model), "generate", None) is GenerationMixin.generate \
        or getattr(generate, "__func__", None) is GenerationMixin.generate


@contextlib.contextmanager
def generic_wrapped(model: torch.nn.Module, around):
    """Within the block, a call of ``GenerationMixin.generate`` on ``model`` (its override's ``super().generate``)
    is ``around(generate, args, kwargs)``; calls on any other model run as they are. ``super()`` looks ``generate``
    up on the class at each call, so the class attribute is what is replaced, for the block only."""
    from transformers import GenerationMixin

    original = GenerationMixin.__dict__["generate"]

    @functools.wraps(original)
    def generate(self, *args, **kwargs):
        if self is not model:
            return original(self, *args, **kwargs)
        return around(functools.partial(original, self), args, kwargs)

    GenerationMixin.generate = generate
    try:
        yield
    finally:
        GenerationMixin.generate = original


@contextlib.contextmanager
def generic_view(model: torch.nn.Module):
    """Within the block, ``model.generate`` is ``GenerationMixin.generate`` (the loop its override hands on to)."""
    from transformers import GenerationMixin

    model.generate = types.MethodType(GenerationMixin.generate, model)
    try:
        yield model
    finally:
        del model.generate


@contextlib.contextmanager
def _config_kept(model: torch.nn.Module):
    """The model's generation config put back after the block: an override may update it with generate's keyword
    arguments (Pop2Piano's ``generation_config.update(**kwargs)``), which would outlive the export's own calls."""
    original = getattr(model, "generation_config", None)
    saved = copy.deepcopy(original)
    try:
        yield
    finally:
        if original is not None:  # in place: torch.export puts a module attribute it saw reassigned back as it was
            vars(original).clear()
            vars(original).update(vars(saved))
            if model.generation_config is not original:
                model.generation_config = original


def _intercepted(model: torch.nn.Module, child: str, around):
    return generic_wrapped(model, around) if child == GENERIC else forward_wrapped(getattr(model, child), around, "generate")


def own_arguments(model: torch.nn.Module, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The plain arguments (``PLAIN``) the model's generate runs with: those the caller gives in ``inputs``, and
    the defaults of its own parameters it does not (Pop2Piano's ``composer="composer1"``)."""
    params = inspect.signature(type(model).generate).parameters
    defaults = {k: p.default for k, p in params.items() if isinstance(p.default, PLAIN)
                and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)}
    return {**defaults, **{k: v for k, v in inputs.items() if isinstance(v, PLAIN) and k not in LOOP_ARGS}}


def find_delegate(model: torch.nn.Module, inputs: Mapping[str, Any]) -> Delegate | None:
    """The sub-model ``model.generate`` hands its work to, or None (it runs its own forward, as most do). Only a
    model whose class overrides ``generate`` is run; the sub-model is a child that can generate, or the model's
    own generic loop (``GENERIC``)."""
    if _generic(model):
        return None
    children = _generating_children(model)
    handed: list[tuple[str, dict[str, Any], Any]] = []
    forwards: list[bool] = []  # per forward call: whether it ran outside a handed-on generate
    inside = [0]

    def recorded(name):
        def around(generate, args, kwargs):
            if args and name != GENERIC:
                raise GenerationError(f"{type(model).__name__}.generate calls {name}.generate with positional "
                                      "arguments; generation export takes keyword calls")
            named = _by_name(generate, args, kwargs, f"{type(model).__name__}'s {callee(name)}")
            if name == GENERIC and named.get("generation_config") is model.generation_config:
                named.pop("generation_config")  # its own config: what the inner loop reads by default
            inside[0] += 1
            try:
                out = generate(**named)
            finally:
                inside[0] -= 1
            handed.append((name, named, out))
            return out
        return around

    with contextlib.ExitStack() as stack:
        stack.enter_context(_config_kept(model))
        stack.enter_context(forward_wrapped(model, lambda forward, args, kwargs: forwards.append(not inside[0])
                                            or forward(*args, **kwargs)))
        for name in [*children, GENERIC]:
            stack.enter_context(_intercepted(model, name, recorded(name)))
        stack.enter_context(torch.no_grad())
        # on copies: generate may write its inputs in place (Blip sets input_ids[:, 0] to its bos id)
        own = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        result = model.generate(**own, max_new_tokens=2, do_sample=False)
    arguments = own_arguments(model, inputs)
    if any(name == GENERIC for name, _, _ in handed):
        return _own_handoff(model, handed, result, any(forwards), own, arguments)
    if forwards or not handed:
        return None
    if len(handed) != 1 or result is not handed[0][2]:
        raise GenerationError(f"{type(model).__name__}.generate calls {[n for n, _, _ in handed]}.generate and returns "
                              "something else than one such call's result: generation export takes a generate that hands "
                              "one sub-model's generate its inputs and returns what it returns")
    name, kwargs, _ = handed[0]
    passthrough = {k: n for k, v in kwargs.items() if isinstance(v, torch.Tensor)
                   for n, t in own.items() if t is v}
    return Delegate(name, {k: v for k, v in kwargs.items() if k not in LOOP_ARGS}, passthrough, arguments)


def _main_named(model: torch.nn.Module, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The generic loop's arguments with its main input (``inputs``) under the name the model gives it."""
    named = {k: v for k, v in kwargs.items() if k != "inputs"}
    if isinstance(kwargs.get("inputs"), torch.Tensor):
        named[getattr(model, "main_input_name", "input_ids")] = kwargs["inputs"]
    return named


def _own_handoff(model, handed, result, outside: bool, own: Mapping[str, Any], arguments) -> Delegate | None:
    """A generate override that hands the generic loop tensors it computed (``GENERIC``), or None where its
    ``generate`` is captured as it is: it ran a forward outside the loop, called another generate too, did more
    with the loop's result than return it, or computed nothing it hands on (it only passes the caller's inputs)."""
    if outside or len(handed) != 1 or result is not handed[0][2]:
        return None
    _, kwargs, _ = handed[0]
    if isinstance(kwargs.get("inputs"), torch.Tensor) and getattr(model, "main_input_name", "input_ids") in kwargs:
        return None  # the main input twice: the generic loop would refuse it
    kwargs = {k: v for k, v in _main_named(model, kwargs).items() if k not in LOOP_ARGS}
    passthrough = {k: n for k, v in kwargs.items() if isinstance(v, torch.Tensor)
                   for n, t in own.items() if t is v}
    delegate = Delegate(GENERIC, kwargs, passthrough, arguments)
    return delegate if delegate.computed() else None


class HandoffComponent(torch.nn.Module):
    """``model.generate(**inputs)`` run until it calls ``<child>.generate``; returns the ``outputs`` among the tensors
    that call was given (those it computed; the caller's own inputs it hands on unchanged are passed on as they are)."""

    def __init__(self, model: torch.nn.Module, child: str, outputs: list[str], arguments: Mapping[str, Any] | None = None):
        super().__init__()
        self.model = model
        self.child = child
        self.outputs = list(outputs)
        self.arguments = dict(arguments or {})  # plain arguments the caller gave generate at export, fixed

    def forward(self, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        def stop(generate, args, kwargs):
            raise _HandedOff(_by_name(generate, args, kwargs, callee(self.child)) if args else kwargs)

        # on copies: generate may write its inputs in place (Blip sets input_ids[:, 0] to its bos id)
        own = {k: v.clone() for k, v in inputs.items()}
        try:
            with _intercepted(self.model, self.child, stop), _config_kept(self.model), torch.no_grad():
                self.model.generate(**own, **self.arguments, max_new_tokens=1, do_sample=False)
        except _HandedOff as handoff:
            handed = _main_named(self.model, handoff.kwargs) if self.child == GENERIC else handoff.kwargs
            return {k: handed[k] for k in self.outputs}
        raise GenerationError(f"{type(self.model).__name__}.generate returned without calling {callee(self.child)}")


def export_delegated(exporter, model, inputs: Mapping[str, Any], config, delegate: Delegate, export_inner,
                     quantization) -> DelegatedGenerator:
    """The handoff component over the caller's tensors and ``export_inner(child, handed_inputs, quantization)``,
    the sub-model's generation export."""
    name = type(model).__name__
    odd = [k for k in delegate.constants() if k not in LOOP_CONSTANTS]
    if odd:
        raise GenerationError(f"{name}.generate hands {callee(delegate.child)} {odd}, which the exported loop does not "
                              f"take (it takes {list(LOOP_CONSTANTS)} beside the tensors)")
    if quantization and HANDOFF in quantization:
        raise GenerationError(f"quantization names {HANDOFF!r}: {name}'s handoff component (its generate up to "
                              f"{callee(delegate.child)}) takes no recipe; name the sub-model's components")
    given = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    handoff_module = HandoffComponent(model, delegate.child, delegate.computed(), delegate.arguments).eval()
    with torch.no_grad():  # generate is a no_grad function: under grad mode the export would hold a grad-mode switch
        handoff = exporter.export(handoff_module, given, config if config is not None else exporter.config_class())
    handoff.extra_metadata["component"] = HANDOFF
    handoff.extra_metadata["arguments"] = dict(delegate.arguments)  # fixed in the component: generate with no other
    # the sub-model's inputs as find_delegate's run of generate handed them on
    inner_inputs = {**delegate.tensors(), **{k: given[src] for k, src in delegate.passthrough.items()},
                    **delegate.constants()}
    if delegate.child == GENERIC:  # the model itself, its generic loop: export_for_generation captures that one
        with generic_view(model):
            inner = export_inner(model, inner_inputs, quantization)
    else:
        inner = export_inner(getattr(model, delegate.child), inner_inputs, quantization)
    return DelegatedGenerator(handoff, inner, delegate.child, delegate.passthrough, delegate.constants(), name,
                              delegate.arguments)


class DelegatedGenerator:
    """The handoff component, then the sub-model's generator (``inner``: a ``Generator`` or ``StaticGenerator``)
    over what it returns. Everything but ``generate``, ``components``, ``save`` and ``loop_inputs`` is the inner
    generator's (its rules, cache form, metadata)."""

    def __init__(self, handoff, inner, child: str, passthrough: Mapping[str, str], constants: Mapping[str, Any],
                 model_class: str, arguments: Mapping[str, Any] | None = None):
        self.handoff = handoff
        self.inner = inner
        self.child = child
        self.passthrough = dict(passthrough)
        self.constants = dict(constants)
        self.model_class = model_class
        # the plain arguments the handoff component was exported with (Pop2Piano's composer): fixed in it
        self.arguments = dict(arguments or {})
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
                                  f"{callee(self.child)}: do not pass them")
        fixed = {k: v for k, v in loop.items() if k in self.arguments}
        other = {k: v for k, v in fixed.items() if v != self.arguments[k]}
        if other:
            raise GenerationError(f"{self.model_class}'s {HANDOFF} component was exported with {self.arguments}, fixed in "
                                  f"it; {other} needs an export with them (export_for_generation's inputs)")
        loop = {k: v for k, v in loop.items() if k not in fixed}
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
                            "model_class": self.model_class, "arguments": self.arguments}
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
    return DelegatedGenerator(handoff, inner, spec["child"], spec["passthrough"], spec["constants"], spec["model_class"],
                              spec.get("arguments") or {})
