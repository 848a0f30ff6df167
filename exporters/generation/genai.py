"""The folder onnxruntime-genai loads (``onnxruntime_genai.Model(folder)``): one decoder graph that
takes the whole prompt at past length 0 and each new token after it, and ``genai_config.json`` naming
its inputs, outputs and cache layout.

The graph (``GenaiStep``): inputs ``input_ids`` [batch, S], ``attention_mask`` [batch, past + S],
``position_ids`` [batch, S] (where the model reads them), ``past_key_values.<i>.key`` / ``.value``
[batch, kv_heads, past, head_size] (past from 0) for each attention layer i; outputs ``logits``
[batch, S, vocab] and ``present.<i>.key`` / ``.value`` [batch, kv_heads, past + S, head_size]. This is
the growing-cache layout of onnxruntime-genai's decoder-only model (``past_present_share_buffer``
false), named as its model builder names it; its config keys are the ones the builder writes
(model.decoder.inputs / outputs with ``%d`` name templates, head_size, num_key_value_heads, ...).
``type`` is "llama": onnxruntime-genai picks its generic decoder-only model class by that name and
reads nothing else of it.

Layers whose keys and values differ in size (multi-head latent attention) or in head count share the
largest of each in the graph's cache tensors, each layer's own part zero-padded (``GenaiStep``).

Linear-attention layers (Mamba, gated delta rule, short convolutions: transformers'
``LinearAttentionLayer``) carry their states as onnxruntime-genai's recurrent state: inputs
``past_key_values.<i>.conv_state`` [batch, 1, C] and ``.recurrent_state`` [batch, 1, 1, R], outputs
``present.<i>.*``, which it finds by those names, sizes from the graph's static dims and starts at
zero. A layer's conv states (one per ``state_idx``), flattened and concatenated, fill C; its recurrent
states fill R (a layer with none passes R on unchanged); every layer is zero-padded to the largest.
One graph serves the prompt and every step: the layers are given their states as previous ones, and
the sequence is traced from length 2, so transformers' layers take their multi-token path, which
starts from the given state (the convolution over the stored window then the new tokens, the chunked
recurrence from ``initial_state``) and computes one token as well: from zero state at the prompt,
from the last call's at each step. A chunked recurrence loops over its chunks in Python, so the
graph holds as many as the traced bound needs: the context length (``max_dim``) must stay within
what the trace decides (torch refuses it otherwise, naming the chunk-count guard).

A sparse-attention layer's indexer keys (DeepSeek-V3.2 DSA: [batch, past, size], growing as keys do)
travel as one more head of that layer's key tensor.

An indexer that keeps the positions it has seen as a growing history (Qwen4Exp: [dims, batch, past] ids)
has it travel as one more head after the indexer's keys, as floats in its first columns.

A model the config cannot describe is refused by name (GenerationError): a cache with layers of other
kinds (a model's own cache classes), layers whose multi-token path
cannot start from a given state (checked in eager before export), or a forward that needs inputs
besides ids, mask and positions.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from exporters.generation.capture import GenerationError, encoder_of, plain_sliding_layers
from exporters.generation.genai_state import export_genai_own_state, export_genai_whole_sequence, own_state_argument_of
from exporters.generation.runners import fixed_width_tokenizer, vocab_size
from exporters.utils import exception_headline

CONFIG_FILE = "genai_config.json"
GENAI_INPUTS = ("input_ids", "attention_mask", "position_ids")
# the model builder's names; onnxruntime-genai finds each layer's tensors by them
PAST = {"key": "past_key_values.%d.key", "value": "past_key_values.%d.value",
        "conv": "past_key_values.%d.conv_state", "recurrent": "past_key_values.%d.recurrent_state"}
PRESENT = {"key": "present.%d.key", "value": "present.%d.value",
           "conv": "present.%d.conv_state", "recurrent": "present.%d.recurrent_state"}


class NoCacheReturned(GenerationError):
    """The model's forward returns no cache (``_layout``): the graph may carry the sequence itself instead."""


class PlainCacheRefused(GenerationError):
    """The model does not run over the plain DynamicCache the graph rebuilds (``_layout``): the same."""


