"""The static cache form of a model whose prompt call takes more than token ids: a multimodal model's
image or audio features, which ``generate`` passes to the first forward call only. One step program
cannot take them at the prompt and not after, so the step takes embeddings (``inputs_embeds``) at every
call, and two stateless components make them:

- ``embed``: the model's own forward over the caller's inputs (ids, pixels, audio features, their
  layout inputs), stopped where it calls its decoder: what it hands the decoder, ``inputs_embeds`` (the
  image features already merged at their placeholder tokens) and, where the model computes them itself,
  ``position_ids`` (multimodal rotary positions, ``[3, batch, S]``);
- ``embed_tokens``: the model's input embedding table, for each new token.

This is the split ExecuTorch's multimodal runner loads (an encoder, a token embedding, a text decoder
over embeddings with its cache as buffers). DeepStack features (Qwen3-VL and its kin hand the decoder
``visual_pos_masks`` and one ``[image tokens, hidden]`` tensor per DeepStack layer) become per-token
inputs ``deepstack_<k>`` ``[batch, S, hidden]``: the features at image positions, zeros elsewhere;
``embed_tokens`` gives zeros for a new token, and the step hands them to the decoder in that form, whose
``_deepstack_process`` then adds them to the hidden states (``add_dense``) instead of gathering image positions
by a mask whose count a new token does not have.

Where the model hands its decoder another per-token tensor ``[batch, S, ...]`` that its own forward takes by
the same name (Gemma4's ``per_layer_inputs``, its per-layer token embeddings), the step takes it as
``handed_<name>`` and passes it to the forward: the embed component gives it for the prompt, and
``embed_tokens`` gives it for a new token by running the model's own forward over the token ids alone (a text
call, as generate's decode steps are), up to the decoder. Anything else the model hands its decoder the step
could not be given at the decode steps: the export stops and names it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Mapping
from typing import Any

import torch

from exporters.generation.capture import GenerationError

# what the embed component may hand on besides inputs_embeds: the step takes positions, builds its own mask
EMBED_PASSES = ("inputs_embeds", "position_ids", "attention_mask", "cache_position", "past_key_values", "use_cache",
                "return_dict", "output_attentions", "output_hidden_states")
DEEPSTACK = ("visual_pos_masks", "deepstack_visual_embeds")  # handed on as per-token deepstack_<k> inputs
DEEPSTACK_PREFIX = "deepstack_"
HANDED_PREFIX = "handed_"  # a per-token tensor the model hands its decoder, passed to its forward by name


def deepstack_names(count: int) -> list[str]:
    return [f"{DEEPSTACK_PREFIX}{k}" for k in range(count)]


def per_token_embedding(name: str) -> bool:
    """``inputs_embeds``, the DeepStack inputs and the handed per-token inputs: ``[batch, S, ...]``, a row per token,
    the step's token inputs."""
    return name == "inputs_embeds" or name.startswith((DEEPSTACK_PREFIX, HANDED_PREFIX))


def handed_names(names) -> list[str]:
    """The forward arguments behind the ``handed_<name>`` inputs among ``names``."""
    return [n[len(HANDED_PREFIX):] for n in names if n.startswith(HANDED_PREFIX)]


def dense_deepstack(inputs_embeds: torch.Tensor, mask: torch.Tensor, features: list) -> dict[str, torch.Tensor]:
    """Each DeepStack layer's ``[image tokens, hidden]`` features laid out per token: ``[batch, S, hidden]``, the
    features at the mask's positions in its order (as the decoder's ``hidden[mask]`` reads them), zeros elsewhere."""
    where = mask[..., None].expand_as(inputs_embeds)
    return {name: inputs_embeds.new_zeros(inputs_embeds.shape).masked_scatter(where, f.to(inputs_embeds.dtype))
            for name, f in zip(deepstack_names(len(features)), features)}


