"""An encoder-decoder whose generate builds its encoder's inputs itself, in its override of generate's encoder
hook (``_maybe_prepare_encoder_kwargs_for_generation``): Florence2 embeds the text, scatters the image features
(``get_image_features``) into it and calls its encoder with ``inputs_embeds``, which no caller gives. The encoder
component is then that hook, run over the caller's tensors (``input_ids``, ``attention_mask``, ``pixel_values``)
and returning the ``encoder_outputs`` it hands the decoder: the model's own code, exported like the encoder is."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

from exporters.generation.capture import PREPARE_ENCODER, PREPARED, Call


class PreparedEncoder(torch.nn.Module):
    """``model.<encoder hook>(inputs_tensor, model_kwargs, model_input_name, generation_config)["encoder_outputs"]``
    over keyword tensors (the main input by its name, the rest as model kwargs)."""

    def __init__(self, model: torch.nn.Module, input_name: str, generation_config: Any):
        super().__init__()
        self.model = model
        self.input_name = input_name
        self.generation_config = copy.deepcopy(generation_config)

    def forward(self, **kwargs: Any) -> Any:
        main = kwargs.pop(self.input_name)
        prepared = getattr(self.model, PREPARE_ENCODER)(main, dict(kwargs), self.input_name, self.generation_config)
        return prepared["encoder_outputs"]


def prepared_encoder_call(encoder_calls: Mapping[str, list[Call]], given: Mapping[str, torch.Tensor]) -> Call | None:
    """The one recorded call of the encoder hook, where it takes only what the caller gives; else None."""
    calls = encoder_calls.get(PREPARED) or []
    if len(calls) != 1:
        return None
    (call,) = calls
    return call if all(k in given for k in call.tensors) and not call.trees else None


def encoder_module(model: torch.nn.Module, owner: torch.nn.Module, method: str, call: Call) -> torch.nn.Module:
    """The module an encoder component is exported from: the hook where ``call`` is its (``PreparedEncoder``),
    else the encoder's own method."""
    from exporters.generation.component import component_module

    if call.preparation is not None:
        return PreparedEncoder(model, *call.preparation)
    return component_module(owner, method)
