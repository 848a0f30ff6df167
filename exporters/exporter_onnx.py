"""OnnxExporter: torch.export, then torch.onnx (onnxscript), run in ONNX Runtime. Five stages.

Every workaround of this backend is a top-level ``_patch_*``, ``_fix_*`` or ``_aten_*`` function here:
    grep -nE "^def (_patch_|_fix_|_aten_)" exporters/exporter_onnx.py
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .base import Artifact, ExportConfig, Exporter, run_stage
from .exporter_dynamo import shape_arithmetic_patches, trace
from .utils import (
    ActedFlag,
    FiredLog,
    NewNodes,
    apply_fx_node_fixes,
    apply_patches,
    copy_source_meta,
    fake_val,
    register_fx_node_fix,
    register_patch,
    replace_node,
)

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
# @register_patch("onnx", "torch.some_op"); the factory gets the real operator.


def _adaptive_windows(size, bins: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inside [bins, size] bool, lengths [bins])``: bin i covers input positions floor(i * size / bins) ..
    ceil((i + 1) * size / bins) - 1, ATen's adaptive-pooling windows, from aranges (``size`` may be symbolic)."""
    i = torch.arange(bins, device=like.device)
    start, end = (i * size) // bins, ((i + 1) * size + bins - 1) // bins
    j = torch.arange(size, device=like.device)[None, :]
    return (j >= start[:, None]) & (j < end[:, None]), end - start


def _average_last(x: torch.Tensor, bins: int) -> torch.Tensor:
    inside, lengths = _adaptive_windows(x.shape[-1], bins, x)
    return torch.matmul(x, (inside.to(x.dtype) / lengths.to(x.dtype)[:, None]).transpose(0, 1))


def _max_last(x: torch.Tensor, bins: int) -> torch.Tensor:
    inside, _ = _adaptive_windows(x.shape[-1], bins, x)
    return x.unsqueeze(-2).masked_fill(~inside, float("-inf")).amax(-1)


def _bins(output_size, sizes) -> list:
    bins = [output_size] * len(sizes) if isinstance(output_size, int) else list(output_size)
    return [b if b is not None else n for b, n in zip(bins, sizes)]


def _over_last_two(reduce, x: torch.Tensor, bins_h: int, bins_w: int) -> torch.Tensor:
    return reduce(reduce(x, bins_w).transpose(-1, -2), bins_h).transpose(-1, -2)


@register_patch("onnx", "torch.nn.functional.adaptive_avg_pool2d", "torch.nn.functional.adaptive_avg_pool1d",
                "torch.nn.functional.adaptive_max_pool2d", "torch.nn.functional.adaptive_max_pool1d")
def _patch_adaptive_pool_symbolic(original):
    """torch.onnx lowers adaptive pooling to an AveragePool / MaxPool whose kernel and stride come from
    the traced input size: exported with a dynamic size, the artifact returned the wrong shape (6
    bins from 8 rows: "size of tensor a (6) must match ... (4)") or wrong values (3 rows to 6 bins:
    off by 2.3) at any other size (BEiT's UperNet pyramid pooling: BeitForSemanticSegmentation at
    48 px). Global pooling (1 bin) was right. With a symbolic pooled size, pool over ATen's windows
    from aranges instead, exact at every size: a window matrix per axis for the average, a masked
    amax per axis for the max (a rectangle's max is the max of its rows' maxima).

    before: adaptive_avg_pool2d(x[..., H, W], (h, w))       # kernel = H // h, fixed at trace time
    after:  P_h[h, H] @ x @ P_w[w, W].T                      # P: 1/len over each ATen window
    Static sizes, and max pooling that returns indices, keep the original.
    """
    name = original.__name__.lstrip("_")
    dims = 2 if "2d" in name else 1
    reduce = _max_last if "max" in name else _average_last

    def adaptive_pool(input, output_size, *args, **kwargs):
        return_indices = kwargs.get("return_indices", args[0] if args else False)
        sizes = tuple(input.shape[-dims:])
        if return_indices or not any(isinstance(n, torch.SymInt) for n in sizes):
            return original(input, output_size, *args, **kwargs)
        bins = _bins(output_size, sizes)
        return reduce(input, bins[0]) if dims == 1 else _over_last_two(reduce, input, *bins)

    return adaptive_pool


# ── Stage 2: ONNX patches ────────────────────────────────────────────────────
# Patches on torch.onnx internals, installed around torch.onnx.export. The one below re-runs the
# FX node fixes after torch.onnx's own run_decompositions, so that nodes the decomposition
# introduces (shape guards, alias ops) are fixed before lowering.

_CURRENT: dict[str, Any] = {}  # the registry and fired log of the export in progress


