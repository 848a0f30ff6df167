"""Caches for models that accept only a Cache class of their own: the static step's (exporters/generation/
static.py) and onnxruntime-genai's graph's (genai.py).

MiniMax's forward refuses any cache but a ``MiniMaxCache`` ('MiniMax uses cache of its own and is not
compatible with past_key_values of type ...'), a DynamicCache subclass whose lightning-attention layers keep
their state (``K^T V``, [batch, heads, head_dim, head_dim]) in a list beside the layers
(``get_linear_cache`` / ``set_linear_cache``), and whose full-attention layers grow. The step's cache for it
is the step's own static cache (full-attention layers as static slots; the config's ``linear_attention``
layers as ``LinearAttentionLayer``) that is also a ``MiniMaxCache`` and answers that API from each linear
layer's recurrent state 0: the step then carries the state as it carries any linear-attention state (a
buffer, or an input / output pair on ONNX, one token a call, zero at position 0), and the lightning
attention takes its one-token path from it (from a zero state that is what its prompt path computes for
one token: ``q (k^T v)``, the decays being 1 at the first position). onnxruntime-genai's graph builds a
DynamicCache the same way (its linear layers' state one of the graph's recurrent states), and runs several
tokens from a given state through exporters/workarounds/models/minimax_lightning.py.

Each adapter is chosen by the model's config ``model_type``; a model with none keeps the plain step cache.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def _minimax(base: type) -> type:
    """``base`` (the step's StaticCache class, or DynamicCache for onnxruntime-genai's graph) as a MiniMaxCache."""
    from transformers.cache_utils import Cache
    from transformers.models.minimax.modeling_minimax import MiniMaxCache

    class LinearCacheFromLayers:
        """MiniMaxCache's linear-cache API, answered from each linear layer's recurrent state 0."""

        def get_linear_cache(self, layer_idx: int):
            layer = self.layers[layer_idx]
            states = getattr(layer, "recurrent_states", None)
            if not states or not layer.is_recurrent_states_initialized[0]:
                return None
            return states[0]

        def set_linear_cache(self, layer_idx: int, linear_cache: torch.Tensor) -> None:
            layer = self.layers[layer_idx]
            if not layer.is_recurrent_states_initialized[0]:
                layer.lazy_initialization(recurrent_states=linear_cache)
                layer.has_previous_state[0] = True
            layer.recurrent_states[0] = linear_cache

        def __len__(self) -> int:
            return len(self.layers)

    if issubclass(MiniMaxCache, base):  # DynamicCache: built by its own constructor (layers from the config)

        class DynamicMiniMaxCache(LinearCacheFromLayers, MiniMaxCache):
            def __init__(self, *args, **kwargs):
                base.__init__(self, *args, **kwargs)
                self.linear_cache = []  # MiniMaxCache's own list, unused: the states live in the layers

        return DynamicMiniMaxCache

    class AsMiniMaxCache(MiniMaxCache):
        """Where the static cache's construction reaches MiniMaxCache's (which takes no layers), go on to Cache's."""

        def __init__(self, **kwargs):
            Cache.__init__(self, **kwargs)
            self.linear_cache = []

    class StepMiniMaxCache(LinearCacheFromLayers, base, AsMiniMaxCache):
        """The step's static cache as a MiniMaxCache."""

    return StepMiniMaxCache


ADAPTERS: dict[str, Callable[[type], type]] = {"minimax": _minimax}


def step_cache_for(model: torch.nn.Module, step_cache: type) -> type:
    """The cache class built for ``model``: ``step_cache`` (the step's StaticCache class, or DynamicCache for
    onnxruntime-genai's graph), or its adapter to the model's own class."""
    adapter = ADAPTERS.get(getattr(model.config, "model_type", None))
    return step_cache if adapter is None else adapter(step_cache)


def has_adapter(model: torch.nn.Module) -> bool:
    return getattr(model.config, "model_type", None) in ADAPTERS
