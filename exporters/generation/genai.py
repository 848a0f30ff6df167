"""The folder onnxruntime-genai loads (``onnxruntime_genai.Model(folder)``): one decoder graph that
takes the whole prompt at past length 0 and each new token after it, and ``genai_config.json`` naming
its inputs, outputs and cache layout.

The graph (``GenaiStep``): inputs ``input_ids`` [batch, S], ``attention_mask`` [batch, past + S],
``position_ids`` [batch, S] (where the model reads them), ``past_<i>_key`` / ``past_<i>_value``
[batch, kv_heads, past, head_size] (past from 0); outputs ``logits`` [batch, S, vocab] and
``present_<i>_key`` / ``present_<i>_value`` [batch, kv_heads, past + S, head_size]. This is the
growing-cache layout of onnxruntime-genai's decoder-only model (``past_present_share_buffer``
false); its config keys are the ones its model builder writes (model.decoder.inputs /
outputs with ``%d`` name templates, head_size, num_key_value_heads, ...). ``type`` is "llama":
onnxruntime-genai picks its generic decoder-only model class by that name and reads nothing else of it.

Layers whose keys and values differ in size (multi-head latent attention) or in head count share the
largest of each in the graph's cache tensors, each layer's own part zero-padded (``GenaiStep``). A model
the config cannot describe is refused by name (GenerationError): a cache with layers other than plain
key/value layers (recurrent state, indexed or linear-attention layers), or a forward that needs inputs
besides ids, mask and positions.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from exporters.generation.capture import GenerationError, encoder_of, plain_sliding_layers
from exporters.generation.runners import fixed_width_tokenizer, vocab_size

CONFIG_FILE = "genai_config.json"
GENAI_INPUTS = ("input_ids", "attention_mask", "position_ids")


class GenaiStep(torch.nn.Module):
    """``model`` over a DynamicCache rebuilt from ``past_<i>_*`` inputs; returns logits and presents."""

    def __init__(self, model: torch.nn.Module, shapes: list[tuple[tuple[int, int], tuple[int, int]]],
                 takes_positions: bool):
        """``shapes``: each layer's own ((heads, size) of keys, (heads, size) of values). genai_config.json
        has one num_key_value_heads and one head_size, so where they are not all one (multi-head latent
        attention: keys and values of different sizes; layers of different head counts) the graph's cache
        tensors all have the largest of each: a layer's own part is zero-padded on the way out and sliced
        off on the way in, and the model sees its own cache exactly."""
        super().__init__()
        self.model, self.shapes, self.takes_positions = model, shapes, takes_positions
        self.layers = len(shapes)
        dims = {d for pair in shapes for d in pair}
        self.heads, self.size = max(h for h, _ in dims), max(s for _, s in dims)
        self.uniform = len(dims) == 1

    def _narrow(self, tensor: torch.Tensor, layer: int, part: int) -> torch.Tensor:
        if self.uniform:
            return tensor
        heads, size = self.shapes[layer][part]
        return tensor[:, :heads, :, :size]

    def _widen(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.uniform:
            return tensor
        return torch.nn.functional.pad(tensor, (0, self.size - tensor.shape[-1], 0, 0, 0, self.heads - tensor.shape[1]))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor | None = None,
                **past: torch.Tensor) -> dict[str, torch.Tensor]:

        cache = plain_cache(self.model)
        for i in range(self.layers):
            cache.update(self._narrow(past[f"past_{i}_key"], i, 0), self._narrow(past[f"past_{i}_value"], i, 1), i)
        kwargs = {"position_ids": position_ids} if self.takes_positions else {}
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True,
                         return_dict=True, **kwargs)
        outputs = {"logits": out.logits}
        for i, layer in enumerate(out.past_key_values.layers):
            outputs[f"present_{i}_key"], outputs[f"present_{i}_value"] = self._widen(layer.keys), self._widen(layer.values)
        return outputs


def plain_cache(model: torch.nn.Module):
    """The model's DynamicCache with each sliding-window layer made a plain one
    (``capture.plain_sliding_layers``): genai_config.json then describes one layout for every layer.
    Other layer kinds stay, and are refused by ``_layout`` by name."""
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache(config=model.config)
    plain_sliding_layers(cache)
    return cache


def _layout(model: torch.nn.Module, inputs: Mapping[str, Any]) -> tuple[list, bool]:
    """(each layer's ((heads, size) of keys, (heads, size) of values), takes_positions), read off one eager
    forward with a DynamicCache whose layers must all be plain key/value layers."""
    from transformers.cache_utils import DynamicLayer

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
    try:
        with torch.no_grad():
            out = model(input_ids=ids[:1], use_cache=True, past_key_values=plain_cache(model), return_dict=True)
    except Exception as exc:  # noqa: BLE001 - the model refuses the plain cache it would be given
        raise GenerationError(f"{name} does not run with a plain key/value DynamicCache ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''}); genai_config.json describes that "
                              "cache only") from exc
    cache = getattr(out, "past_key_values", None)
    if cache is None:
        state = sorted(k for k, v in (out.items() if hasattr(out, "items") else []) if k.endswith(("cache", "params")))
        raise GenerationError(f"{name} returns no past_key_values (its state: {state or 'none'}); genai_config.json "
                              "describes a key/value cache only")
    layers = list(getattr(cache, "layers", []))
    odd = sorted({type(layer).__name__ for layer in layers if type(layer) is not DynamicLayer})
    if not layers or odd:
        raise GenerationError(f"{name}'s cache holds {odd or 'no'} layers; " + _unsupported_layers(odd))
    shapes = [((int(layer.keys.shape[1]), int(layer.keys.shape[3])), (int(layer.values.shape[1]), int(layer.values.shape[3])))
              for layer in layers]
    import inspect

    takes_positions = "position_ids" in inspect.signature(model.forward).parameters
    return shapes, takes_positions


def _unsupported_layers(kinds: list[str]) -> str:
    """Why the folder cannot carry these cache layers, by kind."""
    if any(k.startswith("LinearAttention") for k in kinds):
        return ("onnxruntime-genai (0.18) takes conv and recurrent state by name (past_conv_names / "
                "past_recurrent_names), but runs one graph for the prompt and for every step from the state it is "
                "given, while transformers' linear-attention layers run the prompt from zero state and only a "
                "one-token step from a stored one (has_previous_state); the one-graph form of these layers (the "
                "prompt's convolution and chunked recurrence started from the given state) is not built yet")
    if any("Indexed" in k for k in kinds):
        return ("a sparse-attention indexer's keys are a cache of their own, which genai_config.json has no input "
                "names for (it names key, value, conv and recurrent tensors only)")
    return "the onnxruntime-genai folder describes key/value, conv and recurrent layers only"


def export_genai(exporter, model: torch.nn.Module, inputs: Mapping[str, Any], config=None):
    """The GenaiStep of ``model`` exported with ``exporter`` (ONNX), batch, sequence and past dynamic."""
    import dataclasses

    if exporter.backend != "onnx":
        raise GenerationError(f"onnxruntime-genai runs ONNX graphs; this generator was exported for {exporter.backend}")
    layer_shapes, takes_positions = _layout(model, inputs)
    step = GenaiStep(model, layer_shapes, takes_positions).eval()
    ids = inputs["input_ids"]
    if ids.shape[0] < 2:  # a traced batch of 1 would be specialized
        ids = ids.expand(2, -1)
    batch, seq, past = ids.shape[0], ids.shape[1], 3  # traced with a past of 3, run from past 0
    example: dict[str, torch.Tensor] = {"input_ids": ids, "attention_mask": torch.ones(batch, past + seq, dtype=torch.long)}
    if takes_positions:
        example["position_ids"] = torch.arange(past, past + seq).expand(batch, -1)
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    for i in range(step.layers):
        for part in ("key", "value"):
            example[f"past_{i}_{part}"] = torch.zeros(batch, step.heads, past, step.size, dtype=dtype)
    from torch.export import Dim

    limit = (config.max_dim if config is not None else 1024)
    b, s, p = Dim("batch", min=1, max=limit), Dim("seq", min=1, max=limit), Dim("past", min=0, max=limit)
    shapes: dict[str, Any] = {"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: Dim.AUTO}}
    if takes_positions:
        shapes["position_ids"] = {0: b, 1: s}
    shapes.update({k: {0: b, 2: p} for k in example if k.startswith("past_")})
    config = config if config is not None else exporter.config_class()
    config = dataclasses.replace(config, dynamic=False, dynamic_shapes=shapes, accept_size_one=False)
    artifact = exporter.export(step, example, config)
    layout = {"layers": step.layers, "kv_heads": step.heads, "head_size": step.size, "takes_positions": takes_positions}
    if not step.uniform:  # each layer's own (heads, size) of keys and values inside the padded tensors (GenaiStep)
        layout["layer_shapes"] = [[list(k), list(v)] for k, v in layer_shapes]
    artifact.extra_metadata.update({"component": "genai_decoder", "cache_layout": layout})
    return artifact, layout


def genai_config(model: torch.nn.Module, generation: Mapping[str, Any], layout: Mapping[str, Any],
                 context_length: int) -> dict[str, Any]:
    text = model.config.get_text_config(decoder=True)
    inputs = {"input_ids": "input_ids", "attention_mask": "attention_mask",
              "past_key_names": "past_%d_key", "past_value_names": "past_%d_value"}
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
                "num_hidden_layers": layout["layers"],
                "inputs": inputs,
                "outputs": {"logits": "logits", "present_key_names": "present_%d_key",
                            "present_value_names": "present_%d_value"},
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

    check_runner_generation(generation, "onnxruntime-genai")
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
