"""ONNX FX node fixes: nodes torch.onnx cannot lower, rewritten before lowering.
"""

from __future__ import annotations

import operator

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from exporters.utils import NewNodes, copy_source_meta, fake_val, register_fx_node_fix, replace_node

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


_RESHAPES = (torch.ops.aten.view.default, torch.ops.aten.reshape.default, torch.ops.aten._unsafe_view.default)


@register_fx_node_fix("onnx")
def _fix_reshape_to_empty(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """A view to a shape with a literal 0 beside a dynamic size (``k_rot.view(b, 1, S, 0)`` where the
    config's qk_rope_head_dim is 0: Glm5Next, MistralLarge4's language model) lowers to an ONNX Reshape
    whose target the ONNX passes turn into ``[b, 1, -1, 0]``; ONNX Runtime refuses it at load ("Invalid
    Target shape product of 0. Product cannot be 0 in combination with -1"). The tensor has no elements,
    so nothing of the input is read: make it as zeros of the view's shape (ConstantOfShape), which keeps
    every dim.

    before: y = view(x, [b, 1, S, 0])    after: y = new_zeros(x, [b, 1, S, 0])
    """
    if node.op != "call_function" or node.target not in _RESHAPES or len(node.args) < 2:
        return False
    shape = node.args[1]
    if not isinstance(shape, (list, tuple)):
        return False
    literal = [d for d in shape if isinstance(d, int)]
    if 0 not in literal or len(literal) == len(shape):  # no 0, or a constant target (no -1 is made)
        return False
    with gm.graph.inserting_before(node):
        out = gm.graph.call_function(torch.ops.aten.new_zeros.default, (node.args[0], list(shape)))
    replace_node(gm, node, (out,))
    return True