@register_patch("onnx", "torch.onnx._internal.exporter._fx_passes.decompose_with_registry")
def _patch_refix_after_decompositions(original):
    """Re-run the FX node fixes on the graph torch.onnx has just decomposed."""
    @functools.wraps(original)
    def decompose(exported_program, registry):
        for target, function in _ONNX_COMPLEX_TRANSLATION_TABLE.items():
            # torch.onnx.export's custom_translation_table registers real-valued functions only
            registry.register_op(target, function, is_complex=True)
        program = original(exported_program, registry)
        reg, fired = _CURRENT.get("registry"), _CURRENT.get("fired")
        if reg is not None:
            apply_fx_node_fixes(reg.fixes("onnx", "node"), program.graph_module, fired)
            for node in program.graph.nodes:  # custom translations this program will use
                if node.op != "call_function":
                    continue
                if node.target in _ONNX_TRANSLATION_TABLE:
                    fired.add(f"translation:onnx:{_ONNX_TRANSLATION_TABLE[node.target].__name__}")
                if node.target in _ONNX_COMPLEX_TRANSLATION_TABLE and _is_complex(node.args[0]):
                    fired.add(f"translation:onnx:{_ONNX_COMPLEX_TRANSLATION_TABLE[node.target].__name__}")
        return program

    return decompose


# operator -> (its identity operand, whether the operand may come first): x + 0, 0 + x, x - 0, x * 1, 1 * x, x / 1
_NO_OP_OPERANDS = {"Add": (0, True), "Sub": (0, False), "Mul": (1, True), "Div": (1, False)}


def _exact_no_op_rules() -> list:
    """onnxscript rewrite rules dropping ``x + 0``, ``x - 0``, ``x * 1``, ``x / 1`` only when the constant
    operand is a scalar exactly equal to the identity (what ``onnxscript``'s ``_no_op`` rules mean to do)."""
    from onnxscript.rewriter import pattern

    def exact(identity):
        def condition(context, x, c, **_):
            value = c.const_value
            if value is None:
                return False
            try:
                array = value.numpy()
            except FileNotFoundError:  # external data not loaded
                return False
            return array.ndim == 0 and bool(array == identity)
        return condition

    def identity(op, x, **_):
        return op.Identity(x)

    def target(op_type, constant_first):
        if constant_first:
            return lambda op, x, c: getattr(op, op_type)(c, x)
        return lambda op, x, c: getattr(op, op_type)(x, c)

    rules = []
    for op_type, (value, commutes) in _NO_OP_OPERANDS.items():
        for constant_first in (False, True) if commutes else (False,):
            rules.append(pattern.RewriteRule(target(op_type, constant_first), identity, exact(value),
                                             name=f"Exact{op_type}Identity{'First' if constant_first else ''}"))
    return rules


@register_patch("onnx", "onnxscript.rewriter._DEFAULT_REWRITE_RULES")
def _patch_exact_no_op_rules(original):
    """The onnxscript optimizer's no-op rules (``onnxscript.rewriter.rules.common._no_op``: ``x + 0``,
    ``x - 0``, ``x * 1``, ``x / 1`` -> ``x``) match their constant with ``math.isclose(value, identity,
    rel_tol=1e-5, abs_tol=1e-8)`` (the defaults of the pattern ``Constant``). A float32 ``1e-8`` is within
    ``abs_tol`` of 0, so the epsilon of ``rsqrt(mean(x**2) + 1e-8)`` is deleted: MuseSpark / MuseGlimmer's
    post-expert RMSNorm (``post_norm_eps=1e-8``) on activations whose mean square is ~1e-6 is off by ~0.5%
    (``x * 1.000005`` would be dropped the same way). Keep the optimizer's rules, but replace those six with
    rules that need the constant to equal the identity exactly. ``optimize_ir`` reads the rule list at each
    call; being a tuple, not a callable, the patch is recorded as fired on every ONNX export, optimized or not.

    before: Add(mean, 1e-8) -> Identity(mean)    after: Add(mean, 1e-8) kept; Add(x, 0.0) -> Identity(x)
    """
    from onnxscript.rewriter.rules.common import _no_op

    keep = {id(_no_op.dropout_zero_rule), id(_no_op.dropout_inference_rule)}
    approximate = {id(rule) for rule in _no_op.rules.rules if id(rule) not in keep}
    return (*_exact_no_op_rules(), *(rule for rule in original if id(rule) not in approximate))


