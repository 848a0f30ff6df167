"""Generation export: a model's prefill and decode step, captured from its own ``generate``, exported
with any exporter, and driven token by token by a ``Generator`` that runs only the artifacts.

    generator = OnnxExporter().export_for_generation(model, inputs, config=OnnxConfig(dynamic=True))
    tokens = generator.generate(**inputs, max_new_tokens=16)   # == model.generate(..., do_sample=False)
    generator.save("out/"); load_generator("out/")               # exporters.loading, no weights needed

Components: ``prefill`` (the first forward call of ``generate``: the prompt, an empty cache) and
``decode`` (a one-token step reading and returning the cache). Each is a ``FlatComponent``: the cache
goes in and out as flat tensors. How every decode input follows from the call before it is read off
the captured calls and checked on each pair (steps.py). Cache form: ``"dynamic"`` (a growing cache).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from exporters.generation.capture import GenerationError, capture_generate
from exporters.generation.component import FlatComponent, flat_inputs
from exporters.generation.generator import GenerateOutput, Generator
from exporters.generation.steps import infer_prefill_rules, infer_rules

__all__ = ["GenerateOutput", "GenerationError", "GenerationExport", "Generator", "export_for_generation"]

CACHE_FORMS = ("dynamic",)
CAPTURED_STEPS = 3  # prefill + 2 decode steps: two pairs to check each decode input's rule on


def export_for_generation(exporter, model: torch.nn.Module, inputs: Mapping[str, Any], config=None,
                          cache: str = "dynamic") -> Generator:
    if cache not in CACHE_FORMS:
        raise GenerationError(f"cache={cache!r} is not supported; this version exports cache forms {CACHE_FORMS} "
                              "(a static cache with in-place updates is not built yet)")
    if "input_ids" not in inputs:
        raise GenerationError(f"generation export needs input_ids among the inputs, got {sorted(inputs)}")
    captured_inputs = _padded(inputs)
    calls, sequences = capture_generate(model, captured_inputs, CAPTURED_STEPS)
    prefill, decode = calls[0], calls[1]
    prompt_length = inputs["input_ids"].shape[-1]
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False) or "decoder_input_ids" in prefill.tensors:
        raise GenerationError(f"{type(model).__name__} is an encoder-decoder: its encoder runs outside forward in "
                              "generate, and an encoder component is not built yet")
    filled = [k for k, (leaves, _) in prefill.trees.items() if leaves]
    if filled:
        raise GenerationError(f"the prefill call of {type(model).__name__}.generate takes {filled}, filled before the "
                              "first forward: a component that makes them (an encoder) is not built yet")
    given = {k: v for k, v in captured_inputs.items() if isinstance(v, torch.Tensor)}
    prefill_rules = infer_prefill_rules(prefill, given)
    rules = infer_rules(calls, sequences, prompt_length)
    carried = [n for n, r in rules.items() if n in decode.trees and r != "outputs"]
    if carried:
        raise GenerationError(f"decode-step trees {carried} are carried from the prompt, not from the previous "
                              "step's outputs: an encoder component is not built yet")
    for name in decode.trees:
        out = prefill.output_trees.get(name)
        if out is None or out[1] != decode.trees[name][1]:
            raise GenerationError(f"the prefill's output {name!r} does not have the structure the decode step takes")
    config = config if config is not None else exporter.config_class()
    components = {}
    for label, call in (("prefill", prefill), ("decode", decode)):
        component = FlatComponent(model, call).eval()
        artifact = exporter.export(component, {**flat_inputs(call.tensors, {k: v[0] for k, v in call.trees.items()}),
                                               **call.constants}, config)
        artifact.extra_metadata["component"] = label
        components[label] = artifact
    generation = model.generation_config.to_diff_dict() if getattr(model, "generation_config", None) else {}
    generation = {k: v for k, v in generation.items() if isinstance(v, (int, float, str, bool, list, type(None)))}
    metadata = {"model_class": type(model).__name__, "cache": cache,
                "workarounds_fired": {k: a.workarounds_fired for k, a in components.items()}}
    caller_inputs = [k for k in prefill.tensors if k not in prefill_rules]
    return Generator(components, rules, caller_inputs, {k: len(v[0]) for k, v in decode.trees.items()},
                     generation, metadata, prefill_rules)


def _padded(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The inputs with the first row's first position padded when the mask pads nothing: generate drops an
    all-ones mask before the first forward, and components captured without one could not take padding."""
    inputs = dict(inputs)
    mask = inputs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[-1] > 1 and bool((mask == 1).all()):
        mask = mask.clone()
        mask[0, 0] = 0
        inputs["attention_mask"] = mask
    return inputs


class GenerationExport:
    """Mixed into each exporter: ``export_for_generation(model, inputs, config=None, cache="dynamic")``."""

    def export_for_generation(self, model: torch.nn.Module, inputs: Mapping[str, Any], config=None,
                              cache: str = "dynamic") -> Generator:
        return export_for_generation(self, model, inputs, config, cache)
