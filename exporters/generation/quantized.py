"""Quantization recipes per generation component (the dynamic cache form).

    generator = OnnxExporter().export_for_generation(model, inputs, config=OnnxConfig(dynamic=True),
                                                     quantization={"decode": int8(calibration=[inputs])})
    generator.generate(**inputs, max_new_tokens=8)              # the int8 decode step in ONNX Runtime
    reference_generator(generator).generate(**inputs, ...)      # the same loop over PyTorch's quantized components

``quantization`` maps component labels (``prefill``, ``decode``, an encoder's label) to a recipe; a component
without one is exported in fp32, so a static int8 vision encoder, a dynamic int8 decode step and an fp32
prefill is ``{"image_encoder": int8(calibration=...), "decode": int8(calibration=..., dynamic=True)}``. A recipe's
calibration inputs are the model's (what ``generate`` takes): each is run through the model's ``generate``, and
the component is calibrated on its own inputs in that run (the prefill's call; the first decode step's call,
with the cache it was given, the step the decode component was exported from; the encoder's call).

Not built: the static cache form (its step writes its cache buffers in place, which PT2E's prepared graph does
not carry), and a recipe per submodule inside a component (an fp32 head in an int8 decoder).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from exporters.generation.capture import GenerationError


def checked_recipes(quantization: Mapping[str, Any] | None, labels: list[str]) -> dict[str, Any]:
    """The recipes by component label, refused by name where a label or a recipe is not one."""
    from exporters.quantization import QuantizationError, Recipe

    if not quantization:
        return {}
    if not isinstance(quantization, Mapping):
        raise GenerationError(f"quantization={quantization!r}: give a recipe per component, e.g. "
                              f"{{'decode': int8(calibration=[inputs])}}; this model's components: {labels}")
    unknown = [k for k in quantization if k not in labels]
    if unknown:
        raise GenerationError(f"quantization names {unknown}, which are not components of this generator; its "
                              f"components: {labels}")
    for label, recipe in quantization.items():
        if not isinstance(recipe, Recipe):
            raise QuantizationError(f"quantization[{label!r}]={recipe!r}: pass a recipe, e.g. "
                                    "exporters.quantization.int8(calibration=[inputs])")
        if recipe.expose_selections:  # extra outputs the loop does not read; the forward's parity check does
            raise QuantizationError(f"quantization[{label!r}] has expose_selections=True: a generation component's "
                                    "outputs are what the loop reads; selection outputs are for a forward export's "
                                    "parity check (exporters/quantization/selections.py)")
    return dict(quantization)


def component_calibration(recipes: Mapping[str, Any], capture: Callable[[Mapping[str, Any]], dict[str, list[dict]]]
                          ) -> dict[str, Any]:
    """Each recipe with its calibration replaced by the component's own inputs: ``capture(sample)`` runs the model's
    generate on one of the recipe's inputs and returns, per component label, the flat inputs of its calls."""
    from exporters.quantization import Recipe

    captured: dict[int, dict[str, list[dict]]] = {}  # one generate run per sample, whichever recipes name it

    def of(sample: Mapping[str, Any]) -> dict[str, list[dict]]:
        if id(sample) not in captured:
            captured[id(sample)] = capture(sample)
        return captured[id(sample)]

    calibrated = {}
    for label, recipe in recipes.items():
        own = [flat for sample in recipe.calibration for flat in of(sample).get(label, [])]
        if not own:
            raise GenerationError(f"the calibration inputs of quantization[{label!r}] never reached the {label} "
                                  "component in the model's generate")
        calibrated[label] = Recipe(recipe.name, own, recipe.dynamic, recipe.quantizer, recipe.reduce_range)
    return calibrated


class ReferenceComponent:
    """A component artifact called as PyTorch's quantized model of it (its ``reference``), with the artifact's
    names and specs; an fp32 component (no reference) runs as exported."""

    def __init__(self, artifact: Any):
        self.artifact = artifact
        self.input_names, self.output_names = artifact.input_names, artifact.output_names
        self.input_specs, self.backend = artifact.input_specs, "reference"

    def __call__(self, **inputs: Any) -> dict[str, Any]:
        if self.artifact.reference is None:
            return self.artifact(**inputs)
        return self.artifact.reference(**inputs)


def reference_generator(generator: Any) -> Any:
    """The generator's loop over its components' quantized references (PyTorch running each converted model): what
    the quantized components should generate. Each component keeps its artifact's names, so the loop is the same."""
    if not any(getattr(c, "reference", None) is not None for c in generator.components.values()):
        raise GenerationError("this generator has no quantized component (export_for_generation(..., quantization=...))")
    twin = copy.copy(generator)
    twin.components = {label: ReferenceComponent(c) for label, c in generator.components.items()}
    return twin