@register_patch("onnx", "onnxscript.optimizer._constant_folding.PartialEvaluatorRegistry.lookup_evaluators")
def _patch_split_to_sequence_unknown_split(original):
    """onnxscript's constant folding of ``SplitToSequence`` (``_constant_folding.split_to_sequence``,
    onnxscript 0.7.2) reads ``split_value.ndim`` when the split input is a scalar whose value is not
    known (a size of a dynamic dim): "AttributeError: 'NoneType' object has no attribute 'ndim'", and
    the optimizer stops the export (ProphetNet's ngram stream split, onnx dynamic). Such a node cannot be
    folded; the evaluator now says so (returns None) instead of raising. Every other evaluator and
    every other failure is untouched.

    before: SplitToSequence(x, split=<dynamic scalar>) -> PassError (AttributeError in the evaluator)
    after:  SplitToSequence(x, split=<dynamic scalar>) left as it is
    """

    acted = ActedFlag()  # set when a fold was declined

    def not_folded_on_unknown_split(evaluator):
        @functools.wraps(evaluator)
        def evaluate(node, *args, **kwargs):
            try:
                return evaluator(node, *args, **kwargs)
            except AttributeError as exc:
                if "'NoneType' object has no attribute 'ndim'" not in str(exc):
                    raise
                acted.set()
                return None

        return evaluate

    def lookup_evaluators(self, domain, opname, version):
        evaluators = original(self, domain, opname, version)
        if (domain, opname) != ("", "SplitToSequence"):
            return evaluators
        return [not_folded_on_unknown_split(e) for e in evaluators]

    lookup_evaluators.acted = acted  # fired only when a fold was declined
    return lookup_evaluators


# ── Stage 3: FX node fixes ───────────────────────────────────────────────────
# Rewrite nodes the ONNX exporter cannot lower: @register_fx_node_fix("onnx"), fn(gm, node) -> bool.


