"""ONNX translations: custom lowerings of aten ops whose default translation is missing or wrong.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from exporters.workarounds._erfinv import _ERFINV_CENTRAL, _ERFINV_TAIL

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


def _aten_repeat_interleave_self_int(self, repeats, dim: int | None = None, output_size: int | None = None):
    """``repeat_interleave(x, repeats, dim)`` with a symbolic ``repeats`` (a count read off another input's
    size): torchlib builds the Expand target as ``[1] * pos_dim + [repeats] + [1] * (rank - pos_dim)``, the
    count one axis too early for the axis it unsqueezed at ``pos_dim + 1`` (onnxscript torch_lib core.py
    ``aten_repeat_interleave_self_int``, the symbolic branch added by microsoft/onnxscript#2548; its int branch
    is right). So at dim 0 a tensor of batch 2 repeated
    twice kept 2 rows, and batch 3 refused the Expand (InstructBlipVideo's
    ``qformer_input_ids.repeat_interleave(frames, dim=0)``, exported at 1 frame: 'invalid expand shape' and
    'Non concat axis dimensions must match: 2 and 4' at drawn sizes). Here the target is the full shape with
    the count at ``pos_dim + 1``. An int ``repeats`` goes to torchlib's function.

    before: Reshape(Expand(Unsqueeze(x, d+1), [1]*d ++ [r] ++ [1]*(rank-d)), ...)
    after:  Reshape(Expand(Unsqueeze(x, d+1), shape(x)[:d+1] ++ [r] ++ shape(x)[d+1:]), shape(x)[:d] ++ [-1] ++ shape(x)[d+1:])
    """
    if isinstance(repeats, int):
        from onnxscript.function_libs.torch_lib.ops.core import aten_repeat_interleave_self_int

        return aten_repeat_interleave_self_int(self, repeats, dim, output_size)
    from onnxscript import opset18 as op

    if dim is None:
        self, dim, rank = op.Reshape(self, op.Constant(value_ints=[-1])), 0, 1
    else:
        rank = len(self.shape)
    pos = (dim + rank) % rank
    count = op.Reshape(op.Cast(repeats, to=7), op.Constant(value_ints=[-1]))  # int64 [1]
    head, tail = op.Shape(self, start=0, end=pos + 1), op.Shape(self, start=pos + 1)
    tiled = op.Expand(op.Unsqueeze(self, op.Constant(value_ints=[pos + 1])), op.Concat(head, count, tail, axis=0))
    merged = op.Concat(op.Shape(self, start=0, end=pos), op.Constant(value_ints=[-1]), tail, axis=0)
    return op.Reshape(tiled, merged)


def _aten_choose_qparams_tensor(self, quant_min: int, quant_max: int, eps: float, dtype: int):
    """Dynamic int8 activations (``int8(dynamic=True)``): PT2E computes each call's scale and zero point
    with ``quantized_decomposed.choose_qparams.tensor``, which has no ONNX function ("No ONNX function
    found for quantized_decomposed.choose_qparams.tensor"). torch's arithmetic (``determine_qparams``,
    per-tensor affine), in ONNX ops: the range widened to include 0, scale = range / (qmax - qmin) but at
    least ``eps``, zero point = qmin - round(min / scale) clamped to [qmin, qmax] (Round is half to
    even in both). Returned as torch does: a [1] double scale and a [1] int64 zero point.

    before: choose_qparams.tensor(x, -128, 127, eps, int8)
    after:  (Cast(Max((max(x,0) - min(x,0)) / 255, eps), double), Cast(Clip(-128 - Round(min / scale)), int64))
    """
    from onnxscript import opset18 as op

    zero = op.CastLike(op.Constant(value_float=0.0), self)
    low = op.Min(op.ReduceMin(self, keepdims=0), zero)
    high = op.Max(op.ReduceMax(self, keepdims=0), zero)
    scale = op.Max(op.Div(op.Sub(high, low), op.CastLike(op.Constant(value_float=float(quant_max - quant_min)), self)),
                   op.CastLike(op.Constant(value_float=eps), self))
    qmin, qmax = op.CastLike(op.Constant(value_float=float(quant_min)), self), op.CastLike(op.Constant(value_float=float(quant_max)), self)
    zero_point = op.Clip(op.Sub(qmin, op.Round(op.Div(low, scale))), qmin, qmax)
    one = op.Constant(value_ints=[1])
    return op.Reshape(op.Cast(scale, to=11), one), op.Reshape(op.Cast(zero_point, to=7), one)  # double, int64


def _aten_quantize_per_tensor_tensor(self, scale, zero_point, quant_min: int, quant_max: int, dtype: int):
    """``quantize_per_tensor.tensor``: a per-tensor quantize whose scale and zero point are tensors
    computed in the graph (dynamic activations). torchlib's translation makes the zero point a constant
    of the traced value, which a tensor computed per call is not: QuantizeLinear with the [1] double
    scale and int64 zero point cast to a scalar float and a scalar of the quantized type.

    before: quantize_per_tensor.tensor(x, s, z, -128, 127, int8)    after: QuantizeLinear(x, float(s[0]), int8(z[0]))
    """
    from onnxscript import opset18 as op

    scalar = op.Constant(value_ints=[])
    return op.QuantizeLinear(self, op.Reshape(op.CastLike(scale, self), scalar), op.Reshape(op.Cast(zero_point, to=dtype), scalar))


def _aten_dequantize_per_tensor_tensor(self, scale, zero_point, quant_min: int, quant_max: int, dtype: int, out_dtype: int = -1):
    """``dequantize_per_tensor.tensor``, the inverse of ``_aten_quantize_per_tensor_tensor`` (the same reason).

    before: dequantize_per_tensor.tensor(q, s, z, -128, 127, int8)    after: DequantizeLinear(q, float(s[0]), int8(z[0]))
    """
    from onnxscript import opset18 as op

    scalar = op.Constant(value_ints=[])
    value = op.DequantizeLinear(self, op.Reshape(op.Cast(scale, to=1), scalar), op.Reshape(op.Cast(zero_point, to=dtype), scalar))
    return value if out_dtype in (-1, None) else op.Cast(value, to=out_dtype)


_ONNX_TRANSLATION_TABLE: dict[Any, Any] = {
    torch.ops.aten._is_all_true.default: _aten_is_all_true,
    torch.ops.aten.scatter_reduce.two: _aten_scatter_reduce,
    torch.ops.aten.erfinv.default: _aten_erfinv,
    torch.ops.prims.erf_inv.default: _aten_erfinv,
    torch.ops.aten.cummax.default: _aten_cummax,
    torch.ops.aten.cummin.default: _aten_cummin,
    torch.ops.aten.repeat_interleave.self_int: _aten_repeat_interleave_self_int,
}


def _quantized_translations() -> dict[Any, Any]:
    """The dynamic int8 translations, keyed by ops that exist once torchao's quantized_decomposed
    library is loaded (it is, whenever a quantized program is exported). Named ``_aten_*`` like every
    translation, though the ops are quantized_decomposed ones: the spec's grep lists the table by that prefix."""
    try:
        import torch.ao.quantization.fx._decomposed  # noqa: F401 - defines torch.ops.quantized_decomposed

        ops = torch.ops.quantized_decomposed
        return {ops.choose_qparams.tensor: _aten_choose_qparams_tensor,
                ops.quantize_per_tensor.tensor: _aten_quantize_per_tensor_tensor,
                ops.dequantize_per_tensor.tensor: _aten_dequantize_per_tensor_tensor}
    except (ImportError, AttributeError, RuntimeError):
        return {}


_ONNX_TRANSLATION_TABLE.update(_quantized_translations())


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
