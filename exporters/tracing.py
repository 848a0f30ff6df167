"""torch.export of a model with the exporters' five tracing stages (forward signature, patches, pytrees,
dynamic shapes, state cleanup), shared by every backend; and what the traced program says about its
inputs and outputs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch.export.graph_signature import ConstantArgument, OutputKind, SymBoolArgument, SymFloatArgument, SymIntArgument
from torch.utils import _pytree as pytree

from exporters.base import ExportConfig
from exporters.model_state import _dim_markings, _snapshot_state, reset_model_state, restore_dim_markings
from exporters.pytrees import leaf_names_and_values, register_pytree_nodes
from exporters.specialize import BAKED_MASK_FIX, ConcreteValues, concrete, constant_buffers_baked, specialized_inputs
from exporters.trace_reuse import Kept, active_store, copied, probing, reuse, trace_key
from exporters.utils import FiredLog, PatchEntry, apply_patches


@dataclasses.dataclass
class Traced:
    program: torch.export.ExportedProgram
    input_names: list[str]
    output_names: list[str]
    input_specs: dict[str, tuple[tuple[int, ...], torch.dtype, dict[int, dict]]]
    constants: dict[str, Any]
    guards: Any = None  # callable(*tensors) raising AssertionError("Guard failed: ...")
    module: Any = None  # program.module(), built once (module_with_guards); the dynamo artifact runs it

    def artifact_kwargs(self, fired: FiredLog, config: ExportConfig) -> dict[str, Any]:
        return dict(input_names=self.input_names, output_names=self.output_names, input_specs=self.input_specs,
                    constants=self.constants, fired=fired.names(), config=config, guards=self.guards)



# ── Stage 1: Forward-signature patch ─────────────────────────────────────────
# torch.export packs ``**kwargs`` into one tuple; give ``forward`` a flat signature with exactly the
# tensor inputs, and bake non-tensor inputs (flags, ints) and layout-metadata tensors (ExportConfig.specialize,
# exporters/specialize.py) in as constants. Internal, not an extension point.


@contextlib.contextmanager
def flat_forward_signature(model: torch.nn.Module, tensor_names: list[str], constants: Mapping[str, Any],
                           baked_buffers: list[torch.Tensor] = (), marks: FiredLog | None = None):
    original = model.__dict__.get("forward")
    given_name = dict(zip(parameter_names(tensor_names), tensor_names))

    def forward(*args, **kwargs):
        kwargs = {given_name.get(k, k): v for k, v in kwargs.items()}
        kwargs.update(zip(tensor_names, args))
        # baked tensor inputs go in as real copies whose values stay concrete (exporters/specialize.py)
        baked = {k: concrete(v) if isinstance(v, torch.Tensor) else v for k, v in constants.items()}
        tensors = [v for v in baked.values() if isinstance(v, torch.Tensor)] + list(baked_buffers)
        # the class's forward looked up now, not when the wrapper was made: a patch on the model's own
        # class (ReformerModel.forward) is installed after this wrapper and must apply to the top call too
        bound_forward = original if original is not None else type(model).forward.__get__(model, type(model))
        mode = ConcreteValues(tensors) if tensors else None
        with mode if mode is not None else contextlib.nullcontext():
            result = in_field_order(bound_forward(**kwargs, **baked))
        if mode is not None and mode.masks_as_indices and marks is not None:
            marks.add(BAKED_MASK_FIX)
        return result

    forward.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in parameter_names(tensor_names)]
    )
    model.forward = forward
    try:
        yield
    finally:
        if original is None:
            del model.forward
        else:
            model.forward = original



def parameter_names(names: list[str]) -> list[str]:
    """The flat signature's parameter name for each input name: the name itself where it is an identifier;
    otherwise (an input named as a runtime names it, ``past_key_values.0.key``) its non-word characters as
    ``_``, made unique. The inputs keep their own names everywhere else (the artifact's input_names, the
    ONNX graph's inputs); only torch.export binds by these."""
    import keyword
    import re

    out: list[str] = []
    for name in names:
        safe = name if name.isidentifier() and not keyword.iskeyword(name) else re.sub(r"\W", "_", name)
        if not safe.isidentifier() or keyword.iskeyword(safe):
            safe = f"_{safe}"
        while safe in out or (safe != name and safe in names):
            safe = f"{safe}_"
        out.append(safe)
    return out


def in_field_order(out: Any) -> Any:
    """``out`` with a ModelOutput's keys in its dataclass's field order. A field set after construction
    (LlavaOnevision's ``pooler_output``) comes last in the keys; the traced program lists its outputs in
    key order, but anything that rebuilds the ModelOutput from the program's output spec (the dynamo
    module, torch.onnx) sets them in field order, and would list its leaves in another order than the
    program's flat outputs. One order for all: rebuilt here, values unchanged."""
    try:
        from transformers.utils import ModelOutput
    except ImportError:  # pragma: no cover - transformers is a dependency
        return out
    if not isinstance(out, ModelOutput):
        return out
    keys = list(out.keys())
    order = [f.name for f in dataclasses.fields(out) if f.name in keys]
    if keys == order or sorted(keys) != sorted(order):
        return out
    rebuilt = type(out)(**{k: out[k] for k in order})
    return rebuilt if list(rebuilt.keys()) == order else out


SHAPE_ARITHMETIC_PATHS = ("sympy.", "torch.fx.experimental.symbolic_shapes.", "torch.utils._sympy.")


def shape_arithmetic_patches(patches: list[PatchEntry]) -> list[PatchEntry]:
    return [p for p in patches if p.path.startswith(SHAPE_ARITHMETIC_PATHS)]


# ── Stage 4: Dynamic shapes ──────────────────────────────────────────────────
# With dynamic=True every tensor dim gets Dim.AUTO (torch keeps static what the model pins down),
# bounded above by config.max_dim (or the traced size if larger). DynamoConfig.dynamic_shapes overrides.
# Size 1: torch specializes a dim it sees at 0 or 1 and gives a dim traced at >= 2 the lower bound 2,
# so a dynamic artifact would refuse a batch of one and a one-token decode step. With
# config.accept_size_one (the default) every Dim.AUTO has min=1 and the export runs under torch's
# backed_size_oblivious: a size is not compared with 1 unless the model's code asks, and where it
# asks (``if seq_len == 1``) the comparison becomes a guard and the bound stays 2, a refusal that
# names it. The sweep draws size 1 for every dynamic dim (sweeps/shapes.py), so a dim that refuses 1
# shows in the report.


def auto_dynamic_shapes(inputs: Mapping[str, torch.Tensor], max_dim: int, min_dim: int = 2) -> dict[str, Any]:
    from torch.export import Dim

    # a dim traced at 0 stays static under min=1 (size-one mode): its own range would not hold it, and the
    # symbol it got instead of torch's 0 could not match a size 0 the model's weights give (a latent-attention
    # cache whose rope part is empty in a tiny config: cat asked s83 == 0, Glm5Next and MistralLarge4)
    return {
        name: {d: None if size < min_dim and min_dim < 2 else
               Dim.AUTO(min=min_dim, max=max(max_dim, size)) if min_dim < 2 else Dim.AUTO(max=max(max_dim, size))
               for d, size in enumerate(t.shape)}
        for name, t in inputs.items()
    }


def with_empty_dims(shapes: dict[str, Any], tensors: Mapping[str, torch.Tensor], config: ExportConfig) -> dict[str, Any]:
    """``shapes`` with each of ``config.may_be_empty`` allowed down to 0; a pair naming no tensor input or no dim
    of it is refused by name."""
    from torch.export import Dim

    for name, dim in config.may_be_empty:
        if name not in tensors or not 0 <= dim < tensors[name].dim():
            raise ValueError(f"ExportConfig.may_be_empty names ({name!r}, {dim}), which is not a dim of a tensor input; "
                             f"inputs: { {k: tuple(v.shape) for k, v in tensors.items()} }")
        shapes[name][dim] = Dim.AUTO(min=0, max=max(config.max_dim, tensors[name].shape[dim]))
    return shapes


def size_one_mode(config: ExportConfig):
    """The context that lets dynamic dims take 1 (see above); a no-op for static exports."""
    if not (config.accept_size_one and (config.dynamic or config.dynamic_shapes is not None)):
        return contextlib.nullcontext()
    from torch.fx.experimental import _config as fx_config

    return fx_config.patch(backed_size_oblivious=True)



# ── tracing: the five stages, shared by every exporter ───────────────────────


def _finite(bound) -> bool:
    """sympy bounds: torch's ``int_oo`` says ``is_finite`` but is not."""
    from torch.utils._sympy.numbers import int_oo

    if isinstance(bound, int):
        return True
    return bool(bound.is_finite) and bound != int_oo and bound != -int_oo


def _dims_of(program: torch.export.ExportedProgram, value: Any) -> dict[int, dict]:
    dims = {}
    for d, size in enumerate(value.shape):
        if isinstance(size, torch.SymInt):
            expr = size.node.expr
            if expr.is_number:  # specialized while tracing: static in the artifact
                continue
            vr = program.range_constraints.get(expr)
            lower = int(vr.lower) if vr is not None and _finite(vr.lower) else 0
            upper = int(vr.upper) if vr is not None and _finite(vr.upper) else None
            dims[d] = {"symbol": str(expr), "min": lower, "max": upper}
    return dims


_SYMBOLIC = (SymIntArgument, SymFloatArgument, SymBoolArgument)


def output_names_of(program: torch.export.ExportedProgram) -> list[str]:
    """Names of the tensor outputs, in the program's flat order, using the eager naming."""
    out_spec = program.call_spec.out_spec
    # an output leaf the program returns as a constant (an int, a None, a bool) or as a symbolic int of
    # the input sizes is not a tensor output: it is not named (MaskFormerSwin returns its spatial sizes
    # next to its tensors: constants in a static export, SymInts in a dynamic one)
    user = [o.arg for o in program.graph_signature.output_specs if o.kind == OutputKind.USER_OUTPUT]
    if len(user) == out_spec.num_leaves:
        placeholders = [
            a.value if isinstance(a, ConstantArgument) else 0 if isinstance(a, _SYMBOLIC) else torch.empty(0)
            for a in user
        ]
    else:
        placeholders = [torch.empty(0) for _ in range(out_spec.num_leaves)]
    tree = pytree.tree_unflatten(placeholders, out_spec)
    # named by identity, listed in the program's order: rebuilding a ModelOutput sets its fields in the
    # dataclass's order, which is not always the order its keys were set in (a field assigned after
    # construction: LlavaOnevision's pooler_output), so re-flattening may list the leaves in another order
    names = {id(v): name for name, v in leaf_names_and_values(tree) if isinstance(v, torch.Tensor)}
    return [names[id(p)] for p in placeholders if isinstance(p, torch.Tensor) and id(p) in names]


def drop_constant_outputs(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """Return only the tensor outputs. A forward that returns ints, bools or strings beside its tensors
    (MaskFormerSwin's spatial sizes, PeAudio's lengths) leaves them in the program as constant
    outputs, which neither the ONNX translator ("'int' object has no attribute 'name'") nor ExecuTorch
    ("Could not infer dtype of NoneType") takes; they are fixed by the trace anyway, and the artifact
    names only tensor outputs (``output_names_of`` is read before this). A symbolic int output (the same
    sizes in a dynamic export) goes too: eager's outputs are compared on their tensors only, and the
    runtime would return it as a scalar tensor the artifact does not name. The program's output then is
    the flat list of its tensor outputs."""
    specs = list(program.graph_signature.output_specs)
    drop = {
        i for i, o in enumerate(specs)
        if o.kind == OutputKind.USER_OUTPUT and isinstance(o.arg, (ConstantArgument, *_SYMBOLIC))
    }
    if not drop:
        return program
    output = next(n for n in program.graph.nodes if n.op == "output")
    values = list(output.args[0])
    output.args = (tuple(v for i, v in enumerate(values) if i not in drop),)
    program.graph_module.recompile()
    program.graph_signature.output_specs[:] = [o for i, o in enumerate(specs) if i not in drop]
    n_user = sum(1 for o in program.graph_signature.output_specs if o.kind == OutputKind.USER_OUTPUT)
    program.module_call_graph[0].signature.out_spec = pytree.tree_structure(list(range(n_user)))
    return program


def module_with_guards(program: torch.export.ExportedProgram) -> torch.nn.Module:
    """``program.module()``, with the guard function torch.export builds from the shape conditions it
    recorded (``s0 // 8 != 1``...) as its ``_guards_fn``. ``ExportedProgram.module()`` skips building it
    when any frame on the call stack comes from a file whose path contains "executorch"
    (``torch.export._unlift._ok_to_generate_guards_fn``), so called from ``exporter_executorch.py`` it
    silently returned no guards and the ExecuTorch artifact ran shapes the program was not exported
    for. Ask for the guards with that stack check off. The dynamo artifact runs this same module:
    unlifting the program is a recompile, done once per export, not once for the guards and again
    for the artifact."""
    from unittest import mock

    from torch.export import _unlift

    if getattr(_unlift, "_ok_to_generate_guards_fn", None) is None:  # no stack check: nothing to switch off
        return program.module()
    with mock.patch.object(_unlift, "_ok_to_generate_guards_fn", lambda: True):
        return program.module()


def trace(
    model: torch.nn.Module,
    inputs: Mapping[str, Any],
    config: ExportConfig,
    patches: list[PatchEntry],
    fired: FiredLog,
    build_module: bool = True,
    lowers: bool = True,
) -> Traced:
    """Stages 1-5: torch.export ``model(**inputs)`` with ``patches`` installed. With dynamic dims, the
    program's module and its guard function are built here (``build_module``), before a backend's fixes
    change the graph; the dynamo artifact builds them itself when first called (``DynamoArtifact``).
    ``lowers``: the caller lowers the program (re-traces it in its ShapeEnv); inside ``shared_traces()``
    only a trace for a caller that does not is kept for later exports (exporters/trace_reuse.py)."""
    baked = set(specialized_inputs(inputs, config.specialize))
    tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor) and k not in baked}
    constants = {k: v for k, v in inputs.items() if not isinstance(v, torch.Tensor) or k in baked}
    names = list(tensors)
    register_pytree_nodes()
    if config.dynamic_shapes is not None:
        dynamic_shapes = config.dynamic_shapes
    elif config.dynamic:
        dynamic_shapes = auto_dynamic_shapes(tensors, config.max_dim, 1 if config.accept_size_one else 2)
        dynamic_shapes = with_empty_dims(dynamic_shapes, tensors, config)
    else:
        dynamic_shapes = None
    store = active_store()
    key = trace_key(model, tensors, constants, dynamic_shapes, config) if store is not None else None
    kept = store.lookup(model, key, patches, lowers) if key is not None else None
    if kept is not None:
        return _with_module(reuse(kept, fired), build_module)
    keeping = key is not None and not lowers  # only a trace no lowering will re-trace is kept (trace_reuse)
    marks = FiredLog()  # this trace's own marks, kept with it
    state = _snapshot_state(model)
    markings = _dim_markings(tensors)
    try:
        bound = dict(zip(names, parameter_names(names)))  # torch.export binds by identifiers
        with constant_buffers_baked(model) as baked_buffers, \
                flat_forward_signature(model, names, constants, baked_buffers, marks), apply_patches(patches, marks), \
                probing(store, patches) if keeping else contextlib.nullcontext() as probes, \
                size_one_mode(config):
            program = torch.export.export(
                model, args=(), kwargs={bound[k]: v for k, v in tensors.items()}, strict=config.strict,
                dynamic_shapes={bound.get(k, k): v for k, v in dynamic_shapes.items()}
                if isinstance(dynamic_shapes, dict) else dynamic_shapes,
            )
    finally:
        fired.extend(marks.names())
        reset_model_state(model, state)
        restore_dim_markings(tensors, markings)
    user_inputs = [
        spec.arg.name for spec in program.graph_signature.input_specs if spec.kind.name == "USER_INPUT"
    ]
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    specs = {}
    for name, ph_name in zip(names, user_inputs):
        val = placeholders[ph_name].meta["val"]
        specs[name] = (tuple(tensors[name].shape), tensors[name].dtype, _dims_of(program, val))
    output_names = output_names_of(program)
    program = drop_constant_outputs(program)
    traced = Traced(program, names, output_names, specs, constants)
    if keeping:
        store.keep(Kept(model, key, traced, frozenset(p.name for p in patches),
                        tuple(marks.names()), probes.probed, probes.reached))
        traced = copied(traced)  # the kept one stays unedited
    return _with_module(traced, build_module)


def _with_module(traced: Traced, build_module: bool) -> Traced:
    """The guards live on program.module(): build it only when there are dynamic dims to guard (the
    ONNX and ExecuTorch exporters need no module otherwise); the dynamo artifact reuses it."""
    if build_module and any(d for _, _, d in traced.input_specs.values()):
        traced.module = module_with_guards(traced.program)
        traced.guards = getattr(traced.module, "_guards_fn", None)
    return traced


def quantization_trace(config: ExportConfig, patches: list[PatchEntry], fired: FiredLog):
    """Stage 0's trace (``Exporter._quantize``): ``trace`` with the backend's patches, the config's shapes
    and no recipe; returns the program PT2E prepares and its tensor inputs' names."""
    plain = dataclasses.replace(config, quantization=None)

    def trace_program(model: torch.nn.Module, inputs: Mapping[str, Any]):
        traced = trace(model, inputs, plain, patches, fired)
        return traced.program, traced.input_names

    return trace_program