class GenaiStep(torch.nn.Module):
    """``model`` over a DynamicCache rebuilt from the graph's past inputs; returns logits and presents."""

    def __init__(self, model: torch.nn.Module, shapes: Mapping[int, tuple[tuple[int, int], tuple[int, int]]],
                 takes_positions: bool, states: Mapping[int, list[tuple[str, tuple[int, ...]]]] | None = None,
                 indexers: Mapping[int, int] | None = None, state_dtypes: Mapping[str, torch.dtype] | None = None,
                 histories: Mapping[int, int] | None = None):
        """``shapes``: each attention layer's own ((heads, size) of keys, (heads, size) of values).
        genai_config.json has one num_key_value_heads and one head_size, so where they are not all one
        (multi-head latent attention: keys and values of different sizes; layers of different head
        counts) the graph's cache tensors all have the largest of each: a layer's own part is zero-padded
        on the way out and sliced off on the way in, and the model sees its own cache exactly.
        ``states``: each linear-attention layer's states as (part, shape without batch), part
        ``conv_<j>`` or ``recurrent_<j>``, packed into one conv and one recurrent tensor (module doc).
        ``indexers``: each sparse-attention layer's indexer key size; its keys [batch, past, size] travel as
        one more head of the layer's key tensor (they grow along the sequence as keys do). ``state_dtypes``:
        the dtype of each kind of state, where it is not the model's. ``histories``: each layer whose indexer keeps
        the positions it has seen ([dims, batch, past] ids, Qwen4Exp), with their count of dims: they travel as
        one more head after the indexer's keys, as floats in its first ``dims`` columns (exact below 2^24)."""
        super().__init__()
        self.model, self.shapes, self.takes_positions = model, dict(shapes), takes_positions
        self.cache_arg = cache_argument(model)
        self.states = {i: list(parts) for i, parts in (states or {}).items()}
        self.indexers = dict(indexers or {})
        self.histories = dict(histories or {})
        dims = {d for pair in self.shapes.values() for d in pair}
        dims |= {(self.shapes[i][0][0] + 1, size) for i, size in self.indexers.items()}  # keys + the indexer's
        dims |= {(self._history_head(i) + 1, n) for i, n in self.histories.items()}  # + the position history's
        self.heads, self.size = (max(h for h, _ in dims), max(s for _, s in dims)) if dims else (1, 1)
        self.uniform = len({d for pair in self.shapes.values() for d in pair}) <= 1 and not self.indexers \
            and not self.histories
        sizes = {kind: [sum(_numel(shape) for part, shape in parts if part.startswith(kind))
                        for parts in self.states.values()] for kind in ("conv", "recurrent")}
        self.conv_size, self.recurrent_size = (max(sizes[kind], default=0) or 1 for kind in ("conv", "recurrent"))
        self.dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        self.state_dtypes = {kind: (state_dtypes or {}).get(kind, self.dtype) for kind in ("conv", "recurrent")}

    def _history_head(self, layer: int) -> int:
        return self.shapes[layer][0][0] + (1 if layer in self.indexers else 0)

    def zero_past(self, batch: int, past: int) -> dict[str, torch.Tensor]:
        """The graph's past inputs at ``past`` positions, all zeros (onnxruntime-genai's first call: past 0)."""
        zeros: dict[str, torch.Tensor] = {}
        for i in self.shapes:
            for part in ("key", "value"):
                zeros[PAST[part] % i] = torch.zeros(batch, self.heads, past, self.size, dtype=self.dtype)
        for i in self.states:
            zeros[PAST["conv"] % i] = torch.zeros(batch, 1, self.conv_size, dtype=self.state_dtypes["conv"])
            zeros[PAST["recurrent"] % i] = torch.zeros(batch, 1, 1, self.recurrent_size, dtype=self.state_dtypes["recurrent"])
        return zeros

    def _narrow(self, tensor: torch.Tensor, layer: int, part: int) -> torch.Tensor:
        if self.uniform:
            return tensor
        heads, size = self.shapes[layer][part]
        return tensor[:, :heads, :, :size]

    def _widen(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.uniform:
            return tensor
        return torch.nn.functional.pad(tensor, (0, self.size - tensor.shape[-1], 0, 0, 0, self.heads - tensor.shape[1]))

    def _load_states(self, layer, conv: torch.Tensor, recurrent: torch.Tensor, parts) -> None:
        """Unpack a layer's states from its conv / recurrent inputs, as previous ones (each a copy: the
        layer updates its states in place)."""
        flat = {"conv": conv.reshape(conv.shape[0], -1), "recurrent": recurrent.reshape(recurrent.shape[0], -1)}
        offset = {"conv": 0, "recurrent": 0}
        for part, shape in parts:
            kind, j = part.rsplit("_", 1)
            j, n = int(j), _numel(shape)
            tensor = flat[kind][:, offset[kind]:offset[kind] + n].reshape(-1, *shape).clone()
            offset[kind] += n
            getattr(layer, f"{kind}_states")[j] = tensor
            getattr(layer, f"is_{kind}_states_initialized")[j] = True
            if kind == "conv":
                layer.conv_kernel_size[j] = shape[-1]
            layer.has_previous_state[j] = True
            layer.dtype, layer.device = tensor.dtype, tensor.device

    def _pack_states(self, layer, parts, given: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        packed = []
        for kind, size in (("conv", self.conv_size), ("recurrent", self.recurrent_size)):
            pieces = [getattr(layer, f"{kind}_states")[int(part.rsplit("_", 1)[1])] for part, _ in parts
                      if part.startswith(kind)]
            if not pieces:  # a layer with no state of this kind passes its input on
                packed.append(given[kind].clone())
                continue
            flat = torch.cat([p.reshape(p.shape[0], -1) for p in pieces], dim=1)
            flat = torch.nn.functional.pad(flat, (0, size - flat.shape[1]))
            packed.append(flat[:, None] if kind == "conv" else flat[:, None, None])
        return packed[0], packed[1]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor | None = None,
                **past: torch.Tensor) -> dict[str, torch.Tensor]:
        cache = plain_cache(self.model)
        for i in self.shapes:
            key = past[PAST["key"] % i]
            cache.update(self._narrow(key, i, 0), self._narrow(past[PAST["value"] % i], i, 1), i)
            if i in self.indexers:  # the head after the layer's own keys
                layer, heads = cache.layers[i], self.shapes[i][0][0]
                layer.lazy_initialization_indexer(key[:, heads, :, :self.indexers[i]])
                layer.indexer_keys = key[:, heads, :, :self.indexers[i]]
            if i in self.histories:  # [dims, batch, past], read back as the ids it was written from
                history = key[:, self._history_head(i), :, :self.histories[i]]
                cache.layers[i].indexer_position_ids = history.round().long().permute(2, 0, 1)
        for i, parts in self.states.items():
            self._load_states(cache.layers[i], past[PAST["conv"] % i], past[PAST["recurrent"] % i], parts)
        kwargs = {"position_ids": position_ids} if self.takes_positions else {}
        if not self.shapes:  # no attention layer: the mask only zeroes padded new tokens (Mamba's mixers), its
            attention_mask = attention_mask[:, -input_ids.shape[1]:]  # new tokens' columns, as generate passes it
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, **{self.cache_arg: cache}, use_cache=True,
                         return_dict=True, **kwargs)
        outputs = {"logits": out.logits}
        layers = getattr(out, self.cache_arg).layers
        for i in self.shapes:
            keys = layers[i].keys
            if i in self.indexers:
                size = max(keys.shape[-1], self.indexers[i])
                keys = torch.cat([torch.nn.functional.pad(keys, (0, size - keys.shape[-1])),
                                  torch.nn.functional.pad(layers[i].indexer_keys[:, None], (0, size - self.indexers[i]))],
                                 dim=1)
            if i in self.histories:
                history = layers[i].indexer_position_ids.permute(1, 2, 0).to(keys.dtype)[:, None]
                size = max(keys.shape[-1], self.histories[i])
                keys = torch.cat([torch.nn.functional.pad(keys, (0, size - keys.shape[-1])),
                                  torch.nn.functional.pad(history, (0, size - self.histories[i]))], dim=1)
            outputs[PRESENT["key"] % i], outputs[PRESENT["value"] % i] = self._widen(keys), self._widen(layers[i].values)
        for i, parts in self.states.items():
            outputs[PRESENT["conv"] % i], outputs[PRESENT["recurrent"] % i] = self._pack_states(
                layers[i], parts, {kind: past[PAST[kind] % i] for kind in ("conv", "recurrent")})
        return outputs


