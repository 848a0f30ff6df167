"""ExecutorchExporter: torch.export, lowered with to_edge_transform_and_lower + to_executorch,
run in the ExecuTorch runtime. Five stages around the lowering."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch

from .base import Artifact, ExportConfig, Exporter, run_stage
from .exporter_dynamo import _finite, trace
from .utils import FiredLog, apply_fx_node_fixes, apply_fx_program_fixes, apply_patches, register_fx_node_fix

# "executorch" patches on these paths are ExecuTorch patches (stage 3, installed around lowering);
# the others are torch patches (stage 2, installed around torch.export).
_EXECUTORCH_INTERNALS = ("executorch.",)


@dataclasses.dataclass
class ExecutorchConfig(ExportConfig):
    backend: str = "xnnpack"  # a key of _BACKEND_PREPARE
    max_dim: int = 64  # ExecuTorch plans memory for the upper bound of every dynamic dim


# ── Stage 1: Backend preparation ─────────────────────────────────────────────
# Move the model to the target device and dtype and pick its partitioners. Add a backend by
# registering ``prepare_for_<name>(model, inputs) -> (model, inputs, partitioners)`` in _BACKEND_PREPARE.


def prepare_for_xnnpack(model: torch.nn.Module, inputs: dict[str, Any]):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    model = model.to(device="cpu", dtype=torch.float32)
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
# Replace torch ops the backend rejects while torch.export traces: @register_patch("executorch", "torch.op").


# ── Stage 3: ExecuTorch patches ──────────────────────────────────────────────
# Replace ExecuTorch internals that crash on valid dynamic-shape graphs, installed around the
# lowering: @register_patch("executorch", "executorch.exir....").


# ── Stage 4: FX program fixes ────────────────────────────────────────────────
# Fixes that need the whole program: @register_fx_program_fix("executorch"),
# fn(program, *, config) -> (program, modified). (Upper bounds for dynamic dims are set before
# tracing, in bound_dynamic_shapes: range constraints edited after export do not reach memory planning.)


# ── Stage 5: FX node fixes ───────────────────────────────────────────────────
# Rewrite single nodes: @register_fx_node_fix("executorch"), fn(gm, node) -> bool.


@register_fx_node_fix("executorch")
def _fix_gelu_tanh_explicit(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """XNNPACK lowers ``gelu(x, approximate="tanh")`` as the exact erf GELU: the outputs differ from
    eager by up to ~5e-4 (SigLIP, GPT-2-style activations). Spell the tanh form out in ops XNNPACK
    computes as written.

    before: gelu(x, approximate="tanh")
    after:  0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x * x * x)))
    """
    if node.op != "call_function" or node.target is not torch.ops.aten.gelu.default:
        return False
    approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
    if approximate != "tanh":
        return False
    aten = torch.ops.aten
    x = node.args[0]
    with gm.graph.inserting_before(node):
        cube = gm.graph.call_function(aten.mul.Tensor, (gm.graph.call_function(aten.mul.Tensor, (x, x)), x))
        inner = gm.graph.call_function(aten.add.Tensor, (x, gm.graph.call_function(aten.mul.Tensor, (cube, 0.044715))))
        scaled = gm.graph.call_function(aten.mul.Tensor, (inner, math.sqrt(2.0 / math.pi)))
        one_plus = gm.graph.call_function(aten.add.Tensor, (gm.graph.call_function(aten.tanh.default, (scaled,)), 1.0))
        out = gm.graph.call_function(aten.mul.Tensor, (gm.graph.call_function(aten.mul.Tensor, (x, 0.5)), one_plus))
    for new in (cube, inner, scaled, one_plus, out):
        new.meta.update({k: v for k, v in node.meta.items() if k in ("stack_trace", "nn_module_stack", "source_fn_stack")})
    out.meta["val"] = node.meta.get("val")
    node.replace_all_uses_with(out)
    gm.graph.erase_node(node)
    return True


# ── the exporter ─────────────────────────────────────────────────────────────


class ExecutorchArtifact(Artifact):
    backend = "executorch"
    file_name = "model.pte"

    def __init__(self, buffer: bytes, **kwargs):
        super().__init__(**kwargs)
        from executorch.runtime import Runtime, Verification

        self.buffer = buffer
        self._program = Runtime.get().load_program(buffer, verification=Verification.Minimal)
        self._method = self._program.load_method("forward")

    def _run(self, ordered):
        outputs = self._method.execute([t.contiguous() for t in ordered])
        return [o if isinstance(o, torch.Tensor) else torch.as_tensor(o) for o in outputs]

    def _save_model(self, path):
        with open(path, "wb") as f:
            f.write(self.buffer)


class ExecutorchExporter(Exporter):
    backend = "executorch"
    config_class = ExecutorchConfig

    def export(self, model, inputs, config=None):
        config = config or ExecutorchConfig()
        if config.backend not in _BACKEND_PREPARE:
            raise ValueError(f"unknown ExecuTorch backend {config.backend!r}; registered: {sorted(_BACKEND_PREPARE)}")
        fired = FiredLog()
        model, inputs, partitioners = _BACKEND_PREPARE[config.backend](model, dict(inputs))
        if config.dynamic_shapes is not None:
            config = dataclasses.replace(config, dynamic_shapes=bound_dynamic_shapes(config.dynamic_shapes, config.max_dim))
        patches = self.registry.patches("dynamo", "executorch")
        torch_patches = [p for p in patches if not p.path.startswith(_EXECUTORCH_INTERNALS)]
        et_patches = [p for p in patches if p.path.startswith(_EXECUTORCH_INTERNALS)]
        traced = run_stage("export", self.backend, lambda: trace(model, inputs, config, torch_patches, fired), fired)
        buffer = run_stage("lower", self.backend, lambda: self._lower(traced.program, config, partitioners, et_patches, fired), fired)
        return run_stage(
            "run", self.backend,
            lambda: ExecutorchArtifact(buffer, **traced.artifact_kwargs(fired, config), extra_metadata={"executorch_backend": config.backend}),
            fired,
        )

    def _lower(self, program, config, partitioners, et_patches, fired) -> bytes:
        from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

        program = apply_fx_program_fixes(self.registry.fixes("executorch", "program"), program, fired, config=config)
        apply_fx_node_fixes(self.registry.fixes("executorch", "node"), program.graph_module, fired)
        with apply_patches(et_patches, fired):
            edge = to_edge_transform_and_lower(
                program, partitioner=partitioners, compile_config=EdgeCompileConfig(_check_ir_validity=False)
            )
            return edge.to_executorch().buffer
