"""DynamoExporter: torch.export of a transformers model, in five stages.

The ONNX and ExecuTorch exporters start with the same stages (``exporters.tracing.trace``), adding
their own backend's torch patches to stage 2, so a model patch registered for "dynamo" helps all
three. Each stage block below says what the stage applies and where its entries live.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch.utils import _pytree as pytree

from .base import Artifact, ExportConfig, Exporter, run_stage
from .generation import GenerationExport
from .model_state import _STATEFUL_CACHE_ATTRS
from .pytrees import _flatten_to_context, _unflatten_from_context, flatten_outputs
from .specialize import with_layout_inputs
from .tracing import parameter_names, quantization_trace, trace
from .utils import FiredLog, split_quantization_patches

__all__ = ["DynamoArtifact", "DynamoConfig", "DynamoExporter", "_STATEFUL_CACHE_ATTRS", "_flatten_to_context",
           "_unflatten_from_context"]


@dataclasses.dataclass
class DynamoConfig(ExportConfig):
    pass


# ── Stage 1: Forward-signature patch ─────────────────────────────────────────
# torch.export packs ``**kwargs`` into one tuple; ``flat_forward_signature`` (exporters/tracing.py)
# gives ``forward`` a flat signature with exactly the tensor inputs, and bakes non-tensor inputs
# (flags, ints) and layout-metadata tensors (ExportConfig.specialize, exporters/specialize.py) in as
# constants. Internal, not an extension point.


# ── Stage 2: Model patches ───────────────────────────────────────────────────
# Swap untraceable model methods for export-safe ones while tracing: @register_patch("dynamo", ...),
# installed from ``self.registry.patches("dynamo")``. They live in
#   exporters/workarounds/models/           transformers model code, one file per model family;
#   exporters/workarounds/torch_internals/  torch internals (symbolic shapes, sympy, decompositions).
# Both folders are loaded by the registry itself (exporters/utils.py: WORKAROUND_PACKAGES).


# ── Stage 3: Pytree registration ─────────────────────────────────────────────
# Every Cache (and cache layer) is flattened by attribute traversal (exporters/pytrees.py): tensors
# become leaves, everything else goes into the context. Objects found in outputs that hold tensors but
# that pytree does not know are registered the same way. For a type attribute traversal cannot reach,
# add a branch in ``_flatten_to_context`` / ``_unflatten_from_context`` there.


# ── Stage 4: Dynamic shapes ──────────────────────────────────────────────────
# With dynamic=True every tensor dim gets Dim.AUTO (``auto_dynamic_shapes``, exporters/tracing.py),
# bounded above by config.max_dim (or the traced size if larger). DynamoConfig.dynamic_shapes overrides.


# ── Stage 5: State cleanup ───────────────────────────────────────────────────
# Attributes a model sets in forward survive tracing as fake tensors or symbols and break the next eager
# call or export. ``reset_model_state`` (exporters/model_state.py) restores, after export, every public
# attribute the forward replaced and every private one named in ``_STATEFUL_CACHE_ATTRS``, and drops
# new ones holding fake tensors or symbols.


# ── the exporter ─────────────────────────────────────────────────────────────


class DynamoArtifact(Artifact):
    backend = "dynamo"
    file_name = "model.pt2"

    def __init__(self, program: torch.export.ExportedProgram, module: torch.nn.Module | None = None, **kwargs):
        super().__init__(**kwargs)
        self.program = program
        self._module = module

    @property
    def module(self) -> torch.nn.Module:
        """The program as a module (``module_with_guards``), built at the first call, not at export:
        unlifting is a recompile, about a tenth of a tiny model's trace, that an export which is only
        saved never needs. Its guard function becomes the artifact's."""
        if self._module is None:
            from exporters.tracing import module_with_guards

            self._module = module_with_guards(self.program)
        return self._module

    @property
    def guards(self):
        """The traced program's guard function: the module's, built on first use when there are dynamic dims."""
        if self._guards is None and self.dynamic_dims:
            self._guards = getattr(self.module, "_guards_fn", None)
        return self._guards

    @guards.setter
    def guards(self, value) -> None:
        self._guards = value

    @functools.cached_property
    def _bound_names(self) -> list[str]:
        """The names the program's module binds its inputs by (``tracing.parameter_names``), worked out once."""
        return parameter_names(self.input_names)

    def _run(self, ordered):
        # inference, as in the other runtimes: a loaded program's buffers may be updated in place (a static
        # cache), which autograd refuses on views of its leaves
        with torch.no_grad():
            out = self.module(**dict(zip(self._bound_names, ordered)))
        # by name, in the program's order (output_names): the module rebuilds a ModelOutput with its fields
        # in the dataclass's order, which re-flattening would follow instead
        named = flatten_outputs(out)
        if all(n in named for n in self.output_names):
            return [named[n] for n in self.output_names]
        return [v for v in pytree.tree_leaves(out) if isinstance(v, torch.Tensor)]

    def _save_model(self, path):
        torch.export.save(self.program, path)


class DynamoExporter(GenerationExport, Exporter):
    backend = "dynamo"
    config_class = DynamoConfig

    def export(self, model, inputs, config=None):
        config = with_layout_inputs(config or DynamoConfig(), model, inputs)  # exporters/specialize.py
        fired = FiredLog()
        patches, stage0 = split_quantization_patches(self.registry.patches("dynamo"))
        model, quantized = self._quantize(model, inputs, config, quantization_trace(config, patches, fired), fired, stage0)
        traced = run_stage("export", self.backend,  # nothing lowers this program: inside shared_traces() it is kept
                           lambda: trace(model, inputs, config, patches, fired, build_module=False, lowers=False), fired)
        return self._with_reference(DynamoArtifact(traced.program, traced.module, **traced.artifact_kwargs(fired, config)),
                                    quantized)