def cache_argument(model: torch.nn.Module) -> str:
    """The forward argument (and output field) that carries the model's cache: ``past_key_values``, or
    ``cache_params`` for the Mamba family, whose Cache holds only linear-attention layers."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return "cache_params" if "cache_params" in params and "past_key_values" not in params else "past_key_values"


def _numel(shape) -> int:
    import math

    return math.prod(int(d) for d in shape)


def plain_cache(model: torch.nn.Module):
    """The model's DynamicCache with each sliding-window layer made a plain one
    (``capture.plain_sliding_layers``; beside linear-attention states, a LinearAttentionAndFullAttentionLayer):
    genai_config.json then describes one layout for every attention layer. Other layer kinds stay, and
    are refused by ``_layout`` by name."""
    from transformers.cache_utils import DynamicCache

    from exporters.generation.static_caches import step_cache_for

    cache = step_cache_for(model, DynamicCache)(config=model.config)  # MiniMax's: a MiniMaxCache
    plain_sliding_layers(cache)
    return cache


def _layer_states(layer) -> list[tuple[str, tuple[int, ...]]]:
    """A linear-attention layer's states as (``conv_<j>`` / ``recurrent_<j>``, shape without batch)."""
    parts = []
    for j in range(layer.number_of_states):
        for kind in ("conv", "recurrent"):
            if getattr(layer, f"is_{kind}_states_initialized")[j]:
                parts.append((f"{kind}_{j}", tuple(int(d) for d in getattr(layer, f"{kind}_states")[j].shape[1:])))
    return parts


