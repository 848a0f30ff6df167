"""OnnxExporter: torch.export, then torch.onnx (onnxscript), run in ONNX Runtime. Five stages.

Every workaround of this backend is a top-level ``_patch_*``, ``_fix_*`` or ``_aten_*`` function in
exporters/workarounds/onnx/ (the torch patches it shares with the other backends are in the models and
torch_internals folders beside it):
    grep -rnE "^def (_patch_|_fix_|_aten_)" exporters/workarounds/onnx/
"""

from __future__ import annotations

import dataclasses

import torch

from .base import Artifact, ExportConfig, Exporter, run_stage
from .generation import GenerationExport
from .specialize import with_layout_inputs
from .tracing import quantization_trace, shape_arithmetic_patches, trace
from .utils import FiredLog, apply_fx_node_fixes, apply_patches, split_quantization_patches
from .workarounds.onnx.ir_fixes import _IR_FIXES
from .workarounds.onnx.refix_after_decompositions import _CURRENT
from .workarounds.onnx.translations import _ONNX_COMPLEX_TRANSLATION_TABLE, _ONNX_TRANSLATION_TABLE

__all__ = ["OnnxArtifact", "OnnxConfig", "OnnxExporter", "_IR_FIXES", "_ONNX_COMPLEX_TRANSLATION_TABLE",
           "_ONNX_INTERNALS", "_ONNX_TRANSLATION_TABLE", "onnx_output_names"]

# Paths under these prefixes are ONNX patches (stage 2, installed around torch.onnx.export);
# every other "onnx" patch is a torch patch (stage 1, installed around torch.export).
_ONNX_INTERNALS = ("torch.onnx.", "onnxscript.", "onnx_ir.", "onnx.")


@dataclasses.dataclass
class OnnxConfig(ExportConfig):
    optimize: bool = True  # run the onnxscript optimizer (ONNX_DISABLE_OPTIMIZE turns it off per model)
    opset: int | None = None  # None: torch.onnx's default opset
    intra_op_threads: int = 1  # ONNX Runtime threads per session; the sweep parallelises across processes


# ── Stage 1: Torch patches ───────────────────────────────────────────────────
# Replace torch ops the ONNX exporter cannot convert, while torch.export traces:
# @register_patch("onnx", "torch.some_op"); the factory gets the real operator. They live in
# exporters/workarounds/onnx/ (adaptive_pool.py), installed with the "dynamo" model and torch patches.


# ── Stage 2: ONNX patches ────────────────────────────────────────────────────
# Patches on torch.onnx and onnxscript internals (paths under _ONNX_INTERNALS), installed around
# torch.onnx.export, with the torch shape-arithmetic patches (torch.onnx re-traces the sizes).
# exporters/workarounds/onnx/: refix_after_decompositions.py re-runs the FX node fixes after torch.onnx's
# own run_decompositions, so that nodes the decomposition introduces (shape guards, alias ops) are
# fixed before lowering; onnxscript_optimizer.py patches the optimizer's rewrite rules and folding.


# ── Stage 3: FX node fixes ───────────────────────────────────────────────────
# Rewrite nodes the ONNX exporter cannot lower: @register_fx_node_fix("onnx"), fn(gm, node) -> bool,
# in exporters/workarounds/onnx/node_fixes.py.


# ── Stage 4: ONNX translations ───────────────────────────────────────────────
# Custom lowerings for aten ops whose default translation is missing or wrong: write an ``_aten_*``
# onnxscript function and add it to _ONNX_TRANSLATION_TABLE, keyed by the aten overload
# (exporters/workarounds/onnx/translations.py).


# ── Stage 5: ONNX IR fixes ───────────────────────────────────────────────────
# Rewrite the finished ONNX program around ONNX Runtime bugs: add a ``_fix_ir_*(model) -> bool``
# to _IR_FIXES (exporters/workarounds/onnx/ir_fixes.py). Each returns whether it changed the model.


# ── the exporter ─────────────────────────────────────────────────────────────