@register_fx_node_fix("onnx")
def _fix_dead_assertions(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """``aten._assert_tensor_metadata`` / ``_assert_async`` with no users: nothing to lower in ONNX.

    before: _assert_tensor_metadata(x, dtype=...)   after: (node removed)
    """
    targets = (torch.ops.aten._assert_tensor_metadata.default, torch.ops.aten._assert_async.msg)
    if node.op == "call_function" and node.target in targets and not node.users:
        gm.graph.erase_node(node)
        return True
    return False


@register_fx_node_fix("onnx")
def _fix_scalar_minus_tensor(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """``1.0 - mask`` traces as ``aten.rsub.Scalar(mask, 1.0)``, which decomposes to
    ``aten.sub.Tensor(1.0, mask)``: a Python number as ``self``, which torch.onnx's type promotion
    cannot match to any overload ("Cannot find a compatible OpOverload for aten.sub"; Mllama's
    cross-attention mask). Spell it as an add of the negated tensor, which promotes the same way.

    before: rsub.Scalar(x, c, alpha=a) / sub.Tensor(c, x, alpha=a)    after: add.Tensor(mul.Tensor(x, -a), c)
    """
    if node.op != "call_function":
        return False
    aten = torch.ops.aten
    if node.target is aten.rsub.Scalar:
        x, number = node.args[:2]
    elif node.target is aten.sub.Tensor and isinstance(node.args[0], (int, float)) and isinstance(node.args[1], torch.fx.Node):
        number, x = node.args[:2]
    else:
        return False
    alpha = node.kwargs.get("alpha", node.args[2] if len(node.args) > 2 else 1)
    with gm.graph.inserting_before(node):
        scaled = gm.graph.call_function(aten.mul.Tensor, (x, -alpha))
        out = gm.graph.call_function(aten.add.Tensor, (scaled, number))
    replace_node(gm, node, (scaled, out))
    return True


_SYMBOLIC_OPERAND_OPS = (torch.ops.aten.mul.Tensor, torch.ops.aten.div.Tensor, torch.ops.aten.add.Tensor,
                         torch.ops.aten.sub.Tensor)
_SCALAR_TO_TENSOR_OVERLOAD = {torch.ops.aten.remainder.Scalar: torch.ops.aten.remainder.Tensor,
                              torch.ops.aten.fmod.Scalar: torch.ops.aten.fmod.Tensor}


@register_fx_node_fix("onnx")
def _fix_symbolic_float_operand(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """A tensor times a symbolic float (``x * (h / w)`` with sizes h and w dynamic: DeepseekOcr2's
    crop ratios) traces as ``mul.Tensor(x, sym_float)``; torch.onnx sends it to onnxscript's
    ``aten_mul_scalar``, which makes an ONNX constant of the operand and fails: "float() argument
    must be a string or a real number, not 'SymbolicTensor'". Make the operand a 0-d tensor of the
    result's dtype, so the op is tensor-tensor.

    before: mul.Tensor(x, s)            # s: SymFloat node
    after:  mul.Tensor(x, scalar_tensor(s, dtype=out.dtype))

    The scalar overloads of remainder and fmod fail the same way on a symbolic int
    (``buckets % seq_len`` in Reformer's LSH sort, seq_len dynamic): they become the tensor overloads.

    before: remainder.Scalar(x, s)      # s: SymInt node
    after:  remainder.Tensor(x, scalar_tensor(s, dtype=out.dtype))
    """
    aten = torch.ops.aten
    if node.op != "call_function" or (node.target not in _SYMBOLIC_OPERAND_OPS
                                      and node.target not in _SCALAR_TO_TENSOR_OVERLOAD):
        return False
    out = node.meta.get("val")
    symbolic = (torch.SymFloat,) if node.target in _SYMBOLIC_OPERAND_OPS else (torch.SymInt, torch.SymFloat)
    positions = [i for i, a in enumerate(node.args[:2])
                 if isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), symbolic)]
    if not positions or not isinstance(out, torch.Tensor):
        return False
    args = list(node.args)
    new = NewNodes(gm.graph)
    with gm.graph.inserting_before(node):
        for i in positions:
            args[i] = new.call(aten.scalar_tensor.default, args[i], dtype=out.dtype)
    copy_source_meta(node, new)
    node.args = tuple(args)
    node.target = _SCALAR_TO_TENSOR_OVERLOAD.get(node.target, node.target)
    return True


@register_fx_node_fix("onnx")
def _fix_symbolic_floordiv_floors(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Floor division of symbolic sizes (``operator.floordiv`` in the graph) is exported by
    onnxscript as ONNX ``Div``, which truncates ("only for positive inputs", its comment says), so a
    negative numerator rounds the wrong way. Encodec-style convs compute their right padding as a
    ceiling, ``-((k - p - L) // s)``: at L = 1921 the ONNX artifact made one frame where eager made
    two (MimiEncoderModel, PocketTTS audio tokenizer, onnx dynamic). Subtract the remainder first
    (``a - a % b`` is a multiple of b, so truncation and floor agree; ONNX ``Mod`` takes the
    divisor's sign, as Python does). A numerator known to be non-negative is left alone.

    before: floordiv(a, b)                 # ONNX Div: trunc(a / b)
    after:  floordiv(sub(a, mod(a, b)), b) # exact, = floor(a / b)
    """
    if node.op != "call_function" or node.target is not operator.floordiv:
        return False
    numerator, divisor = node.args
    value = fake_val(numerator) if isinstance(numerator, torch.fx.Node) else numerator
    if not isinstance(value, torch.SymInt) or statically_known_true(value >= 0):
        return False
    new = NewNodes(gm.graph)
    with gm.graph.inserting_before(node):
        exact = new.call(operator.sub, numerator, new.call(operator.mod, numerator, divisor))
    copy_source_meta(node, new)
    node.args = (exact, divisor)
    return True


@register_fx_node_fix("onnx")
def _fix_noop_squeeze(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """``x.squeeze(d)`` on a dim whose size is not 1 is a no-op in torch, but ONNX ``Squeeze``
    raises on it ("Dimension of input 0 must be 1 instead of 8" at session load) and onnxscript's
    ``aten_squeeze_dim`` emits a plain Squeeze (onnx/onnx#3764, pytorch/pytorch#36796). Pixtral's
    projector (Mistral 3) and the Parakeet/Nemotron RNNT decoders squeeze such dims. Drop the dims
    whose traced size is a concrete int other than 1; a symbolic size is left to the exporter.

    before: squeeze.dim(x[8, 32], 0)   after: alias(x)
    before: squeeze.dims(x[1, 8, 1], [0, 1, 2])   after: squeeze.dims(x, [0, 2])
    """
    aten = torch.ops.aten
    if node.op != "call_function" or node.target not in (aten.squeeze.dim, aten.squeeze.dims):
        return False
    x = node.args[0]
    val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() == 0:
        return False
    dims = node.args[1] if node.target is aten.squeeze.dims else [node.args[1]]
    keep = [d for d in dims if not (isinstance(val.shape[d], int) and val.shape[d] != 1)]
    if len(keep) == len(dims):
        return False
    with gm.graph.inserting_before(node):
        if keep:
            new = gm.graph.call_function(aten.squeeze.dims, (x, keep))
        else:
            new = gm.graph.call_function(aten.alias.default, (x,))
    replace_node(gm, node, (new,))
    return True


@register_fx_node_fix("onnx")
def _fix_searchsorted_as_comparisons(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """``torch.searchsorted`` has no ONNX function ("No ONNX function found for aten.searchsorted";
    MusicFlamingo maps encoder rows to audio samples with it; under dynamic shapes torch.onnx's own
    decomposition of ``isin`` emits one, in Grounding DINO). In a sorted sequence the insertion
    point is the count of boundaries before it, so count them with a comparison and a sum. The
    comparison is negated, not flipped: torch's binary search puts a NaN value after every boundary.
    A ``sorter`` only permutes the boundaries, which leaves the count unchanged. A 1-D sequence is
    shared by all values; an N-D one is searched row by row (same leading dims, as torch requires).

    before: searchsorted(seq, v, right=r, side=s, out_int32=i, sorter=p)
    after:  sum(~(seq > v[..., None]) if r or s == "right" else ~(seq >= v[..., None]), -1, int32 if i else int64)
    """
    aten = torch.ops.aten
    if node.op != "call_function" or node.target not in (aten.searchsorted.Tensor, aten.searchsorted.Scalar):
        return False
    seq, values = node.args[:2]
    seq_val = seq.meta.get("val") if isinstance(seq, torch.fx.Node) else None
    if not isinstance(seq_val, torch.Tensor) or seq_val.dim() == 0 or seq_val.is_complex():
        return False
    right, side = node.kwargs.get("right", False), node.kwargs.get("side")
    if side not in (None, "left", "right") or (side == "left" and right):
        return False
    right = right or side == "right"
    dtype = torch.int32 if node.kwargs.get("out_int32", False) else torch.int64
    if node.target is aten.searchsorted.Scalar:
        if seq_val.dim() != 1 or isinstance(values, bool) or not isinstance(values, (int, float)):
            return False
        compare, compare_args = (aten.gt.Scalar if right else aten.ge.Scalar), (seq, values)
    else:
        val = values.meta.get("val") if isinstance(values, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor) or val.is_complex() or (seq_val.dim() > 1 and val.dim() != seq_val.dim()):
            return False
        compare = aten.gt.Tensor if right else aten.ge.Tensor
    graph = gm.graph
    with graph.inserting_before(node):
        new = []
        if node.target is aten.searchsorted.Tensor:
            new.append(graph.call_function(aten.unsqueeze.default, (values, -1)))  # [..., K, 1]
            if seq_val.dim() > 1:
                new.append(graph.call_function(aten.unsqueeze.default, (seq, -2)))  # [..., 1, M]
            compare_args = (new[-1] if seq_val.dim() > 1 else seq, new[0])
        new.append(graph.call_function(compare, compare_args))
        new.append(graph.call_function(aten.logical_not.default, (new[-1],)))  # boundary sorts before the value
        new.append(graph.call_function(aten._to_copy.default, (new[-1],), {"dtype": dtype}))
        new.append(graph.call_function(aten.sum.dim_IntList, (new[-1], [-1]), {"dtype": dtype}))
    # torch.onnx's decomposition of isin brings searchsorted in after run_decompositions, where lowering
    # reads every node's meta["val"]: replace_node computes the new nodes' vals
    replace_node(gm, node, new)
    return True


@register_fx_node_fix("onnx")
def _fix_sym_numel_as_sizes(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """``t.numel()`` of a tensor with a data-dependent size traces as ``aten.sym_numel``, which has
    no ONNX function ("No ONNX function found for aten.sym_numel"; Inkling 2 checks its placeholder
    counts against ``inputs_embeds[mask].numel()``). The element count is the product of the sizes,
    and ``sym_size`` lowers to Shape.

    before: sym_numel(x[a, b, c])    after: sym_size.int(x, 0) * sym_size.int(x, 1) * sym_size.int(x, 2)
    """
    import operator

    if node.op != "call_function" or node.target is not torch.ops.aten.sym_numel.default:
        return False
    x = node.args[0]
    val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() == 0:
        return False
    new, total = [], None
    with gm.graph.inserting_before(node):
        for d in range(val.dim()):
            size = gm.graph.call_function(torch.ops.aten.sym_size.int, (x, d))
            new.append(size)
            if total is not None:
                new.append(gm.graph.call_function(operator.mul, (total, size)))
            total = new[-1]
    replace_node(gm, node, new)  # computes the new nodes' vals (exporters.utils.set_fake_val)
    return True


# ── Stage 4: ONNX translations ───────────────────────────────────────────────
# Custom lowerings for aten ops whose default translation is missing or wrong: write an ``_aten_*``
# onnxscript function and add it to _ONNX_TRANSLATION_TABLE, keyed by the aten overload.


def _aten_is_all_true(self):
    """``torch.all(t)`` on a bool tensor as used by shape and placeholder checks (``aten._is_all_true``
    has no ONNX function). An empty tensor is all-true, as in torch.

    before: aten._is_all_true(mask)    after: Cast(ReduceMin(Cast(mask, int32), keepdims=0), bool)
    """
    from onnxscript import opset18 as op

    as_int = op.Cast(op.Reshape(self, op.Constant(value_ints=[-1])), to=6)  # int32
    # ReduceMin of an empty tensor is the int32 maximum: non-zero, i.e. true, like torch.all([])
    return op.Cast(op.ReduceMin(as_int, keepdims=0), to=9)  # bool


# Giles (2010), "Approximating the erfinv function": single-precision coefficients, relative error
# below 4e-7 on (-1, 1); the central branch for w < 5, the tail branch otherwise.
_ERFINV_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                   -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


def _aten_erfinv(self):
    """``erfinv`` (``prims.erf_inv`` after decomposition) has no ONNX function ("No ONNX function
    found for prims.erf_inv"; Gemma 3n's activation sparsity takes ``Normal(0, 1).icdf``). Compute it
    with Giles' polynomial approximation.

    before: prims.erf_inv(x)    after: x * poly(w), w = -log((1 - x)(1 + x)), one of two branches
    """
    from onnxscript import opset18 as op

    def const(value):
        return op.CastLike(op.Constant(value_float=value), self)

    w = op.Neg(op.Log(op.Mul(op.Sub(const(1.0), self), op.Add(const(1.0), self))))
    central, tail = op.Sub(w, const(2.5)), op.Sub(op.Sqrt(w), const(3.0))
    p_central, p_tail = const(_ERFINV_CENTRAL[0]), const(_ERFINV_TAIL[0])
    for a, b in zip(_ERFINV_CENTRAL[1:], _ERFINV_TAIL[1:]):
        p_central = op.Add(const(a), op.Mul(p_central, central))
        p_tail = op.Add(const(b), op.Mul(p_tail, tail))
    return op.Mul(op.Where(op.Less(w, const(5.0)), p_central, p_tail), self)


@functools.cache
def _cumulative_extreme_scan():
    """The Scan of cummax / cummin over axis 0, as an onnxscript function (built on first use, so that
    importing this module does not compile it). Each step keeps the running extreme ``m`` and its index
    ``k``; it takes the new element when it is NaN, or when ``m`` is not NaN and the element is >= ``m``
    (``is_max``) or <= ``m`` (not ``is_max``, carried unchanged): torch's rule, so ties and NaNs go to
    the latest index."""
    import onnxscript
    from onnxscript import opset18 as op
    from onnxscript.function_libs.torch_lib.tensor_typing import TTensor
    from onnxscript.onnx_types import BOOL, INT64

    def cumulative_extreme_indices_dim0(x, is_max):
        @onnxscript.graph()
        def step(m, k, t, mx, xt):
            # ORT has no bool Where: pick the comparison with And/Or
            better = op.Or(op.And(mx, op.GreaterOrEqual(xt, m)), op.And(op.Not(mx), op.LessOrEqual(xt, m)))
            take = op.Or(op.Not(op.Equal(xt, xt)), op.And(op.Equal(m, m), better))
            take = op.Or(take, op.Equal(t, op.Constant(value_int=0)))
            k_out = op.Where(take, t, k)
            return op.Where(take, xt, m), k_out, op.Add(t, op.Constant(value_int=1)), op.Identity(mx), op.Identity(k_out)

        rest = op.Shape(x, start=1)
        m0 = op.Expand(op.CastLike(op.Constant(value_int=0), x), rest)
        k0 = op.Expand(op.Constant(value_int=0), rest)
        m_last, k_last, t_last, mx_last, indices = op.Scan(m0, k0, op.Constant(value_int=0), is_max, x, body=step,
                                                           num_scan_inputs=1)
        return indices

    # torch.onnx reads the signature from the annotations, which must be objects, not the strings that
    # this module's ``from __future__ import annotations`` would make of them
    cumulative_extreme_indices_dim0.__annotations__ = {"x": TTensor, "is_max": BOOL, "return": INT64}
    domain = onnxscript.values.Opset("pkg.exporters.onnx", 1)
    return onnxscript.script(domain, default_opset=op)(cumulative_extreme_indices_dim0)


def _cumulative_extreme(self, dim: int, kind: str):
    import onnx_ir as ir
    from onnxscript import opset18 as op

    rank = len(self.shape)
    if rank == 0:  # torch: the value itself, at index 0
        return op.Identity(self), op.Constant(value_int=0)
    dim = dim % rank
    perm = [dim] + [d for d in range(rank) if d != dim]
    x = op.Transpose(self, perm=perm) if dim else self
    # no ordering comparison on bool in ONNX: compare as uint8 (False < True, as in torch)
    is_max = op.Constant(value=ir.tensor(kind == "max"))
    indices = _cumulative_extreme_scan()(op.Cast(x, to=2) if self.dtype == ir.DataType.BOOL else x, is_max)
    # the values are gathered, not carried: ORT's Where drops the sign of a -0.0 it selects
    values = op.GatherElements(x, indices, axis=0)
    if dim:
        back = [perm.index(d) for d in range(rank)]
        values, indices = op.Transpose(values, perm=back), op.Transpose(indices, perm=back)
    return values, indices


def _aten_cummax(self, dim: int):
    """``torch.cummax`` has no ONNX function ("No ONNX function found for aten.cummax"; Grounding
    DINO finds each token's previous delimiter with it), and ONNX has no CumMax. Scan along ``dim``
    carrying the running maximum and its index with torch's update rule (ties and NaNs go to the
    latest index), then gather the values at those indices.

    before: aten.cummax(x, dim)    after: i = Scan(step)(Transpose(x, dim first)); (GatherElements(x, i), i), transposed back
    """
    return _cumulative_extreme(self, dim, "max")


def _aten_cummin(self, dim: int):
    """``torch.cummin``, as ``_aten_cummax`` with <= (Grounding DINO's next delimiter, right after its
    cummax; the same "No ONNX function found").

    before: aten.cummin(x, dim)    after: i = Scan(step)(Transpose(x, dim first)); (GatherElements(x, i), i), transposed back
    """
    return _cumulative_extreme(self, dim, "min")


def _aten_scatter_reduce(self, dim: int, index, src, reduce: str, include_self: bool = True):
    """``scatter_reduce(..., reduce="mean")``: torchlib maps ``mean`` to ``ScatterElements(reduction="none")``
    (ONNX has no mean reduction, onnx/onnx#5100), so every position gets the *last* scattered value, not the
    mean (TAPAS' segmented ``reduce_mean`` over table cells: column logits off by 0.15). Compute it as a
    scatter-add of the values over a scatter-add of ones. Other reductions go to torchlib's function.
    Integer inputs divide with ONNX's truncation (torch floors): only differs for negative sums.

    before: ScatterElements(self', index, src, reduction="none")
    after:  ScatterElements(self', index, src, reduction="add") / max(ScatterElements(0, index, 1, "add") [+ 1], 1)
            (self' = self with the scattered-to positions zeroed when include_self=False)
    """
    if reduce != "mean":
        from onnxscript.function_libs.torch_lib.ops.core import aten_scatter_reduce

        return aten_scatter_reduce(self, dim, index, src, reduce, include_self)
    from onnxscript import opset18 as op

    zero, one = op.CastLike(op.Constant(value_float=0.0), src), op.CastLike(op.Constant(value_float=1.0), src)
    src_shape = op.Shape(src)
    count = op.ScatterElements(op.Expand(zero, op.Shape(self)), index, op.Expand(one, src_shape), axis=dim,
                               reduction="add")
    if include_self:
        count = op.Add(count, one)  # self is one more term of every mean
    else:
        self = op.ScatterElements(self, index, op.Expand(zero, src_shape), axis=dim, reduction="none")
    total = op.ScatterElements(self, index, src, axis=dim, reduction="add")
    # positions nothing was scattered to: count 0 (include_self=False) keeps self, as in torch
    return op.Div(total, op.Max(count, one))


_ONNX_TRANSLATION_TABLE: dict[Any, Any] = {
    torch.ops.aten._is_all_true.default: _aten_is_all_true,
    torch.ops.aten.scatter_reduce.two: _aten_scatter_reduce,
    torch.ops.aten.erfinv.default: _aten_erfinv,
    torch.ops.prims.erf_inv.default: _aten_erfinv,
    torch.ops.aten.cummax.default: _aten_cummax,
    torch.ops.aten.cummin.default: _aten_cummin,
}


def _aten_unsqueeze_complex(self, dim: int):
    """``unsqueeze`` of a complex tensor, which torchlib lacks ("No ONNX function found for
    aten.unsqueeze ... complex-valued input"; the complex rotary embeddings of Llama 4 and
    DeepSeek-V2). torch.onnx carries a complex tensor as a real one with a trailing (real, imag)
    axis, so a negative ``dim`` counts from before that axis.

    before: aten.unsqueeze(z, dim) on complex z    after: Unsqueeze(z_as_real, dim if dim >= 0 else dim - 1)
    """
    from onnxscript import opset18 as op

    return op.Unsqueeze(self, op.Constant(value_ints=[dim if dim >= 0 else dim - 1]))


# Registered with is_complex=True on the registry of the export in progress (by the stage-2 patch
# above): custom_translation_table cannot register complex-valued functions.
_ONNX_COMPLEX_TRANSLATION_TABLE: dict[Any, Any] = {
    torch.ops.aten.unsqueeze.default: _aten_unsqueeze_complex,
}


def _is_complex(arg: Any) -> bool:
    val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.is_complex()


# ── Stage 5: ONNX IR fixes ───────────────────────────────────────────────────
# Rewrite the finished ONNX program around ONNX Runtime bugs: add a ``_fix_ir_*(model) -> bool``
# to _IR_FIXES. Each returns whether it changed the model.


def _all_nodes(model):
    for node in model.graph.all_nodes() if hasattr(model.graph, "all_nodes") else model.graph:
        yield node
    for function in model.functions.values():
        yield from function


def _fix_ir_topk_sorted(model) -> bool:
    """ORT's TopK(sorted=0) returns a different order than torch.topk on CPU; force sorted=1.

    before: TopK(x, k, sorted=0)    after: TopK(x, k, sorted=1)
    """
    import onnx_ir as ir

    changed = False
    for node in _all_nodes(model):
        attr = node.attributes.get("sorted") if node.op_type == "TopK" else None
        if attr is not None and attr.as_int() == 0:
            node.attributes["sorted"] = ir.AttrInt64("sorted", 1)
            changed = True
    return changed


def _fix_ir_register_orphan_constants(model) -> bool:
    """Register as an initializer every node input that nothing defines but that carries its constant.

    onnxscript's rewriter registers a rule's new initializers by name, overwriting an earlier one of
    the same name (``RewriteRuleSet._apply_to_graph_or_function``: the duplicate check is a dead
    ``continue``; microsoft/onnxscript#2945, #2079). ``FuseMaxMinToClip`` names its bounds
    ``f"{x.name}_min"`` / ``_max``, so two ``Min(Max(x, lo), hi)`` clamps of one tensor (Gemma 4's
    audio ``clamp``s of one normed input) each create ``x_min``: the first Clip's bound is dropped
    from ``graph.initializers``, ``NameFixPass`` renames it ``x_min_1`` without re-registering it
    (onnx/ir-py#448), and ONNX Runtime refuses the model ("Node input 'x_min_1' is not a graph input,
    initializer, or output of a previous node"). The value still holds its own bound: register it.

    before: Clip(x, x_min_1 <unregistered const>, x_max_1 <unregistered const>)
    after:  Clip(x, x_min_1, x_max_1) with both in graph.initializers
    """
    graphs = list(model.graphs())
    inputs = {id(v) for g in graphs for v in g.inputs}
    registered = {id(v) for g in graphs for v in g.initializers.values()}
    taken = {v.name for g in graphs for v in (*g.inputs, *g.initializers.values())}
    taken |= {v.name for node in _all_nodes(model) for v in node.outputs}
    changed = False
    for node in _all_nodes(model):
        for value in node.inputs:
            if (value is None or value.producer() is not None or id(value) in inputs or id(value) in registered
                    or value.const_value is None):
                continue
            base = name = value.name or "orphan_constant"
            i = 0
            while name in taken:
                i += 1
                name = f"{base}_{i}"
            value.name = name
            model.graph.register_initializer(value)
            registered.add(id(value))
            taken.add(name)
            changed = True
    return changed


_IR_FIXES = (_fix_ir_topk_sorted, _fix_ir_register_orphan_constants)


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


class OnnxExporter(Exporter):
    backend = "onnx"
    config_class = OnnxConfig

    def export(self, model, inputs, config=None):
        config = config or OnnxConfig()
        fired = FiredLog()
        torch_patches = [p for p in self.registry.patches("dynamo", "onnx") if not p.path.startswith(_ONNX_INTERNALS)]
        onnx_patches = [p for p in self.registry.patches("onnx") if p.path.startswith(_ONNX_INTERNALS)]
        onnx_patches += shape_arithmetic_patches(torch_patches)  # torch.onnx re-traces the sizes too
        traced = run_stage("export", self.backend, lambda: trace(model, inputs, config, torch_patches, fired), fired)
        program = traced.program
        onnx_program = run_stage(
            "lower", self.backend, lambda: self._to_onnx(program, traced, config, onnx_patches, fired), fired
        )
        return run_stage(
            "run", self.backend,
            lambda: OnnxArtifact(onnx_program, **traced.artifact_kwargs(fired, config), extra_metadata={"optimize": config.optimize}),
            fired,
        )

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

