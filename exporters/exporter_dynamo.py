"""DynamoExporter: torch.export of a transformers model, in five stages.

The ONNX and ExecuTorch exporters start with the same stages (``trace``), adding their own
backend's torch patches to stage 2, so a model patch registered for "dynamo" helps all three.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import inspect
import itertools
import pickle
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch.export.graph_signature import (
    ConstantArgument,
    OutputKind,
    SymBoolArgument,
    SymFloatArgument,
    SymIntArgument,
)
from torch.utils import _pytree as pytree

from .base import Artifact, ExportConfig, Exporter, run_stage
from .specialize import ConcreteValues, concrete, constant_buffers_baked, specialized_inputs
from .utils import FiredLog, PatchEntry, apply_patches, leaf_names_and_values, register_patch


@dataclasses.dataclass
class DynamoConfig(ExportConfig):
    pass


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
                           baked_buffers: list[torch.Tensor] = ()):
    original = model.__dict__.get("forward")

    def forward(*args, **kwargs):
        kwargs.update(zip(tensor_names, args))
        # baked tensor inputs go in as real copies whose values stay concrete (exporters/specialize.py)
        baked = {k: concrete(v) if isinstance(v, torch.Tensor) else v for k, v in constants.items()}
        tensors = [v for v in baked.values() if isinstance(v, torch.Tensor)] + list(baked_buffers)
        # the class's forward looked up now, not when the wrapper was made: a patch on the model's own
        # class (ReformerModel.forward) is installed after this wrapper and must apply to the top call too
        bound_forward = original if original is not None else type(model).forward.__get__(model, type(model))
        with ConcreteValues(tensors) if tensors else contextlib.nullcontext():
            return bound_forward(**kwargs, **baked)

    forward.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in tensor_names]
    )
    model.forward = forward
    try:
        yield
    finally:
        if original is None:
            del model.forward
        else:
            model.forward = original


# ── Stage 2: Model patches ───────────────────────────────────────────────────
# Swap untraceable model methods for export-safe ones while tracing: @register_patch("dynamo", ...).


@register_patch("dynamo", "transformers.models.nllb_moe.modeling_nllb_moe.NllbMoeTop2Router._cast_classifier")
def _patch_classifier_cast(_original):
    """NLLB-MoE's router casts its classifier weights to another dtype, which torch.export cannot
    trace; replace the cast with a no-op during export (the tiny models are fp32 already)."""
    return lambda self, *args, **kwargs: None


@register_patch("dynamo", "torch.nn.Module.to")
def _patch_module_cast_in_forward(original):
    """MoE routers cast their classifier inside forward (``self.classifier = self.classifier.to(self.dtype)``:
    NLLB-MoE's ``_cast_classifier``, SwitchTransformers' router), which makes torch.export swap the
    parameters in place, and it refuses ("_apply(): Couldn't swap Linear.weight"). While tracing, a
    cast that would change nothing returns the module as it is; a real cast still runs (and fails).

    before: classifier.to(float32) -> Module._apply(swap every parameter)   after: classifier (no-op)
    """

    def to(self, *args, **kwargs):
        device, dtype, _non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
        unchanged = memory_format is None and all(
            (dtype is None or not (t.is_floating_point() or t.is_complex()) or t.dtype == dtype)
            and (device is None or t.device == torch.device(device))
            for t in itertools.chain(self.parameters(), self.buffers())
        )
        return self if unchanged else original(self, *args, **kwargs)

    return to


@register_patch("dynamo", "transformers.integrations.moe.ExpertsInterface.get_interface")
def _patch_experts_batched_mm(original):
    """MoE experts default to ``grouped_mm``, which under export on CPU/fp32 becomes the opaque custom
    op ``transformers::grouped_mm_fallback`` (a Python loop over data-dependent offsets): no ONNX
    function and no ExecuTorch kernel exist for it. transformers' own ``batched_mm`` implementation
    computes the same experts with a gather and a batched matmul, which every backend lowers.

    The decorated class's own ``eager`` forward loops ``for expert_idx in expert_hit`` over the
    ``nonzero()`` of the routing mask, a data-dependent iteration count torch.export cannot trace;
    a model that asks for it (OpenAI Privacy Filter defaults to ``eager`` for accumulation order)
    gets ``batched_mm`` too: the same experts, summed in another order.

    before: experts_implementation="grouped_mm" or "eager"    after: "batched_mm" (while tracing only)
    """
    from transformers.integrations import moe

    def get_interface(self, experts_implementation, default):
        fn = original(self, experts_implementation, default)
        return moe.batched_mm_experts_forward if fn in (moe.grouped_mm_experts_forward, default) else fn

    return get_interface


@register_patch("dynamo", "transformers.models.internvl.modeling_internvl.InternVLModel.pixel_shuffle",
                "transformers.models.qianfan_ocr.modeling_qianfan_ocr.QianfanOCRModel.pixel_shuffle")
def _patch_pixel_shuffle_int(original):
    """InternVL's pixel shuffle checks ``height % scale_factor != 0`` with a float ``scale_factor`` (0.5)
    and sizes its views with ``int(height * scale_factor)``. With a dynamic height, torch.export computes
    the value range of a float modulus of a symbol and fails (``ValueRangeError: Invalid ranges
    [0.5:-0.5]``). For ``scale_factor = 1/n`` the check holds for every integer size (it never raises)
    and ``int(h * scale) == h // n``; trace that integer arithmetic instead. Other factors run the original.

    before: if h % 0.5 != 0: raise; view(b, w, int(h * 0.5), int(c / 0.5))
    after:  view(b, w, h // 2, c * 2)
    """

    def pixel_shuffle(self, vision_features, scale_factor=0.5):
        n = round(1 / scale_factor)
        if abs(n * scale_factor - 1) > 1e-12:
            return original(self, vision_features, scale_factor)
        batch_size, width, height, channels = vision_features.size()
        vision_features = vision_features.view(batch_size, width, height // n, channels * n)
        vision_features = vision_features.permute(0, 2, 1, 3).contiguous()
        vision_features = vision_features.view(batch_size, height // n, width // n, channels * n * n)
        return vision_features.permute(0, 2, 1, 3).contiguous()

    return pixel_shuffle


@register_patch("dynamo", "transformers.models.hunyuan_vl.modeling_hunyuan_vl.HunYuanVLModel.get_placeholder_mask")
def _patch_placeholder_count_check(original):
    """HunYuanVL checks its image-token count in Python with a boolean-mask selection,
    ``if inputs_embeds[special_image_mask].numel() != image_features.numel(): raise`` (a data-dependent
    size: "Could not guard on data-dependent expression Ne(u0, 640)"). Check the same count as the
    other VLMs do, with ``torch_compilable_check`` (a runtime assertion in the graph), from the mask's sum.

    before: if x[mask].numel() != features.numel(): raise ValueError
    after:  torch_compilable_check(mask.sum() * hidden == features.numel())
    """
    from transformers.utils.import_utils import torch_compilable_check

    def get_placeholder_mask(self, input_ids, inputs_embeds, image_features=None):
        mask = original(self, input_ids, inputs_embeds, None)  # the mask alone: no check
        if image_features is not None:
            tokens = mask[..., 0].sum()
            torch_compilable_check(
                tokens * inputs_embeds.shape[-1] == image_features.numel(),
                lambda: f"Image features and image tokens do not match: features {image_features.shape[0]}",
            )
        return mask

    return get_placeholder_mask


@register_patch("dynamo", "torch.nn.functional.scaled_dot_product_attention")
def _patch_sdpa_contiguous_output(original):
    """The CPU SDPA kernel returns its output laid out as (batch, seq, heads, dim), so the model's
    ``transpose(1, 2).reshape(...)`` traces as a free ``view`` and its ``.contiguous()`` vanishes.
    ONNX and ExecuTorch lowering decompose SDPA into matmuls whose output is (batch, heads, seq,
    dim)-contiguous, and that recorded ``view`` then fails ("Cannot view a tensor with shape ...
    and strides ..."; GPT-2 on ExecuTorch, T5 on ONNX). Make the traced output contiguous, so the
    reshape is traced as the copy it is after lowering. Registered for dynamo, so every exporter
    traces the same graph.

    before: sdpa(q, k, v) -> strides of (b, s, h, d)   after: sdpa(q, k, v).clone(contiguous)
    """

    def sdpa(*args, **kwargs):
        # always: the layout the fake kernel reports at trace time (flash or math) need not be the one
        # a later decomposition sees, so only an explicit copy pins it
        return original(*args, **kwargs).clone(memory_format=torch.contiguous_format)

    return sdpa


from .patch_segmented_attention import _patch_segmented_attention  # noqa: E402,F401  (registers on import)
from .patch_moe_dense import _patch_dense_experts  # noqa: E402,F401  (registers on import)
from .patch_global_attention import _patch_global_attention  # noqa: E402,F401  (registers on import)
from .patch_shape_arithmetic import _patch_shape_simplify_by_expansion  # noqa: E402,F401  (registers on import)
from .patch_floor_div_axioms import _patch_floor_div_axioms_resimplified_by_need  # noqa: E402,F401  (registers on import)
from .patch_value_range_memo import _patch_value_ranges_once_per_subexpression  # noqa: E402,F401  (registers on import)
from .patch_reformer import _patch_lsh_hashing, _patch_pad_before_the_model  # noqa: E402,F401  (registers on import)
from .patch_dim_constraints import _patch_dim_constraints_skip_unsolvable_equalities  # noqa: E402,F401  (registers on import)
from .patch_replacement_bounds import _patch_replacement_bounds_overflow_skipped  # noqa: E402,F401  (registers on import)
from .patch_conv_padding import _patch_conv_padding_as_size_arithmetic  # noqa: E402,F401  (registers on import)
from .patch_ovis2_indicators import _patch_visual_indicators_without_branch  # noqa: E402,F401  (registers on import)
from .patch_autoformer_mask import _patch_autoformer_all_keep_mask_dropped  # noqa: E402,F401  (registers on import)
from .patch_hiera_masked_units import _patch_hiera_kept_units_static  # noqa: E402,F401  (registers on import)
from .patch_qwen4exp_indexer import _patch_qwen4exp_indexer_vectorized  # noqa: E402,F401  (registers on import)
from .patch_sdpa_query_length import _patch_sdpa_lookup_sees_the_patch, _patch_sdpa_query_length_decided  # noqa: E402,F401  (registers on import)
from .patch_udop_ocr_patches import _patch_udop_patches_static  # noqa: E402,F401  (registers on import)
from .patch_audio_windows import _patch_audio_windows_static  # noqa: E402,F401  (registers on import)
from .patch_keypoint_budget import _patch_keypoint_budget_without_branch, _patch_matcher_needs_a_keypoint  # noqa: E402,F401  (registers on import)
from .patch_structure_decode import _patch_structure_decode_fixed_steps  # noqa: E402,F401  (registers on import)
from .patch_frozen_guards import _patch_frozen_guard_counted_not_formatted  # noqa: E402,F401  (registers on import)
from .patch_delta_rule_solve import _patch_delta_rule_takes_eager_solve  # noqa: E402,F401  (registers on import)
from .patch_decomposition_stacks import _patch_edge_decompositions_without_stack_capture, _patch_onnx_decompositions_without_stack_capture  # noqa: E402,F401  (registers on import)
from .patch_fastspeech2_length_regulator import (  # noqa: E402,F401  (registers on import)
    _patch_length_regulator_vectorized, _patch_rel_positions_for_any_length, _patch_relative_shift_as_gather)


# ── Stage 3: Pytree registration ─────────────────────────────────────────────
# Every Cache (and cache layer) is flattened by attribute traversal: tensors become leaves, everything
# else goes into the context. Objects found in outputs that hold tensors but that pytree does not know
# are registered the same way. Add a branch below for a type attribute traversal cannot reach.
# A symbolic int attribute (traced under dynamic shapes) is recorded as None: it has no single value.

_REGISTERED: set[type] = set()


def _flatten_to_context(obj: Any, tensors: list, path: str = "") -> Any:
    """Append the tensors inside ``obj`` to ``tensors``; return a hashable context to rebuild it."""
    if isinstance(obj, torch.Tensor):
        tensors.append((path, obj))
        return ("tensor",)
    if isinstance(obj, (list, tuple)):
        kind = "list" if isinstance(obj, list) else "tuple"
        return (kind, tuple(_flatten_to_context(v, tensors, _join(path, str(i))) for i, v in enumerate(obj)))
    if isinstance(obj, dict):
        return ("dict", tuple((k, _flatten_to_context(v, tensors, _join(path, str(k)))) for k, v in obj.items()))
    if isinstance(obj, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        # a size-dependent attribute of a dynamic export (a sliding-window layer's cumulative_length):
        # it has no single value, and a symbol kept in the output spec drags the whole shape
        # environment along (torch.onnx's deepcopy of the module call graph fails on its fake tensors)
        return ("const", _Const(None))
    if _holds_tensors(obj):
        fields = tuple(
            (k, _flatten_to_context(v, tensors, _join(path, _alias(k)))) for k, v in vars(obj).items()
        )
        return ("object", type(obj), fields)
    return ("const", _Const(obj))


def _unflatten_from_context(ctx: Any, tensors: list) -> Any:
    """Inverse of ``_flatten_to_context``; consumes ``tensors`` (an iterator) in order."""
    kind = ctx[0]
    if kind == "tensor":
        return next(tensors)
    if kind in ("list", "tuple"):
        items = [_unflatten_from_context(c, tensors) for c in ctx[1]]
        return items if kind == "list" else tuple(items)
    if kind == "dict":
        return {k: _unflatten_from_context(c, tensors) for k, c in ctx[1]}
    if kind == "object":
        obj = ctx[1].__new__(ctx[1])
        for k, c in ctx[2]:
            obj.__dict__[k] = _unflatten_from_context(c, tensors)
        return obj
    return ctx[1].value


class _Const:
    """A non-tensor attribute kept in a pytree context; compared by value where it can be."""

    def __init__(self, value: Any):
        self.value = value

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, _Const):
            return False
        try:
            return bool(self.value == other.value)
        except Exception:  # noqa: BLE001 - values without a boolean equality
            return self.value is other.value

    def __hash__(self) -> int:
        return hash(type(self.value).__name__)

    def __repr__(self) -> str:
        return f"_Const({self.value!r})"


# Cache attribute names shortened in leaf names: DynamicCache.layers[0].keys -> past_key_values.0.key
_ALIASES = {"layers": "", "keys": "key", "values": "value"}


def _alias(name: str) -> str:
    return _ALIASES.get(name, name)


def _join(prefix: str, name: str) -> str:
    return ".".join(p for p in (prefix, name) if p)


def _holds_tensors(obj: Any) -> bool:
    if not hasattr(obj, "__dict__") or isinstance(obj, (type, torch.nn.Module)) or inspect.isroutine(obj):
        return False
    stack, seen = [obj], set()
    while stack:
        cur = stack.pop()
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        values = vars(cur).values() if hasattr(cur, "__dict__") else cur
        for v in values:
            if isinstance(v, torch.Tensor):
                return True
            if isinstance(v, (list, tuple)) or (hasattr(v, "__dict__") and not isinstance(v, (type, torch.nn.Module))):
                stack.append(v)
            elif isinstance(v, dict):
                stack.append(list(v.values()))
    return False


def _register(cls: type) -> None:
    if cls in _REGISTERED or cls in pytree.SUPPORTED_NODES:
        return

    def flatten(obj):
        tensors: list = []
        ctx = _flatten_to_context(vars(obj), tensors)
        return [t for _, t in tensors], (cls, ctx)

    def flatten_with_keys(obj):
        tensors: list = []
        ctx = _flatten_to_context(vars(obj), tensors)
        keys = [(pytree.GetAttrKey(_path_of(p)), t) for p, t in tensors]
        return keys, (cls, ctx)

    def unflatten(values, context):
        klass, ctx = context
        obj = klass.__new__(klass)
        obj.__dict__.update(_unflatten_from_context(ctx, iter(values)))
        return obj

    pytree.register_pytree_node(
        cls, flatten, unflatten, serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        flatten_with_keys_fn=flatten_with_keys,
        # .pt2 and .pte files store the output spec as JSON: the context travels pickled.
        to_dumpable_context=lambda ctx: base64.b64encode(pickle.dumps(ctx)).decode("ascii"),
        from_dumpable_context=lambda text: pickle.loads(base64.b64decode(text)),
    )
    _REGISTERED.add(cls)


def _path_of(path: str) -> str:
    return ".".join(_alias(p) for p in path.split(".") if _alias(p))


def _subclasses(cls: type) -> Iterable[type]:
    stack = [cls]
    while stack:
        cur = stack.pop()
        yield cur
        stack.extend(cur.__subclasses__())


def register_pytree_nodes(obj: Any = None) -> None:
    """Register every Cache class, and every unknown tensor-holding object found inside ``obj``."""
    from transformers import cache_utils

    for base in (cache_utils.Cache,):
        for cls in _subclasses(base):
            _register(cls)
    if obj is not None:
        for leaf in pytree.tree_leaves(obj):
            if not isinstance(leaf, torch.Tensor) and _holds_tensors(leaf):
                _register(type(leaf))


# Torch's shape-arithmetic patches (sympy.simplify, ShapeEnv internals) matter wherever torch rebuilds
# symbolic sizes, not only in torch.export: the ONNX and ExecuTorch lowerings re-trace the program
# (run_decompositions, to_edge) over the same nested expressions, so they install these too.
SHAPE_ARITHMETIC_PATHS = ("sympy.", "torch.fx.experimental.symbolic_shapes.", "torch.utils._sympy.")


def shape_arithmetic_patches(patches: list[PatchEntry]) -> list[PatchEntry]:
    return [p for p in patches if p.path.startswith(SHAPE_ARITHMETIC_PATHS)]


# ── Stage 4: Dynamic shapes ──────────────────────────────────────────────────
# With dynamic=True every tensor dim gets Dim.AUTO (torch keeps static what the model pins down),
# bounded above by config.max_dim (or the traced size if larger). DynamoConfig.dynamic_shapes overrides.


def auto_dynamic_shapes(inputs: Mapping[str, torch.Tensor], max_dim: int) -> dict[str, Any]:
    from torch.export import Dim

    return {
        name: {d: Dim.AUTO(max=max(max_dim, size)) for d, size in enumerate(t.shape)}
        for name, t in inputs.items()
    }


# ── Stage 5: State cleanup ───────────────────────────────────────────────────
# Attributes a model sets in forward survive tracing as fake tensors or symbols and break the next eager
# call or export. Restore, after export, every public attribute the forward replaced, every private one
# named here, and drop new ones holding fake tensors or symbols.

_STATEFUL_CACHE_ATTRS: tuple[str, ...] = (
    "cached_sequence_length",  # Wav2Vec2-BERT / Wav2Vec2-Conformer rotary cache key: an int set to a SymInt
    "cached_rotary_positional_embedding",  # ... and the cached table itself
    "_cached_decode_position_ids",
)


def _tracked(name: str) -> bool:
    """Attributes a forward may set: public ones and the named caches (torch's own ``_parameters``,
    ``_buffers``, ``_modules`` and hooks are private and left alone)."""
    return not name.startswith("_") or name in _STATEFUL_CACHE_ATTRS


def _snapshot_state(model: torch.nn.Module) -> dict[tuple[int, str], Any]:
    return {(id(m), k): v for m in model.modules() for k, v in vars(m).items() if _tracked(k)}


def _traced_value(value: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(value, (FakeTensor, torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, (list, tuple)):
        return any(_traced_value(v) for v in value)
    return False


def reset_model_state(model: torch.nn.Module, snapshot: dict[tuple[int, str], Any]) -> list[str]:
    """Put back every tracked attribute the traced forward replaced (Swin's ``window_size`` left as a
    SymInt broke the next export), and drop new ones that hold fake tensors or symbols."""
    reset = []
    for name, m in model.named_modules():
        for k, v in list(vars(m).items()):
            if not _tracked(k):
                continue
            key = (id(m), k)
            if key in snapshot:
                if snapshot[key] is not v:
                    m.__dict__[k] = snapshot[key]
                    reset.append(f"{name}.{k}")
            elif _traced_value(v):
                del m.__dict__[k]
                reset.append(f"{name}.{k}")
    return reset


def _is_dim_marking(name: str) -> bool:
    return name.startswith("_dynamo_") or name == "_has_dynamo_dim_marking"


def _dim_markings(tensors: Mapping[str, torch.Tensor]) -> dict[str, dict[str, Any]]:
    return {k: {a: v for a, v in vars(t).items() if _is_dim_marking(a)} for k, t in tensors.items()}


def restore_dim_markings(tensors: Mapping[str, torch.Tensor], before: dict[str, dict[str, Any]]) -> None:
    """torch.export marks the input tensors it is given dynamic dims for (``_dynamo_dynamic_indices``
    and friends, set on the tensor objects) and leaves the marks when the export fails; the next
    export of the same tensors (the sweep's cached inputs: another backend's static item) then traced
    them as dynamic. Put each tensor's marks back as they were before the export."""
    for name, tensor in tensors.items():
        for attr in [a for a in vars(tensor) if _is_dim_marking(a)]:
            if attr not in before[name]:
                delattr(tensor, attr)
        for attr, value in before[name].items():
            setattr(tensor, attr, value)


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
    return [name for name, v in leaf_names_and_values(tree) if isinstance(v, torch.Tensor)]


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
) -> Traced:
    """Stages 1-5: torch.export ``model(**inputs)`` with ``patches`` installed."""
    baked = set(specialized_inputs(inputs, config.specialize))
    tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor) and k not in baked}
    constants = {k: v for k, v in inputs.items() if not isinstance(v, torch.Tensor) or k in baked}
    names = list(tensors)
    register_pytree_nodes()
    if config.dynamic_shapes is not None:
        dynamic_shapes = config.dynamic_shapes
    elif config.dynamic:
        dynamic_shapes = auto_dynamic_shapes(tensors, config.max_dim)
    else:
        dynamic_shapes = None
    state = _snapshot_state(model)
    markings = _dim_markings(tensors)
    try:
        with constant_buffers_baked(model) as baked_buffers, \
                flat_forward_signature(model, names, constants, baked_buffers), apply_patches(patches, fired):
            program = torch.export.export(
                model, args=(), kwargs=tensors, dynamic_shapes=dynamic_shapes, strict=config.strict
            )
    finally:
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
    # the guards live on program.module(): build it only when there are dynamic dims to guard (the
    # ONNX and ExecuTorch exporters need no module otherwise); the dynamo artifact reuses it
    module = module_with_guards(program) if any(d for _, _, d in specs.values()) else None
    guards = getattr(module, "_guards_fn", None)
    return Traced(program, names, output_names, specs, constants, guards, module)


# ── the exporter ─────────────────────────────────────────────────────────────


class DynamoArtifact(Artifact):
    backend = "dynamo"
    file_name = "model.pt2"

    def __init__(self, program: torch.export.ExportedProgram, module: torch.nn.Module | None = None, **kwargs):
        super().__init__(**kwargs)
        self.program = program
        self._module = module if module is not None else program.module()

    def _run(self, ordered):
        out = self._module(**dict(zip(self.input_names, ordered)))
        return [v for v in pytree.tree_leaves(out) if isinstance(v, torch.Tensor)]

    def _save_model(self, path):
        torch.export.save(self.program, path)


class DynamoExporter(Exporter):
    backend = "dynamo"
    config_class = DynamoConfig

    def export(self, model, inputs, config=None):
        config = config or DynamoConfig()
        fired = FiredLog()
        traced = run_stage("export", self.backend, lambda: trace(model, inputs, config, self.registry.patches("dynamo"), fired), fired)
        return DynamoArtifact(traced.program, traced.module, **traced.artifact_kwargs(fired, config))