def _layout(model: torch.nn.Module, inputs: Mapping[str, Any]) -> tuple[dict, bool, dict, dict, dict]:
    """(each attention layer's ((heads, size) of keys, (heads, size) of values), takes_positions, each
    linear-attention layer's states, the dtype of each kind of state, each indexer's key size), read off one
    eager forward with a DynamicCache whose layers must all be key/value (with an indexer's keys or none),
    linear-attention or empty layers."""
    from transformers.cache_utils import (
        DummyLayer,
        DynamicIndexedLayer,
        DynamicLayer,
        LinearAttentionAndFullAttentionLayer,
        LinearAttentionLayer,
    )

    name = type(model).__name__
    if encoder_of(model) is not None:
        raise GenerationError(f"{name} is an encoder-decoder; the onnxruntime-genai folder is built for decoder-only "
                              "models (its config has no key for an encoder's outputs in this layout)")
    ids = inputs.get("input_ids")
    if not isinstance(ids, torch.Tensor):
        raise GenerationError(f"{name}: onnxruntime-genai feeds input_ids; the inputs hold none")
    other = [k for k, v in inputs.items() if isinstance(v, torch.Tensor) and k not in GENAI_INPUTS]
    if other:
        raise GenerationError(f"{name} takes {other}, which onnxruntime-genai's decoder inputs have no key for")
    cache_arg = cache_argument(model)
    try:
        with torch.no_grad():
            out = model(input_ids=ids[:1], use_cache=True, **{cache_arg: plain_cache(model)}, return_dict=True)
    except Exception as exc:  # noqa: BLE001 - the model refuses the plain cache it would be given
        raise PlainCacheRefused(f"{name} does not run with a plain DynamicCache ({exception_headline(exc)}); "
                                "genai_config.json describes that cache only") from exc
    cache = getattr(out, cache_arg, None)
    if cache is None:
        state = sorted(k for k, v in (out.items() if hasattr(out, "items") else []) if k.endswith(("cache", "params")))
        raise NoCacheReturned(f"{name} returns no past_key_values (its state: {state or 'none'}); genai_config.json "
                              "describes a transformers cache only")
    layers = list(getattr(cache, "layers", []))
    known = (DynamicLayer, DynamicIndexedLayer, LinearAttentionLayer, LinearAttentionAndFullAttentionLayer,
             DummyLayer)  # Dummy: no cache
    odd = sorted({type(layer).__name__ for layer in layers if type(layer) not in known})
    if not layers or odd:
        raise GenerationError(f"{name}'s cache holds {odd or 'no'} layers; " + _unsupported_layers(odd))
    shapes = {i: ((int(layer.keys.shape[1]), int(layer.keys.shape[3])),
                  (int(layer.values.shape[1]), int(layer.values.shape[3])))
              for i, layer in enumerate(layers) if isinstance(layer, DynamicLayer) and layer.is_initialized}
    indexers = {i: int(layer.indexer_keys.shape[-1]) for i, layer in enumerate(layers)
                if isinstance(layer, DynamicIndexedLayer) and layer.is_indexer_initialized}
    # an indexer that keeps the positions it has seen as a growing history (Qwen4Exp): one more head
    histories = {i: int(layer.indexer_position_ids.shape[0]) for i, layer in enumerate(layers)
                 if getattr(layer, "indexer_position_ids", None) is not None and i in shapes}
    states = {i: _layer_states(layer) for i, layer in enumerate(layers) if isinstance(layer, LinearAttentionLayer)}
    states = {i: parts for i, parts in states.items() if parts}
    dtypes = {kind: {getattr(layers[i], f"{kind}_states")[int(p.rsplit("_", 1)[1])].dtype
                     for i, parts in states.items() for p, _ in parts if p.startswith(kind)}
              for kind in ("conv", "recurrent")}
    mixed = {kind: sorted(map(str, d)) for kind, d in dtypes.items() if len(d) > 1}
    if mixed:
        raise GenerationError(f"{name}'s linear-attention states differ in dtype ({mixed}); the graph packs each "
                              "kind into one tensor of one dtype")
    import inspect

    takes_positions = "position_ids" in inspect.signature(model.forward).parameters
    return (shapes, takes_positions, states, {kind: next(iter(d)) for kind, d in dtypes.items() if d}, indexers,
            histories)