def onnx_output_names(input_names: list[str], output_names: list[str]) -> list[str]:
    """The graph's output names: ``output_names``, except that one equal to an input name (Gemma 3n's
    audio encoder returns its subsampled ``audio_mel_mask``) becomes ``output.<name>``, since an ONNX
    graph defines each name once ("Duplicate definition of name" at session load). The artifact still
    returns it under the model's name: outputs are read by position."""
    taken = set(input_names)
    names = []
    for name in output_names:
        new = name if name not in taken else f"output.{name}"
        while new in taken:
            new = f"output.{new}"
        taken.add(new)
        names.append(new)
    return names


class OnnxArtifact(Artifact):
    backend = "onnx"
    file_name = "model.onnx"

    def __init__(self, onnx_program, **kwargs):
        super().__init__(**kwargs)
        import onnxruntime as ort

        self.onnx_program = onnx_program
        self.model_proto = onnx_program.model_proto
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.config.intra_op_threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            self.model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        self._onnx_inputs = [i.name for i in self.session.get_inputs()]
        self._onnx_outputs = [o.name for o in self.session.get_outputs()]  # in output_names' order
        self._narrow_to_onnx_shapes()

    def _narrow_to_onnx_shapes(self) -> None:
        """Where the ONNX graph fixed a dim that the ExportedProgram left symbolic, the artifact is
        static in that dim: say so in its specs, so a caller gets an InputError, not an ORT error code."""
        for onnx_input in self.session.get_inputs():
            spec = self.input_specs.get(onnx_input.name)
            if spec is None:
                continue
            shape, dtype, dims = spec
            fixed = {d for d, size in enumerate(onnx_input.shape) if isinstance(size, int)}
            if fixed & set(dims):
                self.input_specs[onnx_input.name] = (shape, dtype, {d: v for d, v in dims.items() if d not in fixed})

    def _run(self, ordered):
        feed = {name: t.detach().cpu().numpy() for name, t in zip(self.input_names, ordered) if name in self._onnx_inputs}
        outputs = self.session.run(self._onnx_outputs, feed)
        return [torch.from_numpy(o) for o in outputs]

    def _save_model(self, path):
        import onnx

        onnx.save(self.model_proto, path)


class OnnxExporter(GenerationExport, Exporter):
    backend = "onnx"
    config_class = OnnxConfig

    def export(self, model, inputs, config=None):
        config = with_layout_inputs(config or OnnxConfig(), model, inputs)  # exporters/specialize.py
        fired = FiredLog()
        every, stage0 = split_quantization_patches(self.registry.patches("dynamo", "onnx"))
        torch_patches = [p for p in every if not p.path.startswith(_ONNX_INTERNALS)]
        onnx_patches = [p for p in self.registry.patches("onnx") if p.path.startswith(_ONNX_INTERNALS)]
        onnx_patches += shape_arithmetic_patches(torch_patches)  # torch.onnx re-traces the sizes too
        model, quantized = self._quantize(model, inputs, config, quantization_trace(config, torch_patches, fired), fired,
                                          stage0)
        traced = run_stage("export", self.backend, lambda: trace(model, inputs, config, torch_patches, fired), fired)
        program = traced.program
        onnx_program = run_stage(
            "lower", self.backend, lambda: self._to_onnx(program, traced, config, onnx_patches, fired), fired
        )
        return self._with_reference(run_stage(
            "run", self.backend,
            lambda: OnnxArtifact(onnx_program, **traced.artifact_kwargs(fired, config), extra_metadata={"optimize": config.optimize}),
            fired,
        ), quantized)

    def _to_onnx(self, program, traced, config, onnx_patches, fired):
        apply_fx_node_fixes(self.registry.fixes("onnx", "node"), program.graph_module, fired)
        _CURRENT.update(registry=self.registry, fired=fired)
        try:
            with apply_patches(onnx_patches, fired):
                onnx_program = torch.onnx.export(
                    program,
                    kwargs={},
                    dynamo=True,
                    input_names=traced.input_names,
                    output_names=onnx_output_names(traced.input_names, traced.output_names),
                    custom_translation_table=dict(_ONNX_TRANSLATION_TABLE),
                    optimize=config.optimize,
                    opset_version=config.opset,
                    verbose=False,
                )
        finally:
            _CURRENT.clear()
        for fix in _IR_FIXES:
            if fix(onnx_program.model):
                fired.add(f"fix:onnx:{fix.__name__}")
        return onnx_program

