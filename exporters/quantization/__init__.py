"""Quantized exports: a named PT2E recipe (``int8``), applied before tracing, with PyTorch's own
quantized model (after ``convert_pt2e``) kept as the artifact's reference.

    artifact = ExecutorchExporter().export(model, inputs, config=ExecutorchConfig(quantization=int8(calibration=[inputs])))
    artifact(**inputs)            # int8 kernels in the backend's runtime
    artifact.reference(**inputs)  # the same quantized arithmetic, run by PyTorch

Stage 0 of every exporter (``Exporter._quantize``): trace the model as the backend does (its patches
installed), ``prepare_pt2e`` with the recipe's quantizer, run every calibration input, ``convert_pt2e``;
the converted module is what the backend exports. The quantizer is XNNPACK's (int8 activations,
symmetric per-channel int8 weights) on every backend: its quantize/dequantize pairs are what ExecuTorch
lowers to int8 XNNPACK kernels and what torch.onnx writes as QuantizeLinear/DequantizeLinear, which ONNX
Runtime fuses into integer kernels. A custom PT2E ``Quantizer`` object is accepted as
``int8(..., quantizer=q)``.

ONNX gets 7-bit weights (``reduce_range``, [-63, 63]). ONNX Runtime turns int8 activations into uint8
(``QDQS8ToU8Transformer``) and runs u8 x s8 matrix products; on x86 CPUs without VNNI, its AVX2 kernel
adds pairs of those products in int16 with saturation (255 x 127 x 2 > 32767). With full 8-bit weights
the artifact then differed from the quantized reference by up to 32 output steps on the zoo's tiny Llama,
75 on BERT and 255 on CLIP (this machine: AVX2, no VNNI); with 7-bit weights (255 x 63 x 2 < 32767) all
three were equal to it, element for element, at ONNX Runtime's default optimization level. ONNX Runtime's
own quantization tool documents the same choice (``reduce_range`` for non-VNNI CPUs). An artifact must
compute what its reference computes on any CPU it is shipped to, so the recipe does not depend on the
exporting machine. ExecuTorch's XNNPACK kernels accumulate in int32: full 8-bit weights there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from exporters.quantization.stage0 import tracing_for_quantization
from exporters.utils import apply_patches, exception_headline

__all__ = ["QuantizationError", "Quantized", "Recipe", "int8", "quantize"]

BACKENDS = ("dynamo", "onnx", "executorch")


class QuantizationError(ValueError):
    """A recipe a backend cannot run, an empty calibration set, a model PT2E cannot prepare."""


class Recipe:
    """``name``: what metadata and reports call it; ``calibration``: the inputs observers see;
    ``dynamic``: int8 activations quantized per call (dynamic) instead of calibrated (static);
    ``quantizer``: a custom PT2E Quantizer, else the backend's (``quantizer_for``). Not a dataclass: an
    export config's metadata (``dataclasses.asdict``) keeps its repr, not copies of the calibration
    tensors."""

    def __init__(self, name: str, calibration: tuple, dynamic: bool = False, quantizer: Any = None,
                 reduce_range: bool | None = None, expose_selections: bool = False):
        self.name, self.calibration, self.dynamic, self.quantizer = name, tuple(calibration), dynamic, quantizer
        self.reduce_range, self.expose_selections = reduce_range, expose_selections

    def __repr__(self) -> str:  # a config repr in metadata: no tensors
        return (f"Recipe(name={self.name!r}, calibration=<{len(self.calibration)} inputs>, dynamic={self.dynamic}, "
                f"reduce_range={self.reduce_range}, expose_selections={self.expose_selections})")

    def weight_range(self, backend: str) -> tuple[int, int]:
        """The int8 weights' [min, max]: 7-bit on ONNX unless ``reduce_range=False`` (the module docstring)."""
        reduce = self.reduce_range if self.reduce_range is not None else backend == "onnx"
        return (-63, 63) if reduce else (-127, 127)


def int8(calibration: Sequence[Mapping[str, Any]], dynamic: bool = False, quantizer: Any = None,
         reduce_range: bool | None = None, expose_selections: bool = False) -> Recipe:
    """Static int8 (activations calibrated on ``calibration``), or with ``dynamic=True`` int8 weights and
    activations quantized per call; symmetric, per-channel weights. ``reduce_range``: 7-bit weights;
    None: on ONNX only (the module docstring says why). ``expose_selections``: a model that selects (top-k,
    argmax...) also outputs each selection's input and indices, so that the reference can be run with the
    artifact's choices (exporters/quantization/selections.py); the computation is the same."""
    calibration = tuple(calibration)
    if not calibration:
        raise QuantizationError("int8(calibration=[]): the recipe needs at least one calibration input (the "
                                "model's inputs, as export takes them)")
    return Recipe("int8-dynamic" if dynamic else "int8", calibration, dynamic, quantizer, reduce_range, expose_selections)


def quantizer_for(recipe: Recipe, backend: str):
    if recipe.quantizer is not None:
        return recipe.quantizer
    if backend not in BACKENDS:
        raise QuantizationError(f"no quantizer for backend {backend!r}; known: {BACKENDS}")
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import get_symmetric_quantization_config

    from exporters.quantization.xnnpack import IntegerSafeXNNPACKQuantizer

    low, high = recipe.weight_range(backend)
    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=recipe.dynamic, weight_qmin=low, weight_qmax=high)
    return IntegerSafeXNNPACKQuantizer().set_global(config)


@dataclasses.dataclass
class Quantized:
    module: torch.nn.Module  # the converted module: PyTorch's quantized reference (QuantizedModel)
    metadata: dict[str, Any]


