"""Quantized exports: a named PT2E recipe (``int8``), applied before tracing, with PyTorch's own
quantized model (after ``convert_pt2e``) kept as the artifact's reference.

    artifact = ExecutorchExporter().export(model, inputs, config=ExecutorchConfig(quantization=int8(calibration=[inputs])))
    artifact(**inputs)            # int8 kernels in the backend's runtime
    artifact.reference(**inputs)  # the same quantized arithmetic, run by PyTorch

Stage 0 of every exporter (``Exporter._quantize``): ``torch.export`` the model, ``prepare_pt2e`` with the
recipe's quantizer, run every calibration input, ``convert_pt2e``; the converted module is what the
backend exports. Quantizers: XNNPACK's (symmetric int8, per-channel weights) for every backend: its
quantize/dequantize pairs are what ExecuTorch lowers to int8 XNNPACK kernels and what torch.onnx writes
as QuantizeLinear/DequantizeLinear, which ONNX Runtime runs. A custom PT2E ``Quantizer`` object is
accepted as ``int8(..., quantizer=q)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

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

    def __init__(self, name: str, calibration: tuple, dynamic: bool = False, quantizer: Any = None):
        self.name, self.calibration, self.dynamic, self.quantizer = name, tuple(calibration), dynamic, quantizer

    def __repr__(self) -> str:  # a config repr in metadata: no tensors
        return f"Recipe(name={self.name!r}, calibration=<{len(self.calibration)} inputs>, dynamic={self.dynamic})"


def int8(calibration: Sequence[Mapping[str, Any]], dynamic: bool = False, quantizer: Any = None) -> Recipe:
    """Static int8 (activations calibrated on ``calibration``), or with ``dynamic=True`` int8 weights and
    activations quantized per call; symmetric, per-channel weights."""
    calibration = tuple(calibration)
    if not calibration:
        raise QuantizationError("int8(calibration=[]): the recipe needs at least one calibration input (the "
                                "model's inputs, as export takes them)")
    return Recipe("int8-dynamic" if dynamic else "int8", calibration, dynamic, quantizer)


def quantizer_for(recipe: Recipe, backend: str):
    if recipe.quantizer is not None:
        return recipe.quantizer
    if backend not in BACKENDS:
        raise QuantizationError(f"no quantizer for backend {backend!r}; known: {BACKENDS}")
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import get_symmetric_quantization_config

    from exporters.quantization.xnnpack import IntegerSafeXNNPACKQuantizer

    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=recipe.dynamic)
    return IntegerSafeXNNPACKQuantizer().set_global(config)


@dataclasses.dataclass
class Quantized:
    module: torch.nn.Module  # the converted module: PyTorch's quantized reference
    metadata: dict[str, Any]


QUANT_OPS = ("quantize_per_tensor", "quantize_per_channel", "choose_qparams")


def quantize(model: torch.nn.Module, inputs: Mapping[str, Any], recipe: Recipe, backend: str) -> Quantized:
    """Stage 0: prepare, calibrate and convert ``model`` with ``recipe``'s quantizer for ``backend``."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    if not isinstance(recipe, Recipe):
        raise QuantizationError(f"quantization={recipe!r}: pass a recipe, e.g. exporters.quantization.int8(...)")
    quantizer = quantizer_for(recipe, backend)
    tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    with torch.no_grad():
        module = torch.export.export(model.eval(), (), tensors, strict=False).module()
        prepared = prepare_pt2e(module, quantizer)
        for i, sample in enumerate(recipe.calibration):
            try:
                prepared(**{k: v for k, v in sample.items() if isinstance(v, torch.Tensor)})
            except Exception as exc:
                raise QuantizationError(f"calibration input {i} does not run through the prepared model: "
                                        f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
        converted = convert_pt2e(prepared)
    ops = sum(1 for n in converted.graph.nodes if n.op == "call_function" and any(q in str(n.target) for q in QUANT_OPS))
    metadata = {"recipe": recipe.name, "dynamic": recipe.dynamic, "calibration_count": len(recipe.calibration),
                "quantizer": type(quantizer).__name__, "quantize_ops": ops}
    return Quantized(converted, metadata)
