"""generate_setup: what ``model.generate`` is called with where it differs from the forward (the zoo
override's ``generate`` entry: its own inputs, generation-config settings)."""

from __future__ import annotations

import copy
from typing import Any

import torch

from .build import TinyModel, override_for, place_multimodal_tokens
from .inputs import make_inputs

__all__ = ["generate_setup"]


def _generation_value(model, value: Any) -> Any:
    """An override's generation-config value: a string names a field of the generation config or a dotted
    path of the model's config (token ids are remapped by the shrinking, so they are named, not written)."""
    if not isinstance(value, str):
        return copy.deepcopy(value)
    generation = model.generation_config
    if hasattr(generation, value) and getattr(generation, value) is not None:
        return getattr(generation, value)
    cur = model.config
    for part in value.split("."):
        if not hasattr(cur, part):
            raise KeyError(f"generate override value {value!r} names no field of {type(model).__name__}'s generation "
                           "config or config")
        cur = getattr(cur, part)
    return cur


def generate_setup(tiny: TinyModel, seed: int = 0) -> tuple[dict[str, Any], dict[str, Any]]:
    """What ``model.generate`` is called with where it differs from the forward, from the override's ``generate``
    entry: (inputs, generation-config settings applied). ``generate["inputs"]`` is an input spec (the keys of
    ``inputs``) used in place of the forward's: the inputs are rebuilt from it, its ``tensors`` whether or not the
    forward takes them; without it, the forward's inputs. ``generate["generation_config"]`` sets fields of ``model.generation_config`` (see
    ``_generation_value``); the settings applied are returned."""
    entry = tiny.entry
    spec = override_for(entry)[0].get("generate", {}) if entry is not None else {}
    inputs = tiny.inputs
    if "inputs" in spec:
        from .documented import tensor_from_recipe
        from .inputs import special_token_ids, text_vocab

        inputs = make_inputs(tiny.model, tiny.config, seed=seed, spec=spec["inputs"])
        # generate's own keyword arguments (Kyutai's input_values, read by its prepare_inputs_for_generation): built
        # although the forward does not take them
        gen = torch.Generator().manual_seed(seed + 2)
        for name, recipe in spec["inputs"].get("tensors", {}).items():
            if name not in inputs:
                inputs[name] = tensor_from_recipe(gen, tiny.config, recipe, inputs, text_vocab(tiny.config),
                                                  special_token_ids(tiny.config))
        inputs = place_multimodal_tokens(tiny.model, tiny.config, inputs, seed)
    settings = {}
    for name, value in spec.get("generation_config", {}).items():
        settings[name] = _generation_value(tiny.model, value)
        setattr(tiny.model.generation_config, name, settings[name])
    return inputs, settings