def add_dense(hidden_states: torch.Tensor, visual_pos_masks: Any, visual_embeds: torch.Tensor) -> torch.Tensor:
    """A DeepStack layer's features in the per-token form added to the hidden states. At image positions this is
    the float addition the decoder's own ``hidden[mask] = hidden[mask] + features`` makes; elsewhere ``x + 0.0``,
    which is ``x`` (``-0.0`` becomes ``0.0``)."""
    return hidden_states + visual_embeds.to(hidden_states.device, hidden_states.dtype)


@contextlib.contextmanager
def decoder_receives(model: torch.nn.Module, path: str, dense: list[torch.Tensor]):
    """Within the block, the decoder at ``path`` is handed the per-token DeepStack features ``dense`` (its model's
    forward hands it none after the prompt) and adds them with ``add_dense``: instance attributes over its
    ``forward`` and ``_deepstack_process``, removed after."""
    decoder = model.get_submodule(path)
    if not callable(getattr(decoder, "_deepstack_process", None)):
        raise GenerationError(f"{type(model).__name__}'s decoder {type(decoder).__name__} takes DeepStack features but "
                              "has no _deepstack_process to add them per token")
    own = vars(decoder).get("forward")
    original = decoder.forward

    def receiving(*args, **kwargs):
        return original(*args, **{**kwargs, "visual_pos_masks": None, "deepstack_visual_embeds": dense})

    decoder.forward, decoder._deepstack_process = receiving, add_dense
    try:
        yield
    finally:
        del decoder._deepstack_process
        if own is not None:
            decoder.forward = own
        else:
            del decoder.forward


def decoder_path(model: torch.nn.Module) -> str:
    """The qualified name of the decoder a multimodal model hands its embeddings to (``get_decoder()``)."""
    get = getattr(model, "get_decoder", None)
    decoder = get() if callable(get) else None
    if decoder is None or decoder is model:
        raise GenerationError(f"{type(model).__name__} names no decoder (get_decoder()) to hand embeddings to: the "
                              "static form of a model whose prompt takes more than token ids needs one")
    for name, module in model.named_modules():
        if module is decoder:
            return name
    raise GenerationError(f"{type(model).__name__}.get_decoder() is not a submodule of the model")


@functools.cache
def _stand_in_class():
    """The decoder's output type as the rest of the forward reads it: the embeddings as hidden states, None
    for any other field it asks for (a MoE decoder's router_logits). Made once (transformers imported lazily)."""
    from transformers.modeling_outputs import BaseModelOutputWithPast

    class StandIn(BaseModelOutputWithPast):
        def __getattr__(self, name: str):
            if name.startswith("__"):
                raise AttributeError(name)
            return None

    return StandIn