def _unsupported_layers(kinds: list[str]) -> str:
    """Why the folder cannot carry these cache layers, by kind."""
    return ("the onnxruntime-genai folder describes key/value (DynamicLayer, with an indexer's keys and position "
            "history or none) and linear-attention (conv and recurrent state: LinearAttentionLayer) layers only")


def export_genai(exporter, model: torch.nn.Module, inputs: Mapping[str, Any], config=None):
    """The GenaiStep of ``model`` exported with ``exporter`` (ONNX), batch, sequence and past dynamic."""
    import dataclasses

    if exporter.backend != "onnx":
        raise GenerationError(f"onnxruntime-genai runs ONNX graphs; this generator was exported for {exporter.backend}")
    own = own_state_argument_of(model)
    if own is not None:  # Rwkv's state list: one recurrent-state slot (exporters/generation/genai_state.py)
        return export_genai_own_state(exporter, model, inputs, own, config, _check_one_graph)
    try:
        layer_shapes, takes_positions, states, state_dtypes, indexers, histories = _layout(model, inputs)
    except (NoCacheReturned, PlainCacheRefused) as exc:
        # no cache the folder can name (OpenAIGPT: none; Blt: its own decoder's): where generate can re-feed the whole
        # sequence instead, the sequence so far is the state (exporters/generation/genai_state.py)
        return export_genai_whole_sequence(exporter, model, inputs, config, _check_one_graph, str(exc))
    step = GenaiStep(model, layer_shapes, takes_positions, states, indexers, state_dtypes, histories).eval()
    if states or indexers:  # under the model patches the export installs (mamba_scan.py: a scan from the state)
        from exporters.utils import apply_patches

        with apply_patches(model_patches(exporter)):
            _check_one_graph(step, inputs["input_ids"][:1])
    ids = inputs["input_ids"]
    if ids.shape[0] < 2:  # a traced batch of 1 would be specialized
        ids = ids.expand(2, -1)
    if states and ids.shape[1] < 2:  # traced from a sequence of 2 or more (below)
        ids = torch.cat([ids, ids], dim=1)
    batch, seq, past = ids.shape[0], ids.shape[1], 3  # traced with a past of 3, run from past 0
    example: dict[str, torch.Tensor] = {"input_ids": ids, "attention_mask": torch.ones(batch, past + seq, dtype=torch.long)}
    if takes_positions:
        example["position_ids"] = torch.arange(past, past + seq).expand(batch, -1)
    example.update(step.zero_past(batch, past))
    from torch.export import Dim

    limit = (config.max_dim if config is not None else 1024)
    # with linear-attention layers the sequence is traced from 2: transformers' layers test `seq_len == 1` to
    # take their one-token path, so the trace takes the multi-token path, which starts from the given state
    # and is defined for one token as well; the graph then runs at every length (module doc), and the
    # artifact's bound says so (below)
    seq_from = 2 if states else 1
    b, s, p = Dim("batch", min=1, max=limit), Dim("seq", min=seq_from, max=limit), Dim("past", min=0, max=limit)
    shapes: dict[str, Any] = {"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: Dim.AUTO}}
    if takes_positions:
        shapes["position_ids"] = {0: b, 1: s}
    for name in example:
        if name.startswith("past_key_values."):
            shapes[name] = {0: b, 2: p} if name.endswith((".key", ".value")) else {0: b}
    config = config if config is not None else exporter.config_class()
    # with states, also torch's size-oblivious mode: a contiguity question on the padded chunks
    # (check_contiguous_sizes_strides) would guard the sequence away from the one length with no padding
    config = dataclasses.replace(config, dynamic=False, dynamic_shapes=shapes, accept_size_one=bool(states))
    artifact = exporter.export(step, example, config)
    for name in ("input_ids", "position_ids") if seq_from > 1 else ():
        dims = artifact.input_specs.get(name, ((), None, {}))[2]
        if 1 in dims:
            dims[1]["min"] = 1
    layout = {"layers": _num_layers(model), "kv_heads": step.heads, "head_size": step.size,
              "takes_positions": takes_positions, "attention_layers": sorted(layer_shapes)}
    if not step.uniform:  # each layer's own (heads, size) of keys and values inside the padded tensors (GenaiStep)
        layout["layer_shapes"] = {str(i): [list(k), list(v)] for i, (k, v) in layer_shapes.items()}
    if indexers:  # each sparse-attention indexer's key size, one more head of its layer's keys (GenaiStep)
        layout["indexers"] = {str(i): size for i, size in indexers.items()}
    if histories:  # each indexer's position history, one more head after its keys (GenaiStep)
        layout["position_histories"] = {str(i): dims for i, dims in histories.items()}
    if states:  # each linear-attention layer's states inside its conv / recurrent tensors (GenaiStep)
        layout["states"] = {str(i): [[part, list(shape)] for part, shape in parts] for i, parts in states.items()}
        layout["conv_size"], layout["recurrent_size"] = step.conv_size, step.recurrent_size
    artifact.extra_metadata.update({"component": "genai_decoder", "cache_layout": layout})
    return artifact, layout


def model_patches(exporter) -> list:
    """The exporter's patches of transformers' per-model code (paths under ``transformers.models.``, such as
    exporters/workarounds/models/mamba_scan.py's): what the model computes in the traced graph, which an eager
    check of that graph's calls must compute too."""
    backends = dict.fromkeys(("dynamo", exporter.backend))  # once each: the dynamo backend's are the dynamo ones
    return [entry for entry in exporter.registry.patches(*backends) if entry.path.startswith("transformers.models.")]


def _check_one_graph(step: GenaiStep, prompt: torch.Tensor, atol: float = 1e-3, share: float = 0.1) -> None:
    """Run ``step`` eagerly as onnxruntime-genai runs the graph, a first call from empty keys and zero states,
    then a call of two tokens from the presents it returned (two: eager takes the multi-token path the trace
    takes for every length), and compare those tokens' logits with the model's own forward over the whole
    sequence. A layer whose multi-token path ignores the state it is given (Mamba's full-sequence scan
    starts from zero) would decode from the wrong state: refused, by name. Small weights make a state's effect
    on logits small too, so the logits must also be far closer to the forward's than those of the same call with
    each kind of state (conv, recurrent) zeroed (within ``share`` of that distance) unless they are within float32
    rounding of them, whatever the weights' scale."""
    model = step.model
    while prompt.shape[1] < 4:
        prompt = torch.cat([prompt, prompt], dim=1)
    batch, seq = prompt.shape
    past = step.zero_past(batch, 0)

    def positions(start, n):
        return {"position_ids": torch.arange(start, start + n).expand(batch, -1)} if step.takes_positions else {}

    def call(ids, past, start):
        return step(ids, torch.ones(batch, start + ids.shape[1], dtype=torch.long), **positions(start, ids.shape[1]),
                    **past)

    try:
        with torch.no_grad():
            first = call(prompt[:, :-2], past, 0)
            given = {PAST[name.rsplit(".", 1)[1].removesuffix("_state")] % int(name.split(".")[1]): tensor
                     for name, tensor in first.items() if name.startswith("present.")}
            got = call(prompt[:, -2:], given, seq - 2)["logits"]
            # the same call with each kind of state zeroed: how far that state moves these logits
            kinds = sorted({part.rsplit("_", 1)[0] for parts in step.states.values() for part, _ in parts})
            zeroed = {kind: call(prompt[:, -2:], {k: torch.zeros_like(v) if k.endswith(f".{kind}_state") else v
                                                  for k, v in given.items()}, seq - 2)["logits"] for kind in kinds}
            if getattr(step, "appended", None) is not None:  # a re-fed sequence with generate's own column after
                # it (XLM's mask token; genai_state.py): the model's forward over the plain ids is not what generate
                # computes, the step's own call over the whole prompt from the empty state is
                expected = call(prompt, past, 0)["logits"][:, -2:]
            else:
                expected = model(input_ids=prompt, attention_mask=torch.ones_like(prompt), use_cache=False,
                                 **positions(0, seq)).logits[:, -2:]
    except Exception as exc:  # noqa: BLE001 - the model cannot run several new tokens over its states
        raise GenerationError(
            f"{type(model).__name__}: several new tokens after a first call, over its cache's states, fail in eager "
            f"({exception_headline(exc)}); onnxruntime-genai runs one graph "
            "for the prompt and every step, which needs that call") from exc
    error = (got.float() - expected.float()).abs().max().item()
    moved = {kind: (z.float() - expected.float()).abs().max().item() for kind, z in zeroed.items()}
    noise = 1e-6 * max(1.0, expected.float().abs().max().item())  # float32 rounding of the split chunk
    if not torch.allclose(got.float(), expected.float(), atol=atol, rtol=atol) or (
            error > noise and any(error > share * m for m in moved.values())):
        raise GenerationError(
            f"{type(model).__name__}: its linear-attention layers do not run their multi-token path from the state "
            f"they are given (two tokens after a first call: logits {error:.3g} off the model's forward over the whole "
            f"sequence; with each kind of state zeroed: {', '.join(f'{k} {m:.3g}' for k, m in moved.items())}); the one "
            "graph onnxruntime-genai runs for prompt and steps "
            "would decode from the wrong state")


def _num_layers(model: torch.nn.Module) -> int:
    text = model.config.get_text_config(decoder=True)
    return int(getattr(text, "num_hidden_layers", 0) or 0)


def genai_config(model: torch.nn.Module, generation: Mapping[str, Any], layout: Mapping[str, Any],
                 context_length: int) -> dict[str, Any]:
    text = model.config.get_text_config(decoder=True)
    inputs = {"input_ids": "input_ids", "attention_mask": "attention_mask",
              "past_key_names": PAST["key"], "past_value_names": PAST["value"]}
    if layout["takes_positions"]:
        inputs["position_ids"] = "position_ids"
    eos = generation.get("eos_token_id")
    eos = [int(e) for e in eos] if isinstance(eos, (list, tuple)) else ([int(eos)] if eos is not None else [])
    if not eos:
        # onnxruntime-genai ends a sequence at pad_token_id too (and checks it as an end id): with no end
        # token of the model's, any pad id would end generation where generate does not
        raise GenerationError(f"{type(model).__name__} has no end token (eos_token_id); onnxruntime-genai ends "
                              "generation at its pad_token_id as well, so it would stop where generate does not")
    return {
        "model": {
            "type": "llama",
            "context_length": context_length,
            "vocab_size": vocab_size(model),
            "bos_token_id": int(generation.get("bos_token_id") or 0),
            "eos_token_id": eos,
            "pad_token_id": eos[0],  # an end token for onnxruntime-genai: the model's first end token
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": "model.onnx",
                "head_size": layout["head_size"],
                "hidden_size": int(getattr(text, "hidden_size", layout["head_size"] * layout["kv_heads"])),
                "num_attention_heads": int(getattr(text, "num_attention_heads", layout["kv_heads"])),
                "num_key_value_heads": layout["kv_heads"],
                "num_hidden_layers": layout["layers"] or len(layout["attention_layers"]),
                "inputs": inputs,
                "outputs": {"logits": "logits", "present_key_names": PRESENT["key"],
                            "present_value_names": PRESENT["value"]},
            },
        },
        "search": {"do_sample": False, "max_length": context_length, "min_length": 0, "num_beams": 1,
                   "num_return_sequences": 1, "past_present_share_buffer": False, "early_stopping": True,
                   "length_penalty": 1.0, "no_repeat_ngram_size": 0, "diversity_penalty": 0.0,
                   "repetition_penalty": 1.0, "temperature": 1.0, "top_k": 1, "top_p": 1.0},
    }


