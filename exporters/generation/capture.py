"""Capture the forward calls a model's own ``generate`` makes: what each generation component is
exported from (the prefill call, the decode steps), with the cache flattened as it was at the call."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from exporters.generation.sliding_forms import plain_sliding_layers
from exporters.pytrees import leaf_names_and_values, register_pytree_nodes
from exporters.utils import apply_patches


class GenerationError(ValueError):
    """A model or a call that generation export cannot handle; the message names what and why."""


def retried_under_patches(run: Callable[[], Any], patches: Sequence[Any],
                          refused: type[GenerationError] = GenerationError) -> tuple[Any, bool]:
    """``(run(), False)``; where ``run()`` raises ``refused`` and the export has ``patches`` of the model's code
    (genai.model_patches), ``(run(), True)`` with ``run()`` again under them, as the step is traced. Without patches
    the refusal stands; refused both ways, a GenerationError names both, its cause the model's own error. For a
    model whose own static-cache generate (static.py's ``_forward_arguments``) or one-token sizing call
    (static_layers.py's ``static_cache``) fails unpatched: Kosmos-2, ProphetNet."""
    try:
        return run(), False
    except refused as first:
        if not patches:
            raise
        with apply_patches(patches):
            try:
                return run(), True
            except refused as again:
                raise GenerationError(f"{first}; under the export's model patches too ({str(again)[:300]})") \
                    from (again.__cause__ or again)


@dataclasses.dataclass
class Call:
    """One forward call: tensor kwargs, tree kwargs (a cache, encoder outputs) as flat leaves with their
    spec, and the plain constants (flags)."""

    tensors: dict[str, torch.Tensor]
    trees: dict[str, tuple[list[torch.Tensor], Any]]  # name -> (leaves, treespec), leaves cloned at the call
    constants: dict[str, Any]
    # the trees among the call's outputs (the cache it returns), flattened and cloned when it returned:
    # generate updates one cache object in place, so a later look would see a later step
    output_trees: dict[str, tuple[list[torch.Tensor], Any]] = dataclasses.field(default_factory=dict)
    # the names of the tensor leaves of what it returned, in flattening order, as an artifact names its
    # outputs (an artifact may list them in another order: a ModelOutput's fields, not its set keys)
    output_names: list[str] = dataclasses.field(default_factory=list)
    # a call of generate's encoder hook (_recorded_preparation): its main input's name and the generation config
    preparation: tuple[str, Any] | None = None

    def query_length(self) -> int | None:
        ids = self.tensors.get("input_ids", self.tensors.get("decoder_input_ids"))
        return None if ids is None else ids.shape[-1]


CONSTANT_LEAVES = (bool, int, float, str)  # plain values a tree may hold beside its tensors


@dataclasses.dataclass(frozen=True)
class TreeLayout:
    """A tree's pytree spec and where its ``None`` leaves sit (an encoder output with an absent field in a
    list), and its plain constant leaves with their values (the decoder layer each of Granite4Vision's
    deepstack features goes to): the tensors are the component's inputs, the Nones and constants are
    rebuilt as they were (a constant is part of the layout: two calls that differ in one differ in
    layout)."""

    spec: Any
    nones: tuple[int, ...] = ()
    constants: tuple[tuple[int, Any], ...] = ()  # (leaf index, value)

    def __str__(self) -> str:
        return (f"{self.spec}" + (f" (None at leaves {list(self.nones)})" if self.nones else "")
                + (f" (constants {dict(self.constants)})" if self.constants else ""))


def flatten_tree(name: str, value: Any) -> tuple[list[torch.Tensor], TreeLayout]:
    """The tensor leaves of ``value`` and its layout; a leaf other than a tensor, None or a plain constant
    (``CONSTANT_LEAVES``) is refused."""
    register_pytree_nodes(value)
    leaves, spec = pytree.tree_flatten(value)
    odd = sorted({type(v).__name__ for v in leaves
                  if v is not None and not isinstance(v, (torch.Tensor, *CONSTANT_LEAVES))})
    if odd:
        raise GenerationError(f"generate passes {name!r} ({type(value).__name__}) holding non-tensor leaves "
                              f"{odd}: it cannot be an input of an exported component")
    nones = tuple(i for i, v in enumerate(leaves) if v is None)
    constants = tuple((i, v) for i, v in enumerate(leaves) if isinstance(v, CONSTANT_LEAVES))
    return [v for v in leaves if isinstance(v, torch.Tensor)], TreeLayout(spec, nones, constants)


def unflatten_tree(tensors: list[torch.Tensor], layout: TreeLayout) -> Any:
    it = iter(tensors)
    nones = set(layout.nones)
    constants = dict(layout.constants)
    count = len(tensors) + len(nones) + len(constants)
    leaves = [None if i in nones else constants[i] if i in constants else next(it) for i in range(count)]
    return pytree.tree_unflatten(leaves, layout.spec)


def _split(kwargs: Mapping[str, Any]) -> Call:
    tensors, trees, constants = {}, {}, {}
    for name, value in kwargs.items():
        if value is None:
            continue
        if isinstance(value, torch.Tensor):
            tensors[name] = value.detach().clone()
        elif isinstance(value, (bool, int, float, str)):
            constants[name] = value
        else:
            leaves, layout = flatten_tree(name, value)
            trees[name] = ([v.detach().clone() for v in leaves], layout)
    return Call(tensors, trees, constants)


def _trees_of(outputs: Any) -> dict[str, tuple[list[torch.Tensor], Any]]:
    items = outputs.items() if isinstance(outputs, Mapping) else vars(outputs).items() if hasattr(outputs, "__dict__") else ()
    trees = {}
    for name, value in items:
        if value is None or isinstance(value, (torch.Tensor, bool, int, float, str)):
            continue
        try:
            leaves, layout = flatten_tree(name, value)
        except GenerationError:
            continue  # an output that holds other things is not state a later call takes
        if leaves:
            trees[name] = ([v.detach().clone() for v in leaves], layout)
    return trees


def _whole(outputs: Any) -> dict[str, tuple[list[torch.Tensor], Any]]:
    """All of an encoder's outputs as one tree (keyed ""): they become the decoder's encoder_outputs."""
    register_pytree_nodes(outputs)
    leaves, spec = pytree.tree_flatten(outputs)
    return {"": ([v.detach().clone() for v in leaves if isinstance(v, torch.Tensor)], spec)}


@contextlib.contextmanager
def forward_wrapped(module: torch.nn.Module, around, method: str = "forward"):
    """Within the block, ``module.forward(*args, **kwargs)`` (or ``module.<method>``) is
    ``around(forward, args, kwargs)``, the original's signature kept (generate reads it: whether it
    takes position_ids, which inputs an encoder takes, ...)."""
    original = module.__dict__.get(method)
    bound = original if original is not None else getattr(type(module), method).__get__(module, type(module))

    @functools.wraps(bound)
    def forward(*args, **kwargs):
        return around(bound, args, kwargs)

    setattr(module, method, forward)
    try:
        yield
    finally:
        if original is None:
            delattr(module, method)
        else:
            setattr(module, method, original)


def _recorded(module: torch.nn.Module, calls: list[Call], outputs_of=_trees_of, method: str = "forward"):
    """Within the block, every call of ``module.forward`` (or ``module.<method>``) is appended to
    ``calls``; a cache it is given has its empty sliding-window layers made plain first
    (``sliding_forms.plain_sliding_layers``)."""

    def record(forward, args, kwargs):
        if args:  # by name, as the components are called (generate passes pixel_values to get_image_features first)
            kwargs = _by_name(forward, args, kwargs, f"{type(module).__name__}.{method}")
        plain_sliding_layers(kwargs.get("past_key_values"))
        call = _split(kwargs)
        out = forward(**kwargs)
        call.output_trees = outputs_of(out)
        call.output_names = [n for n, v in leaf_names_and_values(out) if isinstance(v, torch.Tensor)]
        calls.append(call)
        return out

    return forward_wrapped(module, record, method)


def _by_name(fn, args: tuple, kwargs: dict, what: str) -> dict:
    """``fn(*args, **kwargs)``'s arguments, all by name; a GenerationError where a positional one has no name
    (a ``*args`` parameter)."""
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        raise GenerationError(f"generate calls {what} with positional arguments that do not bind to its "
                              f"signature ({exc}); generation export takes keyword calls") from None
    params = inspect.signature(fn).parameters
    named = {}
    for name, value in bound.arguments.items():
        kind = params[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            if value:
                raise GenerationError(f"generate calls {what} with positional arguments its *{name} takes; "
                                      "generation export takes keyword calls only")
        elif kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[name] = value
    return named


MODALITIES = ("image", "video")  # the modalities generate encodes before the first forward, in its order


def modality_encoders(model: torch.nn.Module) -> dict[str, tuple[torch.nn.Module, str]]:
    """``{"image_encoder": (base_model, "get_image_features"), ...}``: the encoders a multimodal model's
    ``generate`` runs before the first forward, one per modality (transformers' generate calls
    ``base_model.get_<modality>_features`` for each modality the model lists in ``input_modalities``,
    when its forward takes ``mm_encoder_outputs``, and passes their outputs as that argument)."""
    supports = getattr(model, "_supports_mm_encoder_outputs", None)
    if supports is None or not supports():
        return {}
    modalities = getattr(model, "input_modalities", ())
    modalities = (modalities,) if isinstance(modalities, str) else tuple(modalities or ())
    base = getattr(model, "base_model", model)
    return {f"{m}_encoder": (base, f"get_{m}_features") for m in MODALITIES
            if m in modalities and callable(getattr(base, f"get_{m}_features", None))}


def encoder_of(model: torch.nn.Module) -> torch.nn.Module | None:
    """The encoder ``generate`` runs before the first forward call of an encoder-decoder, else None."""
    if not getattr(getattr(model, "config", None), "is_encoder_decoder", False) or not hasattr(model, "get_encoder"):
        return None
    return model.get_encoder()


def encoders_of(model: torch.nn.Module) -> dict[str, tuple[torch.nn.Module, str]]:
    """Every encoder ``generate`` runs before the first forward call: ``{"encoder": (encoder, "forward")}``
    for an encoder-decoder, ``modality_encoders`` for a multimodal decoder, else {}."""
    encoder = encoder_of(model)
    return {"encoder": (encoder, "forward")} if encoder is not None else modality_encoders(model)


PREPARE_ENCODER = "_maybe_prepare_encoder_kwargs_for_generation"  # generate's hook that runs the encoder
PREPARED = "encoder_preparation"  # the label its recorded calls go under


def prepares_encoder_inputs(model: torch.nn.Module) -> bool:
    """Whether an encoder-decoder's class overrides generate's encoder hook: it builds the encoder's inputs itself
    (Florence2 merges the image features into the text embeddings and calls its encoder with inputs_embeds)."""
    from transformers import GenerationMixin

    own = getattr(type(model), PREPARE_ENCODER, None)
    return encoder_of(model) is not None and own is not None and own is not getattr(GenerationMixin, PREPARE_ENCODER, None)


def _recorded_preparation(model: torch.nn.Module, calls: list[Call]):
    """Within the block, every call of the model's encoder hook is appended to ``calls``: the caller's tensors it
    takes (its main input by ``model_input_name``, the tensors among ``model_kwargs``), its plain model kwargs as
    constants, and the ``encoder_outputs`` it returns as the call's outputs; ``call.preparation`` keeps the input's
    name and the generation config it was given."""

    def record(prepare, args, kwargs):
        named = _by_name(prepare, args, kwargs, f"{type(model).__name__}.{PREPARE_ENCODER}")
        name, model_kwargs = named.get("model_input_name"), dict(named.get("model_kwargs") or {})
        tensors = {k: v for k, v in model_kwargs.items() if isinstance(v, torch.Tensor)}
        if isinstance(named.get("inputs_tensor"), torch.Tensor) and name:
            tensors[name] = named["inputs_tensor"]
        call = _split({**tensors, **{k: v for k, v in model_kwargs.items() if isinstance(v, (bool, int, float, str))}})
        out = prepare(**named)
        encoded = out.get("encoder_outputs") if isinstance(out, Mapping) else None
        if encoded is not None:
            call.output_trees = _whole(encoded)
            call.output_names = [n for n, v in leaf_names_and_values(encoded) if isinstance(v, torch.Tensor)]
            call.preparation = (name, named.get("generation_config"))
            calls.append(call)
        return out

    return forward_wrapped(model, record, PREPARE_ENCODER)


def static_cache_asked(model: torch.nn.Module) -> str | None:
    """Why the static form's capture runs ``generate`` with ``use_cache=True``, or None where the model's own
    generate keeps a cache. A model whose generation config says ``use_cache=False`` (Pix2Struct's text config
    defaults to it) builds no cache at all under ``cache_implementation='static'`` (transformers'
    ``_prepare_cache_for_generation`` returns first) and re-reads the whole sequence at every call: there is no
    call over a cache to read a static step from. A static cache is what ``cache='static'`` asks for, so the
    capture asks generate for one, as a generate keyword (generate updates a copy of the generation config;
    the model's config and generation config are left as they are). The artifacts are checked against the
    model's default, uncached generate, which computes the same logits."""
    config = getattr(model, "generation_config", None)
    if getattr(config, "use_cache", None) is not False:
        return None
    return (f"{type(model).__name__}.generation_config.use_cache is False: generate(cache_implementation='static') "
            "would keep no cache; the static form's capture ran generate(use_cache=True), leaving the model's "
            "configs unchanged")


def capture_generate(model: torch.nn.Module, inputs: Mapping[str, Any], steps: int, suppress: int | None = None,
                     **generate_kwargs: Any) -> tuple[list[Call], dict[str, list[Call]], torch.Tensor]:
    """``model.generate(**inputs, max_new_tokens=steps, do_sample=False)`` with every call of the model's
    forward recorded (the kwargs as they were when the call began), and of each of its encoders
    (``encoders_of``); returns the forward calls, the encoder calls by encoder and the sequences. ``suppress``:
    an id generate may not choose (besides the config's ``suppress_tokens``), where the calls cannot tell two
    rules apart while it chooses that id (steps.AmbiguousTokenRule). ``generate_kwargs``: more keywords for
    generate (``use_cache=True``: ``static_cache_asked``)."""
    calls: list[Call] = []
    encoders = encoders_of(model)
    encoder_calls: dict[str, list[Call]] = {label: [] for label in encoders}
    with contextlib.ExitStack() as stack:
        stack.enter_context(_recorded(model, calls))
        for label, (owner, method) in encoders.items():
            stack.enter_context(_recorded(owner, encoder_calls[label], _whole, method))
        if prepares_encoder_inputs(model):
            encoder_calls[PREPARED] = []
            stack.enter_context(_recorded_preparation(model, encoder_calls[PREPARED]))
        stack.enter_context(torch.no_grad())
        # the dict form: Whisper's generate returns its decoder prompt with the new tokens only there
        extra = {}
        if suppress is not None:
            config = getattr(model, "generation_config", None)
            extra["suppress_tokens"] = [*(getattr(config, "suppress_tokens", None) or []), suppress]
        out = model.generate(**inputs, max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                             return_dict_in_generate=True, **extra, **generate_kwargs)
    sequences = out.sequences if hasattr(out, "sequences") else out
    if not calls:
        raise GenerationError(f"{type(model).__name__}.generate never called forward")
    return calls, encoder_calls, sequences
