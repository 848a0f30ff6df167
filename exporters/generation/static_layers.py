"""The static step's cache (static.py): a transformers ``StaticCache`` whose every layer the step can carry, sized by
the model's own first write, and its layers' tensors by part.

Every layer has ``max_cache_len`` slots, but a layer the model's own static-cache ``generate`` sizes apart from the
text's length (``fixed``: layer -> its key and value shapes there, read off generate by static_calls.py's
``fixed_layers``; Mllama's cross-attention layers hold the image's keys and values, one slot a vision position, written
at the prompt's call only) keeps that length. A model's reference sliding-window layer (UnlimitedOcr's) becomes a
full-length one that carries the prompt's length as a part of its own (``_reference_layer_class``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from exporters.generation.capture import GenerationError, retried_under_patches
from exporters.generation.sliding_forms import REFERENCE
from exporters.generation.static_caches import step_cache_for
from exporters.utils import exception_headline

# the cache parts (``layer_tensors``) of a linear-attention state, which a new sequence starts from zero
LINEAR_PARTS = ("conv_", "recurrent_")


def _step_cache_class():
    from transformers.cache_utils import StaticCache

    class StepCache(StaticCache):
        """A StaticCache that says it is not compileable while torch.export traces it.

        ``is_compileable`` is read in one place: masking_utils' ``create_causal_mask`` (and its sliding
        and chunked siblings) computes ``allow_is_causal_skip = ... and not (cache.is_compileable and
        q_length == 1)``. With a dynamic sequence, ``q_length == 1`` puts the guard ``S != 1`` on the
        export, and the step would refuse the one-token call it exists for. Under export the answer
        cannot matter: ``_ignore_causal_mask_sdpa`` returns False whenever torch is exporting, so the
        mask is always built. In eager calls the cache stays compileable (there the test keeps a
        one-token query from dropping the mask over unwritten slots)."""

        # the step's past length as an int while it is traced (StaticStep.forward sets it)
        traced_past = None

        @property
        def is_compileable(self) -> bool:
            return not torch.compiler.is_exporting() and all(layer.is_compileable for layer in self.layers)

        @property
        def is_initialized(self) -> bool:
            """False, as for the lazily sized cache eager generate starts from. Models that build a prefix-LM
            (bidirectional) mask on their first call only tell that call by the cache
            (``is_first_iteration = past_key_values is None or not past_key_values.is_initialized``:
            PaliGemma, HrmText, Molmo2), and the step's cache is always sized, so its prompt call got a
            causal mask. At a later call the prefix's block ids, padded with -1 past the prompt, add
            nothing for the new token. The layers' own ``is_initialized`` is unchanged."""
            return False

        def get_seq_length(self, layer_idx: int = 0):
            """A StaticLayer answers with its 0-d ``cumulative_length`` tensor. Models that build positions
            from it (``torch.arange(past, past + S)``: RoFormer, TrOCR, Mvp) then read the tensor twice, as
            two unbacked ints whose difference has no bound, and ExecuTorch's memory planning refuses the
            ``u1 - u0`` size. While traced the step answers with one int, read once and bounded by the
            cache (``traced_past``), so the size is ``S``."""
            length = super().get_seq_length(layer_idx)
            if self.traced_past is not None and isinstance(length, torch.Tensor):
                return self.traced_past
            return length

    return StepCache


def is_linear(layer) -> bool:
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    return isinstance(layer, LinearAttentionCacheLayerMixin)


