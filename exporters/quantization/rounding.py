"""How far the quantized reference itself moves when its quantized activations round one step the other way.

A backend's integer kernels and the reference's float arithmetic (dequantize -> float op -> quantize) put a
value that lies next to a rounding boundary on neighbouring grid points: that activation then differs by one
step at that element, and the layers after it carry the difference to the outputs with their own gain. How
far such one-step differences reach an output is a property of the model, not of the backend: a two-layer
encoder keeps them within a step or two, a deep vocoder multiplies them layer by layer.

``rounding_spread`` measures it on the reference: it runs the converted module with ``FRACTION`` of the
elements of every quantized activation (every ``quantize_per_tensor`` output; weights are constants,
quantized once, the same in every backend) moved one step up or down, chosen at random, for ``SEEDS`` seeds,
and returns, per floating output, the largest deviation from the unperturbed reference. exporters/parity.py
allows an artifact that spread where it exceeds the fixed bound.

Why 0.5%. ONNX Runtime's fused integer kernels, compared with its own unfused (float-simulating) session on
every quantized tensor (``benchmarks/ort_int8_divergence.py``), first disagree by one step on 9 of 7168
elements (0.13%, PocketTTSAudioTokenizerDecoder) and 1 of 896 (0.11%, FastSpeech2ConformerWithHifiGan): the
fraction is about four times the largest rate measured, applied to every quantized activation at once.

Why 12 seeds. The spread is the worst deviation over a sample of random one-step patterns, so a small sample
underestimates it: on ImageGPTModel's tiny model (onnx) the worst of 3 seeds moved last_hidden_state 7 steps and
the worst of 12 moved it 9, at the element ([1, 3, 0]) where ONNX Runtime's artifact is 9 steps off while its
integer kernels agree with its own unfused session at every QuantizeLinear after a Conv, Gemm or MatMul
(benchmarks/ort_int8_divergence.py ImageGPTModel --level all: no divergence); Mamba2Model's last_hidden_state
41.5 steps at 3 seeds, 50 at 12 (results/s42/elem_spread.py, not committed). A caller may measure
``FIRST_SEEDS`` first and the rest only where an output is past what they give: the maximum over 12 seeds is
never below the maximum over their first 3, so the verdict is the one 12 seeds give.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import torch

FRACTION = 0.005  # of each quantized activation's elements, moved one step (module docstring)
SEEDS = tuple(range(12))  # the spread is the worst of these (module docstring, "Why 12 seeds")
FIRST_SEEDS = SEEDS[:3]  # enough where the artifact is within them: more seeds only widen the spread
NUDGE = "_rounding_nudge"  # the submodule the perturbed copy calls after each activation quantize


class _Nudge(torch.nn.Module):
    """Moves ``fraction`` of a quantized tensor's elements one step up or down (kept in its range)."""

    def __init__(self, fraction: float):
        super().__init__()
        self.fraction = fraction
        self.generator = torch.Generator().manual_seed(0)

    def forward(self, q: torch.Tensor, quant_min: int, quant_max: int) -> torch.Tensor:
        chosen = torch.rand(q.shape, generator=self.generator) < self.fraction
        sign = torch.randint(0, 2, q.shape, generator=self.generator) * 2 - 1
        moved = q.to(torch.int32) + chosen.to(torch.int32) * sign.to(torch.int32)
        return moved.clamp(quant_min, quant_max).to(q.dtype)


def _activation_quantizes(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    quantize = torch.ops.quantized_decomposed.quantize_per_tensor
    targets = {getattr(quantize, name) for name in quantize.overloads()}
    return [n for n in graph.nodes if n.op == "call_function" and n.target in targets]


def perturbed_copy(converted: torch.fx.GraphModule, fraction: float = FRACTION) -> tuple[torch.fx.GraphModule, int]:
    """A copy of the converted module whose activation quantizes are followed by a ``_Nudge``; and how many (0: no
    copy is made, the module itself is returned)."""
    if not _activation_quantizes(converted.graph):
        return converted, 0
    copied = copy.deepcopy(converted)
    nodes = _activation_quantizes(copied.graph)
    copied.add_module(NUDGE, _Nudge(fraction))
    for node in nodes:
        quant_min, quant_max = node.args[3], node.args[4]
        with copied.graph.inserting_after(node):
            nudged = copied.graph.call_module(NUDGE, (node, quant_min, quant_max))
        node.replace_all_uses_with(nudged, delete_user_cb=lambda user: user is not nudged)
    copied.recompile()
    return copied, len(nodes)


def rounding_spread(quantized_model: Any, inputs: Mapping[str, Any], fraction: float = FRACTION,
                    seeds: tuple[int, ...] = SEEDS, reference: Mapping[str, torch.Tensor] | None = None) -> dict[str, float]:
    """Per floating output of the reference (named as ``flatten_outputs`` names them): the largest
    |perturbed - reference| over ``seeds``; empty where the model quantizes no activation. A model with exposed
    selections (``taps``) keeps its own choices in the perturbed runs: the spread of the arithmetic, given them. A non-finite
    deviation (a perturbed value that overflows) is returned as inf: no spread can be relied on there.
    ``reference``: the reference's own outputs at ``inputs`` (as ``quantized_model`` returns them, flattened),
    where the caller has run it already; otherwise it is run here."""
    from exporters.pytrees import flatten_outputs
    from exporters.quantization import selections

    taps, names, merged = quantized_model.taps, quantized_model.tensor_names, quantized_model.merged
    # a model that selects: the perturbed copies keep the reference's own choices (selections.py)
    converted = quantized_model.forced() if taps else quantized_model.converted
    perturbed, count = perturbed_copy(converted, fraction)
    if not count:
        return {}
    feed = {k: inputs[k] for k in names}
    with torch.no_grad():
        if reference is None:
            reference = flatten_outputs(merged(converted(**feed)))
        if taps:
            selections.set_choices(perturbed, selections.choices(reference, taps))
        spread: dict[str, float] = {}
        for seed in seeds:
            perturbed.get_submodule(NUDGE).generator.manual_seed(seed)
            try:
                result = perturbed(**feed)
            except RuntimeError as exc:
                if "Runtime assertion failed" not in str(exc):
                    raise
                # one-step moves left the domain the program asserts (a data-dependent branch or count baked
                # at trace time: VITS's flows): no spread is measured, every output keeps the fixed bound
                return {name: math.inf for name, value in reference.items()
                        if isinstance(value, torch.Tensor) and value.is_floating_point()}
            for name, value in flatten_outputs(merged(result)).items():
                ref = reference.get(name)
                if not (isinstance(ref, torch.Tensor) and ref.is_floating_point() and ref.shape == value.shape):
                    continue
                both = torch.isfinite(ref) & torch.isfinite(value)
                if not bool((both | (ref == value)).all()):
                    spread[name] = math.inf
                    continue
                diff = (value.double() - ref.double())[both].abs()
                spread[name] = max(spread.get(name, 0.0), float(diff.max()) if diff.numel() else 0.0)
    return spread
