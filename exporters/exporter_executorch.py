"""ExecutorchExporter: torch.export, lowered with to_edge_transform_and_lower + to_executorch,
run in the ExecuTorch runtime. Five stages around the lowering.

The lowering and its retries are in exporters/executorch/lowering.py, the artifact and the runtime in
exporters/executorch/artifact.py; each stage block below says where its workarounds live.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from .base import ExportConfig, Exporter, run_stage
from .executorch.artifact import ExecutorchArtifact, PlannedShapeError
from .executorch.lowering import (
    LOWERING_RETRIES,
    Attempt,
    Lowered,
    RetryContext,
    halved_max_dim,
    large_dims_fixed,
    lower_with_retries,
    lower_within_budget,
)
from .generation import GenerationExport
from .specialize import with_layout_inputs
from .tracing import _finite, quantization_trace, shape_arithmetic_patches, trace
from .utils import FiredLog, apply_fx_node_fixes, apply_fx_program_fixes, split_quantization_patches

__all__ = ["LOWERING_RETRIES", "ExecutorchArtifact", "ExecutorchConfig", "ExecutorchExporter", "PlannedShapeError",
           "_BACKEND_PREPARE", "_EXECUTORCH_INTERNALS", "bound_dynamic_shapes", "contiguous_inputs", "halved_max_dim",
           "large_dims_fixed", "prepare_for_cuda",
           "prepare_for_xnnpack"]

# "executorch" patches on these paths are ExecuTorch patches (stage 3, installed around lowering):
# ExecuTorch's internals, and the torch functions its lowering calls per partition program or per pass;
# the others are torch patches (stage 2, installed around torch.export).
_EXECUTORCH_INTERNALS = ("executorch.", "torch.export.exported_program._convert_guards_to_code",
                         "torch.fx.traceback.NodeSource.__init__")


@dataclasses.dataclass
class ExecutorchConfig(ExportConfig):
    backend: str = "xnnpack"  # a key of _BACKEND_PREPARE
    max_dim: int = 64  # ExecuTorch plans memory for the upper bound of every dynamic dim
    # a dynamic program planning more memory than this (MiB) is lowered again with exact size bounds
    # where interval arithmetic overshot (exact_share), then, while still past it, exported again with
    # every dim max_dim bounds bounded by half as much, down to the largest traced size (halved_max_dim)
    memory_budget_mb: int = 8192
    # extra methods of the program that return a constant (name -> int, float, bool or a list of them):
    # the metadata ExecuTorch's LLM runner reads (get_max_seq_len, use_kv_cache, ...)
    constant_methods: dict[str, Any] | None = None


# ── Stage 1: Backend preparation ─────────────────────────────────────────────
# Move the model to the target device and dtype and pick its partitioners. Add a backend by
# registering ``prepare_for_<name>(model, inputs) -> (model, inputs, partitioners)`` in _BACKEND_PREPARE.


def prepare_for_xnnpack(model: torch.nn.Module, inputs: dict[str, Any]):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    # float32 for the real floating tensors only: Module.to(dtype=torch.float32) also casts complex
    # parameters and buffers to their real part, in place (Llama4's vision freqs_ci lost its imaginary
    # half before tracing); complex ones are rewritten as real pairs later (complex_as_real)
    model = model.to(device="cpu")._apply(lambda t: t.float() if t.is_floating_point() else t)
    inputs = {k: v.to("cpu") if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    return model, inputs, [XnnpackPartitioner()]


def prepare_for_cuda(model: torch.nn.Module, inputs: dict[str, Any]):
    if not torch.cuda.is_available():
        raise RuntimeError(
            "ExecutorchConfig(backend='cuda') needs a CUDA device, and torch.cuda.is_available() is False "
            "on this machine (use backend='xnnpack' for CPU)"
        )
    from executorch.backends.cuda.cuda_partitioner import CudaPartitioner

    model = model.to(device="cuda")
    inputs = {k: v.to("cuda") if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    return model, inputs, [CudaPartitioner([])]


_BACKEND_PREPARE: dict[str, Callable] = {"xnnpack": prepare_for_xnnpack, "cuda": prepare_for_cuda}


def contiguous_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    """The example inputs in the layout the artifact feeds the runtime: contiguous.

    torch.export records each input's strides, and ExecuTorch turns them into the dim order its program
    reads the input's memory in; the artifact always hands the runtime contiguous memory
    (``ExecutorchArtifact._run``), which the program then reads in the traced order. A generation
    component's ``encoder_outputs`` is the encoder's output as generate held it: FSMT's encoder returns
    ``x.transpose(0, 1)`` (fairseq's time-first layout), strides (32, 32*batch, 1), so the prefill was
    planned for dim order (1, 0, 2) and read the contiguous input transposed: its cross-attention keys
    and values 0.28 off, logits 7.7e-4 off, and the encoder_last_hidden_state it passes through 3.5 off
    (test_generate executorch/dynamic FSMTForConditionalGeneration). Eager, dynamo and ONNX Runtime read
    strides, not a traced order, so only this exporter traces contiguous copies.

        before: encoder_outputs__0 (s11, s53, 32) stride (32, 32*s11, 1)
        after:  encoder_outputs__0 (s11, s53, 32) stride (32*s53, 32, 1)"""
    return {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def bound_dynamic_shapes(spec: Any, max_dim: int) -> Any:
    """ExecuTorch plans memory for each dynamic dim's upper bound, and bounds must be known when
    torch.export runs (editing the program's range constraints afterwards does not reach memory
    planning). Give every unbounded ``Dim`` / ``Dim.AUTO`` in an explicit ``dynamic_shapes`` the
    upper bound ``max_dim``; derived dims follow their root.

    before: {"x": {0: Dim("n", min=2)}}    after: {"x": {0: Dim("n", min=2, max=max_dim)}}
    """
    from torch.export import Dim
    from torch.export.dynamic_shapes import _DimHint

    if isinstance(spec, dict):
        return {k: bound_dynamic_shapes(v, max_dim) for k, v in spec.items()}
    if isinstance(spec, (list, tuple)):
        return type(spec)(bound_dynamic_shapes(v, max_dim) for v in spec)
    if type(spec) is Dim and not _finite(spec.max):
        return Dim(spec.__name__, min=spec.min, max=max(max_dim, spec.min))
    if isinstance(spec, _DimHint) and spec.max is None:
        return Dim.AUTO(min=spec.min, max=max_dim) if spec.min is not None else Dim.AUTO(max=max_dim)
    return spec


# ── Stage 2: Torch patches ───────────────────────────────────────────────────
# Replace torch ops the backend rejects while torch.export traces: @register_patch("executorch", "torch.op"),
# installed with the "dynamo" model and torch patches (exporters/workarounds/models/, torch_internals/).


# ── Stage 3: ExecuTorch patches ──────────────────────────────────────────────
# Replace ExecuTorch internals that crash on valid dynamic-shape graphs, installed around the lowering:
# @register_patch("executorch", "executorch.exir...."), paths under _EXECUTORCH_INTERNALS. They live in
# exporters/workarounds/executorch/: exir_passes.py, xnnpack_partitioner.py, partition_legalize.py,
# guards_code_cache.py, memory_planning.py; speed only (skipping work that does not change the program):
# provenance_copy.py, xnnpack_pipeline.py, edge_decompositions.py, edge_passes.py; with the torch
# shape-arithmetic patches (to_edge re-traces).


# ── Stage 4: FX program fixes ────────────────────────────────────────────────
# Fixes that need the whole program: @register_fx_program_fix("executorch"),
# fn(program, *, config) -> (program, modified), in exporters/workarounds/executorch/ (complex_as_real.py).
# (Upper bounds for dynamic dims are set before tracing, in bound_dynamic_shapes: range constraints
# edited after export do not reach memory planning.)


# ── Stage 5: FX node fixes ───────────────────────────────────────────────────
# Rewrite single nodes: @register_fx_node_fix("executorch"), fn(gm, node) -> bool, in
# exporters/workarounds/executorch/: missing_kernels.py (ops the runtime has no kernel for),
# kernel_semantics.py (kernels that differ from ATen), dynamic_sizes.py (sizes the lowering plans wrongly).
# After these, the export loop lowers (exporters/executorch/lowering.py) and retries what LOWERING_RETRIES names.


# ── the exporter ─────────────────────────────────────────────────────────────


def quantized_kernels_registered() -> None:
    """Register the out variants of the quantize / dequantize ops (``quantized_decomposed::*.out``) that
    ExecuTorch's portable quantized kernels implement: a quantized program keeps some of them outside the
    XNNPACK delegate (a per-channel weight's dequantize before an op XNNPACK does not take), and
    ``to_executorch`` refuses a program whose ops have no out variant ("Missing out variants:
    {'quantized_decomposed::dequantize_per_channel'}"). The executorch wheel ships them as a library
    that ``import executorch.kernels.quantized`` loads; it is not loaded by anything else."""
    import executorch.kernels.quantized  # noqa: F401 - loads libquantized_ops_aot_lib

    try:
        torch.ops.quantized_decomposed.dequantize_per_channel.out  # noqa: B018 - resolved lazily, raises if absent
    except (AttributeError, RuntimeError):
        # the package logs and goes on when the library does not load
        raise RuntimeError("executorch.kernels.quantized did not register quantized_decomposed::*.out (its "
                           "libquantized_ops_aot_lib did not load): a quantized program cannot be lowered here") from None


class ExecutorchExporter(GenerationExport, Exporter):
    backend = "executorch"
    config_class = ExecutorchConfig
    # a decode graph traced at one token does not run the prompt here (exporters/generation/empty_past.py traces it at
    # two where it can): to_edge's re-trace meets a contiguity check at the traced one-token size (Eq(32*s70, 32) in a
    # decomposition, tiny LlamaForCausalLM) and narrows that dim to [1, 2], so the program plans no memory for a
    # prompt (PlannedShapeError at 7 tokens)
    decode_traced_at_one_token = ("ExecuTorch's lowering narrows a decode step traced at one token to [1, 2] tokens "
                                  "(a contiguity guard at the traced size), so its memory plan holds no prompt")

    def export(self, model, inputs, config=None):
        config = with_layout_inputs(config or ExecutorchConfig(), model, inputs)  # exporters/specialize.py
        if config.backend not in _BACKEND_PREPARE:
            raise ValueError(f"unknown ExecuTorch backend {config.backend!r}; registered: {sorted(_BACKEND_PREPARE)}")
        fired = FiredLog()
        if config.dynamic_shapes is not None:
            config = dataclasses.replace(config, dynamic_shapes=bound_dynamic_shapes(config.dynamic_shapes, config.max_dim))
        patches, stage0 = split_quantization_patches(self.registry.patches("dynamo", "executorch"))
        torch_patches = [p for p in patches if not p.path.startswith(_EXECUTORCH_INTERNALS)]
        et_patches = [p for p in patches if p.path.startswith(_EXECUTORCH_INTERNALS)]
        et_patches += shape_arithmetic_patches(torch_patches)  # to_edge re-traces the sizes too
        model, quantized = self._quantize(model, inputs, config, quantization_trace(config, torch_patches, fired), fired,
                                          stage0)
        model, inputs, partitioners = _BACKEND_PREPARE[config.backend](model, dict(inputs))
        inputs = contiguous_inputs(inputs)

        def export_and_lower(config):
            traced = run_stage("export", self.backend, lambda: trace(model, inputs, config, torch_patches, fired), fired)
            ordered = [inputs[name] for name in traced.input_names]
            retrace = lambda: trace(model, inputs, config, torch_patches, fired).program  # noqa: E731
            lowered = run_stage("lower", self.backend,
                                lambda: self._lower(traced.program, config, partitioners, et_patches, fired, ordered, retrace),
                                fired)
            return traced, lowered

        traced, lowered, config = lower_within_budget(export_and_lower, config, inputs, fired)
        return self._with_reference(run_stage(
            "run", self.backend,
            lambda: ExecutorchArtifact(lowered.buffer, mutated_inputs=[traced.input_names[i] for i in lowered.mutated],
                                       planned_bytes=lowered.planned_bytes, **traced.artifact_kwargs(fired, config),
                                       extra_metadata={"executorch_backend": config.backend,
                                                       "planned_bytes": lowered.planned_bytes,
                                                       "max_dim": config.max_dim}),
            fired,
        ), quantized)

    def _fixed(self, program, config, fired) -> torch.export.ExportedProgram:
        """Stages 4 and 5: the registry's program fixes, then its node fixes."""
        program = apply_fx_program_fixes(self.registry.fixes("executorch", "program"), program, fired, config=config)
        apply_fx_node_fixes(self.registry.fixes("executorch", "node"), program.graph_module, fired)
        return program

    def _lower(self, program, config, partitioners, et_patches, fired, inputs=(), retrace=None) -> Lowered:
        """Fix and lower ``program``, with the retries of LOWERING_RETRIES; ``retrace()`` exports it
        again, for a retry that needs a program no lowering has touched."""
        program = self._fixed(program, config, fired)
        if config.quantization is not None:
            quantized_kernels_registered()
        context = RetryContext(list(inputs), retrace, lambda p: self._fixed(p, config, fired))
        return lower_with_retries(Attempt(program, partitioners, config.constant_methods), et_patches, fired, context)