def static_cache(model: torch.nn.Module, batch: int, max_cache_len: int, dtype: torch.dtype,
                  cache_arg: str = "past_key_values", cross=None, sizing: Mapping | None = None,
                  fixed: Mapping[int, tuple[tuple[int, ...], tuple[int, ...]]] | None = None,
                  patches: Sequence[Any] = ()):
    """``cross``: an encoder-decoder's ``CrossAttention`` (static.py); ``sizing``: what a later call of generate passes
    beside a token; ``fixed``: the layers of a length of their own (the module docstring). ``patches``: the export's
    patches of the model's code (genai.model_patches); where the one-token sizing call fails as the model is, the
    cache is built again under them, as the step is traced (ProphetNet's decoder sizes its masks to the tokens fed,
    not to a static cache's slots, unpatched: exporters/workarounds/models/prophetnet.py). A model that takes the
    call as it is gets its cache sized without them."""
    try:
        cache, patched = retried_under_patches(
            lambda: _static_cache(model, batch, max_cache_len, dtype, cache_arg, cross, sizing, fixed), patches,
            refused=_SizingFailed)
    except _SizingFailed as refused:  # no patches to retry under: the plain error
        raise GenerationError(str(refused)) from refused.__cause__
    cache.sized_under_patches = patched  # the step runs the model under them in eager too (StaticStep)
    return cache


class _SizingFailed(GenerationError):
    """The model refused the one-token sizing call over its static cache (static_cache retries it under patches)."""


def _static_cache(model: torch.nn.Module, batch: int, max_cache_len: int, dtype: torch.dtype,
                  cache_arg: str = "past_key_values", cross=None, sizing: Mapping | None = None,
                  fixed: Mapping[int, tuple[tuple[int, ...], tuple[int, ...]]] | None = None):
    from transformers.cache_utils import (
        DummyLayer,
        LinearAttentionAndStaticFullAttentionLayer,
        LinearAttentionAndStaticSlidingWindowAttentionLayer,
        LinearAttentionLayer,
        StaticIndexedLayer,
        StaticLayer,
        StaticSlidingWindowLayer,
    )

    fixed = fixed or {}
    config = model.config.get_text_config(decoder=True) if cross is not None else model.config
    cache = step_cache_for(model, _step_cache_class())(config=config, max_cache_len=max_cache_len)
    for i, layer in enumerate(cache.layers):
        if reference_layer(layer):  # UnlimitedOcr's: the prompt kept whole, the decoded tokens in a window
            cache.layers[i] = _reference_layer_class()(max_cache_len=max_cache_len)
        elif type(layer) is StaticSlidingWindowLayer:
            # a full-length layer: the model's sliding-window mask (from its config's layer types, over
            # positions) still limits attention to the window, so the step computes what eager's rolling
            # window layer computes, keeping max_cache_len slots instead of the window's. The rolling
            # update itself branches on a Python count, which a traced step cannot carry.
            cache.layers[i] = StaticLayer(max_cache_len=max_cache_len)
        elif type(layer) is StaticLayer and i in fixed:  # its own length, as the model's generate sizes it
            cache.layers[i] = StaticLayer(max_cache_len=fixed[i][0][-2])
        elif type(layer) is LinearAttentionAndStaticSlidingWindowAttentionLayer:  # the same, beside its states
            cache.layers[i] = LinearAttentionAndStaticFullAttentionLayer(max_cache_len=max_cache_len,
                                                                         number_of_states=layer.number_of_states)
        elif type(layer) not in (StaticLayer, StaticIndexedLayer, LinearAttentionLayer,
                                 LinearAttentionAndStaticFullAttentionLayer, DummyLayer):
            raise GenerationError(f"{type(model).__name__}: static cache layer {i} is a {type(layer).__name__}; the "
                                  "static step builds key/value (StaticLayer, with an indexer's keys: "
                                  "StaticIndexedLayer), linear-attention state and empty (DummyLayer) layers only")
    # each layer's shapes as the model writes them (per-layer head counts and sizes; keys and values of
    # different sizes under multi-head latent attention; conv and recurrent states): one eager token into
    # the lazily sized cache, then every slot zeroed again
    try:
        with torch.no_grad():
            token = torch.zeros(batch, 1, dtype=torch.long)
            if cross is None:
                model(input_ids=token, cache_position=torch.tensor([0]), **{cache_arg: cache}, use_cache=True,
                      logits_to_keep=1, **(sizing or {}))  # ``sizing``: what a later call of generate passes
            else:
                model(**cross.model_kwargs(token, cross.example, cache), cache_position=torch.tensor([0]), use_cache=True)
    except Exception as exc:  # noqa: BLE001 - the model refuses a one-token call over its static cache
        raise _SizingFailed(f"{type(model).__name__}: one token over a static cache fails ({exception_headline(exc)}), "
                            "so its layers cannot be sized") from exc
    for i, layer in enumerate(cache.layers):
        if isinstance(layer, StaticLayer) and not layer.is_initialized and i in fixed:
            # not written by a text token (Mllama's cross-attention): the heads and sizes generate's cache has
            keys, values = fixed[i]
            StaticLayer.lazy_initialization(layer, torch.zeros(batch, keys[1], 0, keys[-1], dtype=dtype),
                                            torch.zeros(batch, values[1], 0, values[-1], dtype=dtype))
        elif isinstance(layer, StaticLayer) and not layer.is_initialized:
            # not written by a text token, and no size read off generate: the config's sizes
            text = model.config.get_text_config(decoder=True)
            heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
            head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
            empty = torch.zeros(batch, heads, 0, head_dim, dtype=dtype)
            StaticLayer.lazy_initialization(layer, empty, empty)
    # an indexer that keeps the positions it has seen as a growing history (Qwen4Exp: [dims, batch, past] ids on
    # its layer): the step keeps them in slots, as keys (StaticStep.forward)
    cache.position_histories = {i: int(layer.indexer_position_ids.shape[0]) for i, layer in enumerate(cache.layers)
                                if getattr(layer, "indexer_position_ids", None) is not None}
    cache.reset()
    for layer in cache.layers:
        if is_linear(layer):
            # zero state, read as a previous one: the step runs the model's one-token path, which from zero
            # state computes what its prompt path computes for the first token (a convolution over zero
            # padding, the recurrence from a zero state)
            for j in range(layer.number_of_states):
                layer.has_previous_state[j] = bool(layer.is_conv_states_initialized[j]
                                                   or layer.is_recurrent_states_initialized[j])
    return cache