class QuantizedModel(torch.nn.Module):
    """The module ``convert_pt2e`` returned, called like the model: by the traced tensor inputs' names.
    The non-tensor inputs (flags, ints) were baked in when stage 0 traced the model; the artifact checks
    a later call's values against them, so here they are dropped. ``taps``: the selection outputs the
    converted module also returns (``selections.expose``); with them, the outputs are one flat dict."""

    def __init__(self, converted: torch.nn.Module, tensor_names: Sequence[str], taps: Sequence[str] = ()):
        super().__init__()
        self.converted = converted
        self.tensor_names = tuple(tensor_names)
        self.taps = tuple(taps)
        object.__setattr__(self, "_forced", None)  # built on first use; not a submodule the export would carry

    def forward(self, **inputs: Any):
        return self.merged(self.converted(**{k: inputs[k] for k in self.tensor_names}))

    def merged(self, result: Any) -> Any:
        """A (possibly perturbed or forced) copy's result as ``forward`` returns it."""
        if not self.taps:
            return result
        from exporters.pytrees import flatten_outputs

        outputs, tapped = result
        return {**flatten_outputs(outputs), **tapped}

    def forced(self) -> torch.fx.GraphModule:
        """The converted module with its selections taking given indices (``selections.set_choices``)."""
        from exporters.quantization import selections

        if self._forced is None:
            object.__setattr__(self, "_forced", selections.forced(self.converted))
        return self._forced

    def given(self, indices: Sequence[torch.Tensor] | None, **inputs: Any) -> Any:
        """The reference with each selection returning ``indices[i]`` (None: its own choice)."""
        from exporters.quantization import selections

        module = self.forced()
        selections.set_choices(module, None if indices is None else list(indices))
        try:
            return self.merged(module(**{k: inputs[k] for k in self.tensor_names}))
        finally:
            selections.set_choices(module, None)


QUANT_OPS = ("quantize_per_tensor", "quantize_per_channel", "choose_qparams")


def selection_ops(graph: torch.fx.Graph) -> list[str]:
    """The selection ops (``selections.SELECTION_OPS``) a graph calls, as ``aten.topk.default``..., sorted."""
    from exporters.quantization.selections import is_selection

    return sorted({str(node.target) for node in graph.nodes if is_selection(node)})


def quantize(model: torch.nn.Module, inputs: Mapping[str, Any], recipe: Recipe, backend: str,
             trace_program: Callable[[torch.nn.Module, Mapping[str, Any]], tuple[Any, list[str]]] | None = None,
             patches: Any = (), fired: Any = None) -> Quantized:
    """Stage 0: prepare, calibrate and convert ``model`` with ``recipe``'s quantizer for ``backend``.

    ``trace_program(model, inputs)`` is the backend's own trace (its patches installed), returning the
    ``ExportedProgram`` whose module PT2E prepares and the names of its tensor inputs; without it, a plain ``torch.export.export``. A model
    with no op the quantizer annotates is converted unchanged and recorded (``quantize_ops: 0``), not
    refused: it is a fact about the model, and its export is the fp32 one. ``patches`` (the stage-0
    workarounds, exporters/workarounds/quantization/) are installed around prepare, calibration and
    convert, and recorded in ``fired``."""
    from torchao.quantization.pt2e import quantize_pt2e  # looked up inside the patches: stage 0 patches them

    if not isinstance(recipe, Recipe):
        raise QuantizationError(f"quantization={recipe!r}: pass a recipe, e.g. exporters.quantization.int8(...)")
    quantizer = quantizer_for(recipe, backend)
    tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    with torch.no_grad():
        if trace_program is None:
            program, tensor_names = torch.export.export(model.eval(), (), tensors, strict=False), list(tensors)
        else:
            with tracing_for_quantization():
                program, tensor_names = trace_program(model.eval(), inputs)
        with apply_patches(patches, fired):
            prepared = quantize_pt2e.prepare_pt2e(program.module(), quantizer)
        for i, sample in enumerate(recipe.calibration):
            missing = [k for k in tensor_names if not isinstance(sample.get(k), torch.Tensor)]
            if missing:
                raise QuantizationError(f"calibration input {i} lacks the tensor inputs {missing} that the model "
                                        f"was traced with ({tensor_names})")
            try:
                prepared(**{k: sample[k] for k in tensor_names})
            except Exception as exc:
                raise QuantizationError(f"calibration input {i} does not run through the prepared model: "
                                        f"{exception_headline(exc)}") from exc
        with apply_patches(patches, fired):
            converted = quantize_pt2e.convert_pt2e(prepared)
    taps: list[str] = []
    if recipe.expose_selections:
        from exporters.quantization.selections import expose

        converted, taps = expose(converted)
    ops = sum(1 for n in converted.graph.nodes if n.op == "call_function" and any(q in str(n.target) for q in QUANT_OPS))
    dynamic_ops = sum(1 for n in converted.graph.nodes if n.op == "call_function" and "choose_qparams" in str(n.target))
    metadata = {"recipe": recipe.name, "dynamic": recipe.dynamic, "calibration_count": len(recipe.calibration),
                "quantizer": type(quantizer).__name__, "quantize_ops": ops, "dynamic_quantize_ops": dynamic_ops,
                "selection_ops": selection_ops(converted.graph),
                "float_for_selection": list(getattr(quantizer, "float_for_selection", [])),
                "selection_outputs": taps,
                "vector_weights": list(getattr(quantizer, "vector_weights", [])),
                "separated_conv_weights": getattr(quantizer, "separated_conv_weights", 0),
                "folded_conversions": len(getattr(quantizer, "folded_conversions", [])),
                "weight_range": None if recipe.quantizer is not None else list(recipe.weight_range(backend))}
    return Quantized(QuantizedModel(converted, tensor_names, taps), metadata)