class PrefillEmbeds(torch.nn.Module):
    """``model(**inputs)`` up to its decoder call: returns what the decoder would have been given
    (``inputs_embeds``, ``position_ids`` where the model passes them). The decoder is swapped, for the
    call, for a stand-in returning the embeddings as its hidden states; the rest of the model's forward
    (the head over them) is dead code the export drops."""

    def __init__(self, model: torch.nn.Module, path: str, hands_on: tuple[str, ...] = ()):
        super().__init__()
        self.model = model
        self.path = path
        self.hands_on = tuple(hands_on)  # per-token decoder kwargs also returned, as handed_<name>
        self.handed: dict[str, Any] = {}  # the last call's decoder kwargs (names and values), for the checks

    def forward(self, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        decoder = self.model.get_submodule(self.path)
        seen: dict[str, Any] = {}

        def stand_in(*args, **kwargs):
            if args:
                raise GenerationError(f"{type(self.model).__name__} calls its decoder with positional arguments; "
                                      "the embed component reads them by name")
            seen.update(kwargs)
            if not isinstance(kwargs.get("inputs_embeds"), torch.Tensor):  # the decoder embeds (and merges) itself
                raise GenerationError(f"{type(self.model).__name__}'s forward hands its decoder "
                                      f"{type(decoder).__name__} no inputs_embeds (it is given "
                                      f"{sorted(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))}): the "
                                      "decoder merges the prompt's other inputs itself, so no step over embeddings "
                                      "can stand in for it")
            return _stand_in_class()(last_hidden_state=kwargs["inputs_embeds"])

        own = vars(decoder).get("forward")  # an instance-level forward someone set: put back as it was
        decoder.forward = stand_in
        try:
            self.model(**inputs, use_cache=False)
        finally:
            if own is not None:
                decoder.forward = own
            else:
                del decoder.forward  # the class's forward again
        self.handed = seen
        if not isinstance(seen.get("inputs_embeds"), torch.Tensor):
            raise GenerationError(f"{type(self.model).__name__}'s forward hands its decoder no inputs_embeds")
        out = {"inputs_embeds": seen["inputs_embeds"]}
        if isinstance(seen.get("position_ids"), torch.Tensor):
            out["position_ids"] = seen["position_ids"]
        for name in self.hands_on:
            out[f"{HANDED_PREFIX}{name}"] = seen[name]
        features = seen.get("deepstack_visual_embeds")
        if isinstance(seen.get("visual_pos_masks"), torch.Tensor) and isinstance(features, (list, tuple)) and features:
            out.update(dense_deepstack(out["inputs_embeds"], seen["visual_pos_masks"], list(features)))
        return out


class TokenEmbeds(torch.nn.Module):
    """The model's input embedding table over ``input_ids``: a new token's ``inputs_embeds``, and zeros for each
    of ``deepstack`` DeepStack inputs (a new token is text: no image features). With ``handed`` (per-token tensors
    the model hands its decoder), the model's own forward over the ids alone, up to its decoder, gives the
    embeddings and those tensors (``handed_<name>``), as it does at generate's decode steps."""

    def __init__(self, model: torch.nn.Module, deepstack: int = 0, handed: tuple[str, ...] = ()):
        super().__init__()
        self.model = model
        self.deepstack = deepstack
        self.handed = tuple(handed)
        self.text_call = PrefillEmbeds(model, decoder_path(model), self.handed) if self.handed else None

    def forward(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.text_call is not None:
            out = {k: v for k, v in self.text_call(input_ids=input_ids).items() if k == "inputs_embeds" or
                   k.startswith(HANDED_PREFIX)}  # the step counts positions itself
        else:
            out = {"inputs_embeds": self.model.get_input_embeddings()(input_ids)}
        return {**out, **{name: torch.zeros_like(out["inputs_embeds"]) for name in deepstack_names(self.deepstack)}}


def prefill_embeds(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor]) -> tuple[PrefillEmbeds, dict[str, torch.Tensor]]:
    """The embed component and its outputs at ``inputs``, checked to hand the decoder nothing the step
    cannot take."""
    module = PrefillEmbeds(model, decoder_path(model)).eval()
    with torch.no_grad():
        out = module(**inputs)
    deepstack = any(k.startswith(DEEPSTACK_PREFIX) for k in out)
    other = sorted(k for k, v in module.handed.items() if k not in EMBED_PASSES and not (deepstack and k in DEEPSTACK)
                   and isinstance(v, torch.Tensor))
    takes = inspect.signature(model.forward).parameters
    per_token = [k for k in other if k in takes and module.handed[k].dim() >= 2
                 and module.handed[k].shape[:2] == out["inputs_embeds"].shape[:2]]
    if per_token:  # handed to the step, which passes them to the forward by name (module docstring)
        module.hands_on = tuple(per_token)  # the exported component returns them; this call's values are the same
        out = {**out, **{f"{HANDED_PREFIX}{k}": module.handed[k] for k in per_token}}
        other = [k for k in other if k not in per_token]
    if other:
        raise GenerationError(f"{type(model).__name__}'s forward hands its decoder {other} beside the embeddings; the "
                              "static step over embeddings takes inputs_embeds and positions only")
    return module, out