def layer_tensors(layer) -> dict[str, torch.Tensor]:
    """A step cache layer's tensors by part: ``key`` / ``value`` for its attention, ``indexer_key`` for a
    sparse-attention indexer's keys (StaticIndexedLayer, DeepSeek-V3.2 DSA: ``[batch, max_cache_len,
    index_head_dim]``, written at the same positions), ``conv_<j>`` / ``recurrent_<j>`` for its
    linear-attention states, ``prefill_length`` for a reference layer's prompt length (``_reference_layer_class``)."""
    from transformers.cache_utils import StaticIndexedLayer, StaticLayer

    parts = {"key": layer.keys, "value": layer.values} if isinstance(layer, StaticLayer) else {}
    if is_reference(layer):
        parts["prefill_length"] = layer.prefill_length
    if isinstance(layer, StaticIndexedLayer) and layer.is_indexer_initialized:
        parts["indexer_key"] = layer.indexer_keys
    if is_linear(layer):
        for j in range(layer.number_of_states):
            if layer.is_conv_states_initialized[j]:
                parts[f"conv_{j}"] = layer.conv_states[j]
            if layer.is_recurrent_states_initialized[j]:
                parts[f"recurrent_{j}"] = layer.recurrent_states[j]
    return parts


def set_layer_tensor(layer, part: str, tensor: torch.Tensor) -> None:
    if part == "key":
        layer.keys = tensor
    elif part == "value":
        layer.values = tensor
    elif part == "indexer_key":
        layer.indexer_keys = tensor
    elif part == "prefill_length":
        layer.prefill_length = tensor
    else:
        kind, j = part.rsplit("_", 1)
        getattr(layer, f"{kind}_states")[int(j)] = tensor