def save_genai(directory: str | os.PathLike, artifact, config: Mapping[str, Any]) -> str:
    """``model.onnx`` + ``genai_config.json`` + ``tokenizer.json`` / ``tokenizer_config.json`` (the
    fixed-width word tokenizer, exporters/generation/runners.py) in ``directory``."""
    os.makedirs(directory, exist_ok=True)
    artifact.save(directory)
    fixed_width_tokenizer(int(config["model"]["vocab_size"])).save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": config["model"]["context_length"]},
                  f, indent=2)
    path = os.path.join(directory, CONFIG_FILE)
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
    return path


def export_genai_folder(directory: str | os.PathLike, exporter, model: torch.nn.Module, inputs: Mapping[str, Any],
                        config, generation: Mapping[str, Any]):
    """The whole runner save: refuse settings onnxruntime-genai cannot apply, export the decoder graph,
    write the folder (context length: the config's ``max_dim``). Returns the artifact."""
    from exporters.generation.runners import check_runner_generation

    check_runner_generation(generation, "onnxruntime-genai", vocab_size(model))
    artifact, layout = export_genai(exporter, model, inputs, config)
    context = int(getattr(config, "max_dim", 1024) or 1024)
    save_genai(directory, artifact, genai_config(model, generation, layout, context))
    return artifact


