"""The static cache form: one ``step`` component over a fixed-size cache (``max_cache_len`` slots),
updated in place.

The step takes ``input_ids`` ``[batch, S]`` (S from 1 to ``max_cache_len``: the whole prompt at once,
then one token a step), ``cache_position`` ``[S]`` (the cache slots it writes, from 0 on), and, where
the model's own ``generate`` passes them with a static cache, ``position_ids`` ``[batch, S]`` and an
``attention_mask`` ``[batch, max_cache_len]`` over every slot (0 for left padding and for slots not
written yet). The batch and ``max_cache_len`` are fixed at export.

Where the cache lives, by ``state``:
- ``"buffers"`` (dynamo, ExecuTorch): keys and values are buffers of the program, mutated in place; the
  step returns only ``logits``. This is the form ExecuTorch's LLM runner loads.
- ``"inputs"`` (ONNX): keys and values are inputs ``past_<i>_key`` / ``past_<i>_value`` and come back,
  updated, as outputs ``present_<i>_key`` / ``present_<i>_value`` of the same shapes.

The write position comes from ``cache_position``, not from a counter kept in the program, so a caller
(or a runner) that starts again at position 0 reuses the same slots: a stale slot past the current
position is never read (the causal mask stops at the query's position).

Each layer is sized by the model's own first write (per-layer heads and sizes; keys and values of different sizes); a
layer the model's own static-cache generate sizes apart from the text (not written with its tokens: Mllama's
cross-attention layers, the image's keys and values written at the prompt's call only) keeps that layer's length and
shapes (static_layers.py; read off generate by static_calls.py's ``fixed_layers``). A hybrid's linear-attention layers
add their conv and recurrent states (``past_<i>_conv_<j>`` / ``past_<i>_recurrent_<j>``, or buffers): such a step is
``token_by_token``, one token a call through the model's one-token path, its states zeroed at position 0 (a running
state is not masked by position as stale slots are). An indexer that keeps the positions it has seen (Qwen4Exp) has
them in slots too (``past_<i>_positions`` [dims, batch, max_cache_len]). A model that accepts only a Cache class of
its own gets the step's cache as that class (exporters/generation/static_caches.py: MiniMax); one that keeps a state
outside any Cache gets an ``OwnStateStep`` (static_state.py: Rwkv, xLSTM); one that keeps it in module attributes its
forward sets (RecurrentGemma) carries them beside the cache, one token a call (module_state.py). A batch of one
without padding is the runner form (tokens and cache positions only); where the model's generate passes a mask, the
step builds it from the cache position. Where the model's generate feeds its first call only the prompt's last n tokens
(MusicgenForCausalLM's), the step records that prefill rule (``prompt_rule``, ``last_tokens:input_ids:<n>``, read off
generate's calls as the dynamic form reads it) and the loop feeds those tokens at slots 0..n-1 (static_loop.py);
ExecuTorch's LLM runner, which prefills every prompt token, refuses such a step by name.

A reference sliding-window layer (UnlimitedOcr's: the prompt's keys kept whole, the decoded ones in a window) keeps
every slot and the prompt's length (``past_<i>_prefill_length``, or a buffer), which the call from slot 0 sets and the
model's own mask reads (static_layers.py).

Where the prompt's call writes more slots than it has tokens (Git writes its image positions ahead of the text, with no
ids for them: 24 slots for 7 ids in the sweep's tiny config), the step's cache gets those ``extra_slots`` beside its
``max_cache_len`` slots for tokens (counted off generate's static cache, static_calls.py's ``extra_slots``; where a cache
of a slot a token overflows, measured first over the model's default cache, static_calls.py's ``prompt_extra_slots``), and the loop
writes the decode tokens after them (static_loop.py); the mask input still spans the tokens, as generate's 2-D mask
does, which such a model widens over its extra slots itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from exporters.generation.capture import (
    GenerationError,
    encoder_of,
    forward_wrapped,
    retried_under_patches,
    static_cache_asked,
)
from exporters.generation.module_state import StepState
from exporters.generation.static_caches import has_adapter
from exporters.generation.static_calls import (
    CACHE_ARGS,
    STEP_FLAGS,
    STEP_INPUTS,
    Seen,
    extra_slots,
    fixed_inputs,
    fixed_layers,
    per_token_extras,
    prompt_extra_slots,
    prompt_handoff,
)
from exporters.generation.static_embeds import (
    HANDED_PREFIX,
    decoder_path,
    decoder_receives,
    deepstack_names,
    per_token_embedding,
)
from exporters.generation.static_layers import (
    LINEAR_PARTS,
    is_linear,
    is_reference,
    layer_tensors,
    set_layer_tensor,
    static_cache,
)
from exporters.generation.static_prompt import prompt_token_candidates
from exporters.generation.static_state import OwnStateStep, own_state_argument, own_state_step_for
from exporters.generation.static_whole import WholeSequenceStep, read_appended, rereads_sequence, whole_sequence_step_for
from exporters.generation.steps import carried_module_state, last_tokens_count, last_tokens_rule, record_returns
from exporters.utils import exception_headline

STATE_FORMS = ("buffers", "inputs")


class CrossAttention:
    """An encoder-decoder's step: the decoder's own tokens (``decoder_input_ids``) over the static self-attention
    cache, and, at every call, the encoder's outputs (inputs ``encoder_outputs__<i>``, rebuilt as ``layout``) and
    the inputs generate passes unchanged to every decoder call (``same``: step input name -> forward argument,
    the encoder's mask as ``encoder_attention_mask`` -> ``attention_mask``). The cross-attention keys and values
    are computed from the encoder outputs at each call into a fresh cache (``is_updated`` False): the step
    keeps no cross-attention state, so the encoder's outputs are an input, not a buffer. Each call gets a copy of
    them: eager's cross cache is written at generate's first decoder call, from the encoder outputs as they were
    then, so a decoder that changes them in place (MoonshineStreaming: ``encoder_hidden_states +=`` its position
    embeddings) changes the copy, and the program writes nothing back into the outputs the loop hands every call."""

    def __init__(self, layout, count: int, same: Mapping[str, str], example: Mapping[str, torch.Tensor]):
        self.layout, self.count, self.same = layout, count, dict(same)
        self.example = dict(example)  # the step inputs besides tokens: for sizing the cache

    def names(self) -> list[str]:
        return [f"encoder_outputs__{i}" for i in range(self.count)] + list(self.same)

    def model_kwargs(self, token: torch.Tensor, given: Mapping[str, torch.Tensor], cache) -> dict[str, Any]:
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache

        from exporters.generation.capture import unflatten_tree

        leaves = [given[f"encoder_outputs__{i}"].clone() for i in range(self.count)]  # see the class docstring
        return {"decoder_input_ids": token, "encoder_outputs": unflatten_tree(leaves, self.layout),
                **{arg: given[name] for name, arg in self.same.items()},
                "past_key_values": EncoderDecoderCache(cache, DynamicCache())}


class StaticStep(torch.nn.Module):
    """``model`` over a static cache held by this module: see the module docstring."""

    use_cache_asked: str | None = None  # why generate was asked for a cache its config turns off (static_step_for)
    # the slots a call may start writing at, as the loop calls it (most None: max_cache_len - 1): any, but a prompt
    # component's (0 only) and a step's after one (1 on), static_prefill.py; said to torch, so a model's branch on
    # the past length (Kosmos-2's ``past_key_values_length > 0``) is decided where the loop decides it
    past_bounds: tuple[int, int | None] = (0, None)

    def __init__(self, model: torch.nn.Module, batch: int, max_cache_len: int, state: str = "buffers",
                 takes_positions: bool = True, takes_mask: bool = True, reads_mask: bool = False,
                 extras: Mapping[str, str] | None = None, cache_arg: str = "past_key_values", embeds: bool = False,
                 cross: CrossAttention | None = None, module_state: Mapping[str, torch.Tensor] | None = None,
                 sizing: Mapping[str, Any] | None = None, fixed: Mapping[int, tuple] | None = None,
                 patches: Sequence[Any] = (), extra_slots: int = 0):
        """``takes_positions``: the model reads ``position_ids``; ``takes_mask``: it reads an attention
        mask; ``extras``: the other per-token inputs generate passes (``token_type_ids``), each ``[batch, S]``
        like ``input_ids``, by the rule the loop derives its next value with (``per_token_extras``). A step
        of batch 1 without a mask or extras (``runner_form``) takes only ``input_ids`` and
        ``cache_position``, and gives the model ``position_ids = cache_position``: the two inputs, in
        that order, that ExecuTorch's LLM runner passes. ``cache_arg``: the forward argument the cache goes
        in by (``CACHE_ARGS``). ``embeds``: the step takes ``inputs_embeds`` ``[batch, S, hidden]`` instead of
        ``input_ids`` (exporters/generation/static_embeds.py). ``cross``: an encoder-decoder's step
        (``CrossAttention``), one decoder token a call. ``fixed``: the cache layers of a length of their own
        (static_layers.py), read off generate (static_calls.py's ``fixed_layers``). ``patches``: the export's
        patches of the model's code, under which the cache is sized where the model refuses the one-token sizing
        call as it is (static_layers.static_cache). ``extra_slots``: the slots the prompt's call writes beyond its
        tokens (static_calls.py's ``extra_slots``: Git's image positions, written ahead of the text): the cache gets
        them beside its ``max_cache_len`` slots for tokens, and the loop writes the decode tokens after them
        (static_loop.py); ``max_cache_len`` and the mask over it still count tokens, as generate's 2-D mask does (the
        model widens it over its extra slots itself)."""
        super().__init__()
        if state not in STATE_FORMS:
            raise GenerationError(f"state={state!r}: the static step keeps its cache as one of {STATE_FORMS}")
        self.model = model
        self.state = state
        self.max_cache_len = max_cache_len
        self.extra_slots = int(extra_slots)
        self.takes_positions, self.takes_mask = takes_positions, takes_mask
        self.extras = dict(extras or {})
        self.embeds = embeds
        self.deepstack = 0  # over embeddings: how many per-token DeepStack inputs (set from the embed component)
        self.handed: tuple[str, ...] = ()  # over embeddings: the per-token forward arguments taken as handed_<name>
        # over embeddings: the prompt-only [batch, S] inputs the forward takes, which may read them beyond the
        # embeddings (exporters/generation/static_prompt.py decides, and adds those it reads to ``extras``)
        self.prompt_tokens: tuple[str, ...] = ()
        # the prompt's own inputs (pixel_values, ...) handed to the model as given (static_prefill.py's prompt component)
        self.passthrough: tuple[str, ...] = ()
        # the caller's tensors generate passes unchanged to every call (Blip's text decoder: the image's
        # encoder_hidden_states and encoder_attention_mask), inputs of every step call; also in ``passthrough``
        self.same: tuple[str, ...] = ()
        # what the prompt's call takes besides the step's inputs (static_step_for reads it off generate's calls)
        self.prompt_inputs: tuple[str, ...] = ()
        # the prompt's ids as generate's first call takes them, where not as given (``last_tokens:input_ids:<n>``)
        self.prompt_rule: str | None = None
        self.cross = cross
        # (not with extra slots: the runner's cache positions count tokens, and positions are not slots there)
        self.runner_form = batch == 1 and not takes_mask and not self.extras and not embeds and cross is None and \
            not self.extra_slots
        # the model's generate passes a mask, which a runner does not give: the step builds it from the
        # cache position (every slot written so far), as generate's all-ones mask for one unpadded row
        self.inner_mask = self.runner_form and reads_mask
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        self.cache_arg = cache_arg
        self.fixed = dict(fixed or {})
        self._cache = static_cache(model, batch, self.cache_slots, dtype, cache_arg, cross, sizing, self.fixed, patches)
        # the patches the model needs to run over this cache at all, in eager as traced (none for most models): where
        # the sizing call needed them, or generate's calls were read under them (_step_from_calls)
        self.eager_patches = tuple(patches) if getattr(self._cache, "sized_under_patches", False) else ()
        # plain values generate passes every call (baked), the model outputs a prompt component returns, and the
        # step's inputs that are the prompt call's outputs (input -> output: static_calls.py's from_prompt)
        self.constants, self.returns, self.from_prompt, self.sizing = {}, (), {}, sizing
        self.layer_count = len(self._cache.layers)
        # linear-attention states run one token a call: the model's state update is its one-token path
        self.token_by_token = cross is not None or any(is_linear(layer) for layer in self._cache.layers) or bool(module_state)
        if self.token_by_token and any(is_reference(layer) for layer in self._cache.layers):
            # a reference layer's prompt length is the slots the call at position 0 writes (static_layers.py)
            raise GenerationError(f"{type(model).__name__}: a reference sliding-window layer (the prompt's keys kept "
                                  "whole) in a step fed one token a call: the step would take the prompt's first "
                                  "token for the whole prompt")
        # state the model keeps in module attributes (``module_state``: path -> its value after the prompt's call), a
        # running state as a linear-attention layer's: one token a call, zero at position 0 (module_state.py)
        self.held_state = StepState(model, module_state or {}, state)
        self.held_state.register(self)
        self._parts = [list(layer_tensors(layer)) for layer in self._cache.layers]
        for i, layer in enumerate(self._cache.layers):
            if state == "buffers":
                for part, tensor in layer_tensors(layer).items():
                    self.register_buffer(f"cache_{i}_{part}", tensor)
        # each indexer's position history in slots, [dims, batch, max_cache_len], as floats (the loop's zeros are)
        self._histories = {i: (dims, batch, self.cache_slots) for i, dims in self._cache.position_histories.items()}
        if state == "buffers":
            for i, shape in self._histories.items():
                self.register_buffer(f"cache_{i}_positions", torch.zeros(shape))

    @property
    def cache_slots(self) -> int:  # every slot of the cache: ``max_cache_len`` for tokens and the ``extra_slots``
        return self.max_cache_len + self.extra_slots

    def handed_inputs(self) -> list[str]:
        return [f"{HANDED_PREFIX}{name}" for name in self.handed]

    def cache_shapes(self) -> dict[str, tuple[int, ...]]:
        """The cache inputs, ``past_<i>_key`` / ``past_<i>_value``, and their fixed shapes (the outputs are
        named ``present_<i>_key`` / ``present_<i>_value``)."""
        shapes = {f"past_{i}_{part}": tuple(tensor.shape)
                  for i, layer in enumerate(self._cache.layers) for part, tensor in layer_tensors(layer).items()}
        return {**shapes, **{f"past_{i}_positions": shape for i, shape in self._histories.items()}, **self.held_state.shapes()}

    def initial_cache(self) -> dict[str, torch.Tensor]:
        """Zeros for every cache input (the ``"inputs"`` form's first call)."""
        zeros = {f"past_{i}_{part}": torch.zeros_like(tensor)
                 for i, layer in enumerate(self._cache.layers) for part, tensor in layer_tensors(layer).items()}
        return {**zeros, **{f"past_{i}_positions": torch.zeros(shape) for i, shape in self._histories.items()},
                **self.held_state.zeros()}

    def forward(self, input_ids: torch.Tensor | None = None, cache_position: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                **given: torch.Tensor) -> dict[str, torch.Tensor]:
        from transformers.cache_utils import StaticIndexedLayer, StaticLayer

        # a linear-attention state is a running sum, not slots a position masks: the call at position 0
        # starts it from zero (a new sequence over the state the last one left in the program)
        start = cache_position[0]  # where this call writes
        fresh = (start > 0) if self.token_by_token and self.state == "buffers" else None
        dense = [given[name] for name in deepstack_names(self.deepstack)]
        taken = set(self.extras) | {"inputs_embeds", *deepstack_names(self.deepstack), *self.handed_inputs()} | \
            set(self.cross.names() if self.cross is not None else ()) | set(self.passthrough)
        cache = {k: v for k, v in given.items() if k not in taken}
        for i, layer in enumerate(self._cache.layers):
            for part in self._parts[i]:
                if self.state == "inputs":  # updated in place on a copy, returned as the next call's input
                    tensor = cache[f"past_{i}_{part}"].clone()
                else:
                    tensor = getattr(self, f"cache_{i}_{part}")
                    if fresh is not None and part.startswith(LINEAR_PARTS):
                        tensor = tensor * fresh.to(tensor.dtype)
                set_layer_tensor(layer, part, tensor)
            if isinstance(layer, StaticLayer):
                layer.cumulative_length = start.clone()  # the mask's offset; a clone: the layer adds to it in place
            if is_reference(layer):  # the prompt's length, set at the call from slot 0 (static_layers.py)
                layer.start_call(start, cache_position)
            if isinstance(layer, StaticIndexedLayer) and layer.is_indexer_initialized:
                layer.indexer_cumulative_length = start.clone()  # the indexer's own count, added to in place too
        self._cache.traced_past = None
        if torch.compiler.is_exporting():
            past = start.item()
            least, most = self.past_bounds
            torch._check(past >= least)
            torch._check(past <= (self.cache_slots - 1 if most is None else most))
            self._cache.traced_past = past
        histories = {}
        for i in self._histories:  # the positions seen so far, as the model's own history holds them
            held = cache[f"past_{i}_positions"] if self.state == "inputs" else getattr(self, f"cache_{i}_positions")
            histories[i] = held
            seen = self._cache.traced_past if self._cache.traced_past is not None else int(start)
            self._cache.layers[i].indexer_position_ids = held[..., :seen].long()
        kwargs: dict[str, Any] = {"inputs_embeds": given["inputs_embeds"]} if self.embeds else {"input_ids": input_ids}
        kwargs.update({name: given[f"{HANDED_PREFIX}{name}"] for name in self.handed})
        kwargs.update({**{k: given[k] for k in (*self.extras, *self.passthrough)}, **self.constants})
        if self.runner_form and self.takes_positions:
            position_ids = cache_position.unsqueeze(0)
        if self.takes_positions and position_ids is not None:
            kwargs["position_ids"] = position_ids
        if self.takes_mask and attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        elif self.inner_mask:
            slots = torch.arange(self.max_cache_len, device=cache_position.device)
            kwargs["attention_mask"] = (slots <= cache_position[-1]).long().unsqueeze(0)
        with self.held_state.holding(self, given, fresh) as finish:  # module attributes (module_state.py)
            if self.cross is not None:  # the decoder's token, the encoder's outputs, a fresh cross-attention cache
                out = self.model(**self.cross.model_kwargs(input_ids, given, self._cache), cache_position=cache_position,
                                 use_cache=True, return_dict=True)
            elif dense:  # the decoder adds the DeepStack features per token (exporters/generation/static_embeds.py)
                with decoder_receives(self.model, decoder_path(self.model), dense):
                    out = self.model(**kwargs, **{self.cache_arg: self._cache}, use_cache=True, logits_to_keep=1,
                                     return_dict=True)
            else:
                out = self.model(**kwargs, **{self.cache_arg: self._cache}, use_cache=True, logits_to_keep=1, return_dict=True)
            outputs = {"logits": out.logits[:, -1, :], **finish(), **{k: getattr(out, k) for k in self.returns}}
        for i, layer in enumerate(self._cache.layers):
            for part, tensor in layer_tensors(layer).items():
                if self.state == "inputs":
                    outputs[f"present_{i}_{part}"] = tensor
                elif tensor is not getattr(self, f"cache_{i}_{part}"):  # a state the model replaced, not updated
                    getattr(self, f"cache_{i}_{part}").copy_(tensor)
        for i, held in histories.items():  # this call's positions, written at its slots
            seen = self._cache.layers[i].indexer_position_ids
            written = held.index_copy(2, cache_position, seen[..., -cache_position.shape[0]:].to(held.dtype))
            if self.state == "inputs":
                outputs[f"present_{i}_positions"] = written
            else:
                getattr(self, f"cache_{i}_positions").copy_(written)
        return outputs


def static_step_for(model: torch.nn.Module, inputs: Mapping[str, Any], max_cache_len: int, state: str,
                    batch: int | None = None, whole_prompt: bool = False,
                    patches: Sequence[Any] = ()) -> StaticStep | WholeSequenceStep | OwnStateStep:
    """The step for ``model``, its inputs read off the model's own ``generate`` run with a static cache:
    it must be a decoder-only model whose forward calls take token ids, positions, a mask and per-token
    extras (``per_token_extras``) only. A model whose generate re-feeds the whole sequence at every call
    gets a ``WholeSequenceStep`` (exporters/generation/static_whole.py), one that keeps a state of its own instead
    of a transformers Cache an ``OwnStateStep`` (exporters/generation/static_state.py). ``whole_prompt``: the step over
    tokens that follows a prompt component (static_prefill.py), which takes the prompt call's other inputs
    (``prompt_inputs``). ``patches``: the export's patches of the model's code (genai.model_patches), which the
    calls are read under where the model's own static-cache generate fails without them (``_forward_arguments``)."""
    name = type(model).__name__
    if encoder_of(model) is not None:
        raise GenerationError(f"{name} is an encoder-decoder; the static cache form is built for decoder-only "
                              "models (use cache='dynamic')")
    # a generation config that keeps no cache (Mpt's, Evolla's, Blt's): generate is asked for one
    # (capture.static_cache_asked); where that generate, or the step over its calls, fails (Blt's cache path), the
    # step is read off the model's own generate, as it is
    asked = static_cache_asked(model)

    def read(use_cache: bool):
        # no cache, each call over the sequence and a column of one id (XLM's mask token): static_whole.py
        carried: dict[str, torch.Tensor] = {}  # state in module attributes, which the cache step carries (module_state.py)
        seen = Seen()
        calls, appended = read_appended(name, _forward_arguments(model, inputs, carried=carried, use_cache=use_cache, seen=seen,
                                                                 patches=patches),
                                        inputs, lambda token: _forward_arguments(model, inputs, suppress=token, carried=carried,
                                                                                 use_cache=use_cache, seen=seen, patches=patches))
        return _step_from_calls(model, name, calls, appended, carried, inputs, max_cache_len, state, batch, whole_prompt, seen,
                                patches)

    try:
        step = read(bool(asked))
    except GenerationError as refused:
        if not asked:
            raise
        step = read(False)
        asked = f"{asked}; with it, {str(refused)[:300]}: the step was read off the model's own, uncached generate"
    step.use_cache_asked = asked  # the export's metadata says so (exporters/generation/__init__.py)
    return step


def _step_from_calls(model, name, calls, appended, carried, inputs, max_cache_len, state, batch, whole_prompt, seen=None,
                     patches=()):
    """``static_step_for`` from the calls read off generate (``appended``: the column each call appends, if any)."""
    if carried and (appended is not None or rereads_sequence(calls) or own_state_argument(model, calls)):
        raise GenerationError(f"{name} keeps state in module attributes {sorted(carried)[:2]}: only the cache step carries it")
    if appended is not None:
        return whole_sequence_step_for(model, calls, inputs, max_cache_len, batch, appended)
    if rereads_sequence(calls):  # no cache: each call over the whole sequence (exporters/generation/static_whole.py)
        return whole_sequence_step_for(model, calls, inputs, max_cache_len, batch)
    own = own_state_argument(model, calls)
    if own is not None and not has_adapter(model):  # Rwkv's state list, xLSTM's xLSTMCache (static_state.py)
        return own_state_step_for(model, calls, own, max_cache_len, state,
                                  batch if batch is not None else int(inputs["input_ids"].shape[0]))
    cache_arg = next((a for a in CACHE_ARGS if all(a in call for call in calls[1:])), None)
    if cache_arg is None:  # before the inputs: a model that re-reads the whole sequence passes more of them
        raise GenerationError(f"{name}.generate(cache_implementation='static') passes no cache ({' or '.join(CACHE_ARGS)})")
    extras = per_token_extras(calls)
    # what generate passes to the prompt's call only (image or audio features): the step takes embeddings
    prompt_only = sorted(k for k in calls[0] if k not in STEP_INPUTS and k not in STEP_FLAGS and k not in extras
                         and not any(k in call for call in calls[1:]))
    # with those, the features' layout generate passes unchanged to every call (feature_attention_mask,
    # image_num_crops): the embed component reads it with the prompt; the step over embeddings is not given it
    layout = fixed_inputs(calls) if prompt_only else []
    handed, constants, sizing = prompt_handoff(name, calls, seen, extras)  # static_calls.py
    # over tokens, the caller's tensors generate passes unchanged to every call: inputs of every step call
    same = [] if prompt_only else [k for k in fixed_inputs(calls) if k not in extras and k not in handed
                                   and isinstance(inputs.get(k), torch.Tensor) and inputs[k].shape == calls[0][k].shape
                                   and torch.equal(inputs[k], calls[0][k])]
    for call in calls:
        other = sorted(k for k in call if k not in STEP_INPUTS and k not in STEP_FLAGS and k not in extras
                       and k not in prompt_only and k not in layout and k not in handed and k not in constants
                       and k not in same)
        if other:
            raise GenerationError(f"{name}.generate with a static cache passes {other} to forward; the static "
                                  f"step takes only {STEP_INPUTS}, past_key_values and per-token inputs "
                                  "[batch, S] beside input_ids whose next value a step rule gives")
    takes_positions = any("position_ids" in c for c in calls)
    batch = batch if batch is not None else int(inputs["input_ids"].shape[0])
    mask = inputs.get("attention_mask")
    unpadded = mask is None or bool((mask == 1).all())
    # a batch of one without padding needs no mask: the causal mask over the written slots is all
    reads_mask = any("attention_mask" in c for c in calls)
    takes_mask = reads_mask and not (batch == 1 and unpadded)  # as an input
    step = StaticStep(model, batch, max_cache_len, state, takes_positions, takes_mask, reads_mask, extras,
                      cache_arg, embeds=bool(prompt_only) and not whole_prompt, module_state=carried, sizing=sizing,
                      fixed=seen.fixed if seen is not None else None, patches=patches,
                      extra_slots=seen.extra if seen is not None else 0).eval()
    if seen is not None and seen.patched:  # generate's calls were read under the patches: eager runs need them
        step.eager_patches = tuple(patches)
    step.constants, step.from_prompt = constants, handed
    step.same = step.passthrough = tuple(same)
    step.runner_form = step.runner_form and not same
    step.prompt_inputs = tuple(prompt_only + layout)  # what a prompt component takes besides the step's inputs
    step.prompt_tokens = () if whole_prompt else tuple(prompt_token_candidates(model, calls[0], prompt_only))
    step.prompt_rule = _prompt_rule(name, step, calls[0], inputs)
    return step


def _prompt_rule(name: str, step: StaticStep, first: Mapping[str, Any], inputs: Mapping[str, Any]) -> str | None:
    """The prefill rule of the prompt's ids where generate's first call takes only the prompt's last n tokens
    (``last_tokens:input_ids:<n>``, exporters/generation/steps.py, as the dynamic form reads it: MusicgenForCausalLM's
    prepare_inputs_for_generation keeps the last token whenever it is given a cache, and generate gives the first
    call an empty one); None where it takes the prompt's ids as given (or takes embeddings). The loop then feeds those
    n tokens at slots 0..n-1 (static_loop.py); what else the first call took is checked to be what the loop feeds
    beside them, and refused by name where it is not: the ``attention_mask`` the caller's, over the prompt (slot j
    gets the prompt's mask at j, as eager's mask reaches its cache), ``position_ids`` the last n of the prompt's own
    (or, in the runner form, the slots), each per-token extra its last n columns, any ``cache_position`` the slots."""
    ids, given = first.get("input_ids"), inputs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or not isinstance(given, torch.Tensor) or \
            (ids.shape == given.shape and torch.equal(ids, given)):
        return None
    rule = last_tokens_rule("input_ids", ids, {"input_ids": given})
    if rule is None:
        return None
    n, prompt = last_tokens_count(rule), int(given.shape[1])
    mask = inputs.get("attention_mask")
    mask = mask if isinstance(mask, torch.Tensor) else torch.ones_like(given)
    expected: dict[str, torch.Tensor] = {k: inputs[k][:, prompt - n:] for k in step.extras  # (a missing one is
                                         if isinstance(inputs.get(k), torch.Tensor)}  # refused by name after)
    if step.takes_mask:
        expected["attention_mask"] = mask
    if "position_ids" in first:
        expected["position_ids"] = torch.arange(n).unsqueeze(0) if step.runner_form else \
            (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)[:, prompt - n:]
    if "cache_position" in first:
        expected["cache_position"] = torch.arange(n)
    off = sorted(k for k, v in expected.items()
                 if not (isinstance(first.get(k), torch.Tensor) and first[k].shape == v.shape
                         and torch.equal(first[k].to(v.dtype), v)))
    if off:
        raise GenerationError(f"{name}.generate's first call takes the prompt's last {n} of {prompt} tokens ({rule}) "
                              f"with {off} other than the static loop would feed beside them (the caller's mask over "
                              "the prompt, the last positions, the slots 0..n-1); the static form does not derive them")
    return rule


def _forward_arguments(model: torch.nn.Module, inputs: Mapping[str, Any], suppress: int | None = None,
                       carried: dict[str, torch.Tensor] | None = None, use_cache: bool = False,
                       seen: Seen | None = None, patches: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """The arguments (not None) of each forward call ``generate`` makes with a static cache, by name: the
    value where it is a tensor, else True. The step builds its own cache and mask, so what generate
    passes there (a per-layer-type mask dict, say) is not traced. ``suppress``: an id generate may not choose;
    ``use_cache``: generate is called with ``use_cache=True`` (capture.static_cache_asked). ``patches``: the
    export's patches of the model's code (genai.model_patches); where generate fails over both static caches as
    the model is, it is run again under them, as the step is traced (Kosmos-2's text model builds its mask over
    the positions written, not over a static cache's keys, unpatched: exporters/workarounds/models/kosmos2.py).
    A model whose generate runs as it is gets its calls read without them, as before."""
    name = type(model).__name__
    calls: list[dict[str, Any]] = []

    def names(forward, args, kwargs):
        # an argument with nothing in it (mm_encoder_outputs={} for a text-only prompt: no modality encoded) is
        # one the forward reads as absent
        call = {k: (v.detach().clone() if isinstance(v, torch.Tensor) else True) for k, v in kwargs.items()
                if v is not None and not (isinstance(v, (dict, list, tuple)) and len(v) == 0)}
        calls.append({**call, **({"<positional>": True} if args else {})})
        seen.note(kwargs)
        return forward(*args, **kwargs)

    returned: list = []
    seen = seen if seen is not None else Seen()

    def run(**cache: Any) -> None:
        calls.clear()
        returned.clear()
        seen.plain.clear()
        seen.cache = None
        with record_returns(model, returned), forward_wrapped(model, names), torch.no_grad():
            model.generate(**inputs, max_new_tokens=3, min_new_tokens=3, do_sample=False, **cache, **settings)
        seen.extra = extra_slots(seen.cache, calls)  # the slots written beyond the tokens fed (Git's image positions)
        seen.fixed, seen.cache = fixed_layers(seen.cache, calls, seen.extra), None  # its layers not of the text's length

    config = getattr(model, "generation_config", None)
    settings = {} if suppress is None else {"suppress_tokens": [*(getattr(config, "suppress_tokens", None) or []), suppress]}
    if use_cache:
        settings["use_cache"] = True

    def both_caches() -> None:
        """generate over transformers' static cache, else over the step's own, else over the step's own sized for the
        slots the prompt's call writes beyond its ids: see the comments below."""
        try:
            run(cache_implementation="static")
            return
        except Exception as exc:  # noqa: BLE001 - the model's own generate refuses a static cache
            first = exc
        failed = f"{name}.generate(cache_implementation='static') fails: {exception_headline(first)}"
        # transformers' static cache keeps a sliding layer as a rolling window, which some models' masks do not
        # fit (Inkling: its relative-position bias spans the window, generate's mask every slot); the step's own
        # cache keeps every slot in every layer, so generate is given that one to read the calls off
        ids = inputs.get("input_ids")
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
            raise GenerationError(failed) from first
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        batch, prompt = int(ids.shape[0]), int(ids.shape[1])
        try:
            run(past_key_values=static_cache(model, batch, prompt + 3, dtype))
            return
        except Exception as again:  # noqa: BLE001 - the step's own cache fails too: the first failure says why
            failed = f"{failed}; over the step's own static cache too ({exception_headline(again)})"
        # a cache of a slot a token overflows where the prompt's call writes more (Git's image positions): the
        # slots it writes, measured over the model's default cache, and the step's own cache sized for them
        extra = prompt_extra_slots(model, inputs, settings)
        if not extra:
            raise GenerationError(failed) from first
        try:
            run(past_key_values=static_cache(model, batch, prompt + extra + 3, dtype))
        except Exception as third:  # noqa: BLE001 - sized for the extra slots, it still fails: say so
            raise GenerationError(f"{failed}; over the step's own static cache with the {extra} slots its prompt's "
                                  f"call writes beyond its {prompt} ids too ({exception_headline(third)})") from first

    # where it fails as the model is, the model as the step is traced: under the export's patches of its code
    _, seen.patched = retried_under_patches(both_caches, patches)  # patched: the step runs eager under them too
    if not calls:
        raise GenerationError(f"{name}.generate never called forward")
    seen.outputs = [r.outputs for r in returned]
    ids = inputs.get("input_ids")
    if isinstance(ids, torch.Tensor):  # state in module attributes: carried by a step that takes it (``carried``, filled
        # with each path and its value after the prompt's call), else it would be baked into the step: refused
        kept = carried_module_state(returned, int(ids.shape[0]), name, carry=carried is not None)
        if kept:
            carried.update({k: returned[0].attributes[k] for k in kept})
    return calls


def step_example(step: StaticStep, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 extras: Mapping[str, torch.Tensor] | None = None,
                 embedded: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The step's inputs for a prompt: every slot of the mask, positions as generate counts them, the
    per-token extras as given; for a step over embeddings, the embed component's outputs (``embedded``:
    ``inputs_embeds``, and ``position_ids`` where the model computes them) instead of the ids."""
    extras = {k: (extras or {})[k] for k in step.extras}
    embedded = dict(embedded or {})
    if step.token_by_token:  # one token a call: the first token stands for every call
        input_ids = input_ids[:, :1]
        attention_mask = None if attention_mask is None else attention_mask[:, :1]
        extras = {k: v[:, :1] for k, v in extras.items()}
        embedded = {k: v[:, :1] if per_token_embedding(k) else v[..., :1] for k, v in embedded.items()}
    batch, prompt = input_ids.shape
    tokens = {"input_ids": input_ids}
    if step.embeds:
        tokens = {k: embedded[k] for k in ("inputs_embeds", *deepstack_names(step.deepstack), *step.handed_inputs())}
    example = {**tokens, "cache_position": torch.arange(prompt), **extras}
    mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
    if step.takes_positions and "position_ids" in embedded:
        example["position_ids"] = embedded["position_ids"]
    elif step.takes_positions and not step.runner_form:
        example["position_ids"] = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)
    if step.takes_mask:
        full = torch.zeros(batch, step.max_cache_len, dtype=torch.long)
        full[:, :prompt] = mask
        example["attention_mask"] = full
    if step.state == "inputs":
        example.update(step.initial_cache())
    return example


def step_dynamic_shapes(step: StaticStep, example: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The sequence length S (1 to max_cache_len) is the one dynamic dim; batch and cache are fixed. A
    step of linear-attention states takes one token a call: every dim is fixed."""
    if step.token_by_token:
        return {name: None for name in example}
    seq = torch.export.Dim("S", min=1, max=step.max_cache_len)
    shapes: dict[str, Any] = {}
    for name in example:
        if name == "input_ids" or per_token_embedding(name) or name in step.extras:
            shapes[name] = {1: seq}
        elif name == "position_ids":  # [batch, S], or [3, batch, S] (multimodal rotary positions)
            shapes[name] = {example[name].dim() - 1: seq}
        elif name == "cache_position":
            shapes[name] = {0: seq}
        else:
            shapes[name] = None
    return shapes