# what the model's own static reference layer holds (UnlimitedOcrStaticReferenceSlidingWindowLayer); a subclass with
# more state than that is not this form's to replace (the step refuses it by name, as any other layer it cannot build)
_REFERENCE_STATE = {"keys", "values", "is_initialized", "max_cache_len", "cumulative_length", "cumulative_length_int",
                    "sliding_window", "prefill_max_cache_len", "prefill_length", "prefill_cumulative_length",
                    "prefill_keys", "prefill_values", "all_keys", "all_values"}


def reference_layer(layer) -> bool:
    """Whether ``layer`` is a model's static reference sliding-window layer (R-SWA: UnlimitedOcr's), empty, holding
    exactly what that layer holds."""
    from transformers.cache_utils import StaticSlidingWindowLayer

    return isinstance(layer, StaticSlidingWindowLayer) and getattr(layer, "_layer_type", None) == REFERENCE \
        and not layer.is_initialized and set(vars(layer)) <= _REFERENCE_STATE


def is_reference(layer) -> bool:
    """Whether ``layer`` is the step's form of a reference layer (``_reference_layer_class``)."""
    return getattr(type(layer), "step_reference", False)


@functools.cache
def _reference_layer_class() -> type:
    """The step's form of a reference sliding-window layer, made once (transformers is imported only when a step is)."""
    from transformers.cache_utils import StaticLayer

    class StepReferenceLayer(StaticLayer):
        """A reference sliding-window layer (R-SWA: UnlimitedOcr's ``UnlimitedOcrStaticReferenceSlidingWindowLayer``) as
        a full-length one. Eager's keeps the prompt's keys whole and the decoded ones rolling in a window, split at
        ``prefill_length``, a Python int it sets at its first update and reallocates its buffers to, and the model's
        mask (``create_reference_sliding_window_causal_mask``, which finds the layer by its ``_layer_type``) shows a
        query every key before ``prefill_length`` beside its window. This one keeps ``max_cache_len`` slots, one a
        position (``kv_offset`` 0), and ``prefill_length`` as a 0-d tensor the same mask reads: a query at position p
        sees slot j <= p where j < prefill_length or p - j < sliding_window, what eager's layer keeps and shows.

        The length is a cache part (``layer_tensors``), carried from call to call as the keys are, and set by the call
        that starts a sequence (``start_call``: the one at cache_position 0 writes the prompt) before the model builds
        its mask, as generate's ``set_prefill_length`` sets eager's before the prompt's call. A float, as the loop's
        zeros for every cache input are (integers exact to 2**24)."""

        step_reference = True

        def __init__(self, max_cache_len: int, **kwargs):
            super().__init__(max_cache_len=max_cache_len, **kwargs)
            self.prefill_length = torch.zeros(())

        def start_call(self, start: torch.Tensor, cache_position: torch.Tensor) -> None:
            """Before the model's call that writes ``cache_position`` (from ``start``): one from 0 is a new sequence's
            prompt, and its slot count the prompt's length; any later call keeps the length it was given."""
            written = (cache_position[-1] + 1).to(self.prefill_length.dtype)
            self.prefill_length = torch.where(start == 0, written, self.prefill_length)

        def set_prefill_length(self, prefill_length: int) -> None:
            """What generate calls before the prompt's call (UnlimitedOcrGenerationMixin._prefill): eager runs over this
            cache (the step's own, handed to generate) then mask as the step does."""
            self.prefill_length = torch.full((), float(prefill_length))

        def reset(self) -> None:
            super().reset()
            self.prefill_length.zero_()

    # set after the class is made: a class defined with a _layer_type registers itself as the layer every
    # StaticCache(config) builds for that type (CacheLayerMixin.__init_subclass__), the model's own included
    StepReferenceLayer._layer_type = REFERENCE
    return StepReferenceLayer


def fresh_step_cache(model: torch.nn.Module, batch: int, max_cache_len: int, fixed: Mapping[int, tuple] | None = None):
    """A cache of the step's own form (every layer full length but ``fixed``'s, StepCache), empty, for an eager generate."""
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    return static_cache(model, batch, max_cache_len, dtype, fixed=fixed)