def run_ort_genai(directory: str, prompt_ids: Iterable[int], max_new_tokens: int) -> tuple[list[int], dict[str, Any]]:
    """Greedy generation by onnxruntime-genai over ``directory``: the prompt goes through the folder's
    tokenizer (which must give back the ids), then the new ids, the sequence length it reports (an end
    token it generated is not part of its sequence) and whether it says it is done."""
    import numpy as np
    import onnxruntime_genai as og

    from exporters.generation.runners import fixed_width_text

    prompt = [int(i) for i in prompt_ids]
    model = og.Model(os.fspath(directory))
    size = vocab_size_of(directory)
    encoded = [int(i) for i in og.Tokenizer(model).encode(fixed_width_text(prompt, size))]
    if encoded != prompt:
        raise GenerationError(f"the folder's tokenizer encodes the prompt {prompt} as {encoded}")
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + max_new_tokens, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([prompt], dtype=np.int32))
    new: list[int] = []
    while not generator.is_done() and len(new) < max_new_tokens:
        generator.generate_next_token()
        new.append(int(generator.get_next_tokens()[0]))
    sequence = [int(t) for t in generator.get_sequence(0)]
    return new, {"sequence_length": len(sequence), "done": bool(generator.is_done())}


def vocab_size_of(directory) -> int:
    with open(os.path.join(directory, CONFIG_FILE)) as f:
        return int(json.load(f)["model"]["vocab_size"])
