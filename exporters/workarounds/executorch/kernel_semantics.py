"""ExecuTorch node fixes: ops whose kernel exists but computes or accepts something other than ATen
(XNNPACK's tanh GELU, negative and circular padding, int32 indices, float32 per-channel quantize
scales, C-style remainder, 3-D convolution, alias, unbatched pooling).
"""

from __future__ import annotations

import math
import operator
import sys

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from exporters.utils import NewNodes, copy_source_meta, fake_val, register_fx_node_fix, replace_node, size_value


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
    replace_node(gm, node, (cube, inner, scaled, one_plus, out))
    return True




@register_fx_node_fix("executorch")
def _fix_negative_pad_as_slice(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """A negative pad crops; the ExecuTorch runtime's constant_pad_nd refuses it: "Padding values
    must be non-negative, but got pad[3] = -1" (RWKV's token shift is ``ZeroPad2d((0, 0, 1, -1))``:
    one row of zeros in front, the last row cut). Slice the cropped sides off first, then pad
    the rest. A symbolic pad that may be negative (RecurrentGemma keeps the last ``conv1d_width - 1``
    positions of its prompt as ``pad(x, (conv1d_width - seq_len - 1, 0))``: -4 for a prompt of 7, the
    runtime refused it) is cropped by ``max(-p, 0)`` and padded by ``max(p, 0)``, SymInt ops.

    before: constant_pad_nd(x, [0, 0, 1, -1])                  # pad(x, ..., "constant") alike
    after:  constant_pad_nd(slice(x, -2, 0, -1), [0, 0, 1, 0])
    before: constant_pad_nd(x, [p, 0])                          # p a SymInt of unknown sign
    after:  constant_pad_nd(slice(x, -1, sym_max(-p, 0), None), [sym_max(p, 0), 0])
    """
    aten = torch.ops.aten
    if node.op != "call_function" or node.target not in (aten.constant_pad_nd.default, aten.pad.default):
        return False
    args = dict(zip(("self", "pad", "mode", "value"), node.args), **node.kwargs)
    pad, mode = args["pad"], args.get("mode", "constant")

    def signed(p) -> bool:  # a symbolic pad not known to be non-negative
        return isinstance(fake_val(p), torch.SymInt) and not statically_known_true(fake_val(p) >= 0)

    if mode != "constant" or not all(isinstance(p, int) or isinstance(fake_val(p), torch.SymInt) for p in pad) \
            or not any(signed(p) or (isinstance(p, int) and p < 0) for p in pad):
        return False
    new, x = NewNodes(gm.graph), args["self"]

    def sym(op, *operands):  # a SymInt node, with its value
        made = new.call(op, *operands)
        made.meta["val"] = op(*(fake_val(o) if isinstance(o, torch.fx.Node) else o for o in operands))
        return made

    with gm.graph.inserting_before(node):
        kept = []
        for i in range(len(pad) // 2):
            left, right = pad[2 * i], pad[2 * i + 1]
            if signed(left) or signed(right):
                start = sym(torch.sym_max, sym(operator.neg, left), 0) if signed(left) else max(-left, 0)
                end = right if not signed(right) and right < 0 else None
                if signed(right):  # the dim's size less max(-right, 0)
                    whole = fake_val(args["self"])
                    size = size_value(new, args["self"], whole.dim() - 1 - i, whole.shape[-1 - i])
                    if isinstance(size, torch.fx.Node):
                        size.meta["val"] = whole.shape[-1 - i]
                    end = sym(operator.add, size, sym(torch.sym_min, right, 0))
                x = new.call(aten.slice.Tensor, x, -1 - i, start, end)
                kept += [sym(torch.sym_max, p, 0) if signed(p) else max(p, 0) for p in (left, right)]
                continue
            if left < 0 or right < 0:
                x = new.call(aten.slice.Tensor, x, -1 - i, max(-left, 0), right if right < 0 else None)
            kept += [max(left, 0), max(right, 0)]
        value = args.get("value")
        new.call(aten.constant_pad_nd.default, x, kept, 0.0 if value is None else value)
    replace_node(gm, node, new)
    return True




_LONG_INDEX_OPS = (torch.ops.aten.gather.default, torch.ops.aten.scatter_add.default, torch.ops.aten.scatter_add_.default,
                   torch.ops.aten.scatter.src, torch.ops.aten.scatter_.src, torch.ops.aten.scatter.value,
                   torch.ops.aten.scatter_.value)  # the traced program keeps in-place ops; the index is args[2]


@register_fx_node_fix("executorch")
def _fix_int32_index_as_int64(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The portable ``gather`` / ``scatter`` / ``scatter_add`` kernels take int64 indices only, where
    eager also takes int32 (Glm5Next's MoE: "[index_util.cpp:156] Check failed (index.scalar_type() ==
    ScalarType::Long): Expected dtype int64 for index; index.scalar_type() = Int ... op_scatter_add").
    Widen an int32 index before the op; the values are the same.

    before: scatter_add(x, dim, index.int32, src)    after: scatter_add(x, dim, index.to(int64), src)
    """
    if node.op != "call_function" or node.target not in _LONG_INDEX_OPS:
        return False
    index = node.args[2] if len(node.args) > 2 else None
    val = fake_val(index)
    if val is None or val.dtype != torch.int32:
        return False
    return _widen_arg(gm, node, 2, torch.int64)


def _widen_arg(gm: torch.fx.GraphModule, node: torch.fx.Node, position: int, dtype: torch.dtype) -> bool:
    """``node``'s argument at ``position`` cast to ``dtype`` by a ``_to_copy`` inserted before it."""
    made = NewNodes(gm.graph)
    with gm.graph.inserting_before(node):
        wide = made.call(torch.ops.aten._to_copy.default, node.args[position], dtype=dtype)
    copy_source_meta(node, made)
    node.update_arg(position, wide)
    return True




def _quantize_per_channel_ops() -> tuple:
    ops = getattr(torch.ops, "quantized_decomposed", None)
    try:
        return (ops.quantize_per_channel.default,) if ops is not None else ()
    except (AttributeError, RuntimeError):  # torchao's quantized_decomposed ops not registered
        return ()


@register_fx_node_fix("executorch")
def _fix_quantize_per_channel_double_scales(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The portable ``quantize_per_channel`` kernel takes float64 scales only, where PT2E's op also
    takes the float32 scales ``convert_pt2e`` writes. A per-channel quantize that stays outside the
    XNNPACK delegate (a weight that is not a constant when it is quantized: DeepseekV3's and GlmMoeDsa's
    experts) aborted the runtime ("[op_quantize.cpp:427] In function quantize_per_channel_out(), assert
    failed (scale.scalar_type() == ScalarType::Double)"). Widen the scales before the op; XNNPACK does not
    take a per-channel quantize of a computed tensor, so no delegated node changes.

    before: quantize_per_channel(w, scales.float32, ...)    after: quantize_per_channel(w, scales.to(float64), ...)
    """
    if node.op != "call_function" or node.target not in _quantize_per_channel_ops():
        return False
    scales = node.args[1] if len(node.args) > 1 else None
    val = fake_val(scales)
    if val is None or val.dtype != torch.float32:
        return False
    return _widen_arg(gm, node, 1, torch.float64)


_REMAINDERS = (torch.ops.aten.remainder.Tensor, torch.ops.aten.remainder.Scalar)


@register_fx_node_fix("executorch")
def _fix_integer_remainder_floored(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The ExecuTorch runtime's integer ``remainder`` keeps the dividend's sign, as C's ``%`` does
    (``-1 % 8`` gives -1), where torch's takes the divisor's (7); float remainder is right.
    EfficientLoFTR marks unmatched points with index -1 and takes ``index % width``: half its
    keypoints came back one image width off. A nonzero result whose sign differs from the
    divisor's gets the divisor added, which is torch's remainder from C's (and a no-op on a
    runtime that already floors).

    before: r = remainder(a, b)
    after:  t = remainder(a, b); r = where((t != 0) & ((t < 0) ^ (b < 0)), t + b, t)
    """
    if node.op != "call_function" or node.target not in _REMAINDERS or node.meta.get("floored_remainder"):
        return False
    val = fake_val(node)
    if val is None or val.dtype.is_floating_point or val.dtype.is_complex or val.dtype == torch.bool:
        return False
    aten, made = torch.ops.aten, NewNodes(gm.graph)
    truncated, divisor = node, node.args[1]
    size_divisor = isinstance(divisor, torch.fx.Node) and isinstance(fake_val(divisor), torch.SymInt)
    if size_divisor and not statically_known_true(fake_val(divisor) >= 1):
        return False  # a symbolic divisor of unknown sign: no tensor to compare (never seen; sizes are >= 1)
    users = list(node.users)
    with gm.graph.inserting_before(node.next):
        negative = made.call(aten.lt.Scalar, truncated, 0)
        if size_divisor:  # a size (Reformer's sequence length): positive, added as a Scalar
            differs = negative
            shifted = made.call(aten.add.Scalar, truncated, divisor)
        elif isinstance(divisor, torch.fx.Node):
            differs = made.call(aten.logical_xor.default, negative, made.call(aten.lt.Scalar, divisor, 0))
            shifted = made.call(aten.add.Tensor, truncated, divisor)
        else:
            differs = negative if divisor > 0 else made.call(aten.gt.Scalar, truncated, 0)
            shifted = made.call(aten.add.Scalar, truncated, divisor)
        wrong = made.call(aten.logical_and.default, made.call(aten.ne.Scalar, truncated, 0), differs)
        fixed = made.call(aten.where.self, wrong, shifted, truncated)
    copy_source_meta(node, made)
    for user in users:
        user.replace_input_with(node, fixed)
    node.meta["floored_remainder"] = True  # a second pass leaves it alone
    return True


@register_fx_node_fix("executorch")
def _fix_symint_mod_floored(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The runtime's ``executorch_prim::mod.Scalar`` (a Python ``%`` on sizes in the graph) is C's ``%``:
    the result takes the dividend's sign, where Python's takes the divisor's. LongT5's local attention pads
    the sequence by ``(-seq) % block_len``: the runtime computed -7 for 121, ``constant_pad_nd`` refused the
    negative pad (portable kernel) and XNNPACK's pad divided by zero (the process died of SIGFPE). With a
    positive divisor, ``((a % b) + b) % b`` is Python's result under either convention.

    before: r = a % b                 after: r = ((a % b) + b) % b        (SymInts, b > 0 constant)
    """
    if node.op != "call_function" or node.target is not operator.mod or node.meta.get("floored_mod"):
        return False
    divisor = node.args[1]
    if not isinstance(divisor, int) or divisor <= 0 or not isinstance(fake_val(node), torch.SymInt):
        return False
    made = NewNodes(gm.graph)
    with gm.graph.inserting_after(node):
        shifted = made.call(operator.add, node, divisor)
    with gm.graph.inserting_after(shifted):
        floored = made.call(operator.mod, shifted, divisor)
    shifted.meta["val"] = fake_val(node) + divisor
    floored.meta["val"] = fake_val(node)
    floored.meta["floored_mod"] = True
    copy_source_meta(node, made)
    node.replace_all_uses_with(floored, delete_user_cb=lambda user: user is not shifted)
    return True




@register_fx_node_fix("executorch")
def _fix_circular_pad_as_cat(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The lowering decomposes circular padding (``F.pad(x, p, mode="circular")``, Autoformer's and
    Informer's ``padding_mode="circular"`` convolutions) into a ``new_empty`` of the padded shape and
    copies into it. That empty becomes ``dim_order_ops::_empty_dim_order``, whose ``int[] size`` reads
    each symbolic size as an int (see ``_fix_symbolic_empty_as_full``): AutoformerModel's batch was
    specialized to its traced 2 and the program refused batch 3 (``set_inputs`` 0x10). Circular
    padding of a dim is the tail wrapped before it and the head after it: a ``cat`` of slices, which
    stays symbolic. Padding dims one after another wraps the corners as ``F.pad`` does.

    before: y = pad(x, [l, r], "circular")
    after:  y = cat([x[..., -l:], x, x[..., :r]], -1)
    Only for a tensor with a symbolic size and non-negative pads no wider than their dim.
    """
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if node.op != "call_function" or node.target is not torch.ops.aten.pad.default:
        return False
    mode = node.args[2] if len(node.args) > 2 else node.kwargs.get("mode", "constant")
    x, pads = node.args[0], node.args[1]
    val = fake_val(x)
    if mode != "circular" or val is None or not any(isinstance(d, torch.SymInt) for d in val.shape):
        return False
    if not all(isinstance(p, int) and p >= 0 for p in pads) or len(pads) % 2:
        return False
    if not all(statically_known_true(val.shape[-1 - i // 2] >= pads[i]) for i in range(len(pads))):
        return False
    aten, made = torch.ops.aten, NewNodes(gm.graph)
    out = x
    with gm.graph.inserting_before(node):
        for i in range(0, len(pads), 2):
            left, right, dim = pads[i], pads[i + 1], val.dim() - 1 - i // 2
            parts = ([made.call(aten.slice.Tensor, out, dim, -left, sys.maxsize)] if left else []) + [out] + (
                [made.call(aten.slice.Tensor, out, dim, 0, right)] if right else [])
            if len(parts) > 1:
                out = made.call(aten.cat.default, parts, dim)
    if out is x:
        return False
    replace_node(gm, node, made)
    return True




def _known_int(size) -> int | None:
    """A size as an int when it has one value: an int, or a SymInt a guard pinned to a number (VJEPA2's
    channel dim, Dim.AUTO specialized to 3, prints as 3 but is still a SymInt)."""
    return size if isinstance(size, int) else size.node.maybe_as_int()


def _conv_args(node: torch.fx.Node):
    """(x, weight, bias, stride, padding, dilation, groups) of a 3-D convolution node, else None."""
    aten = torch.ops.aten
    if node.op != "call_function":
        return None
    if node.target is aten.conv3d.default:
        names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
        defaults = (None, None, None, [1, 1, 1], [0, 0, 0], [1, 1, 1], 1)
    elif node.target is aten.convolution.default:
        names = ("input", "weight", "bias", "stride", "padding", "dilation", "transposed", "output_padding", "groups")
        defaults = (None,) * 9
    else:
        return None
    args = dict(zip(names, defaults))
    args.update(zip(names, node.args))
    args.update(node.kwargs)
    x = fake_val(args["input"])
    w = fake_val(args["weight"])
    if x is None or w is None or x.dim() != 5 or args.get("transposed"):
        return None
    # the batch, the frames and the spatial sizes may be symbolic (read back with sym_size); channels
    # and the kernel must be static (the taps are unrolled)
    if any(_known_int(d) is None for d in (x.shape[1], *w.shape)):
        return None
    triple = lambda v: list(v) * 3 if len(v) == 1 else list(v)  # noqa: E731
    return (args["input"], args["weight"], args["bias"], triple(args["stride"]), triple(args["padding"]),
            triple(args["dilation"]), args["groups"])


@register_fx_node_fix("executorch")
def _fix_conv3d_as_conv2d(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Neither XNNPACK nor the portable kernels run a 3-D convolution: the program lowers, then fails
    at run time, "Check failed (in.dim() == 3 || in.dim() == 4): Expect input tensor to be 3-D or
    4-D, but got, 5" and "method->execute() failed with error 0x12" (the Conv3d patch embeddings of
    Qwen2-VL, Glm4v and the other video-capable VLMs, VideoMAE's tubelets). A 3-D convolution is a
    sum over its temporal taps of 2-D convolutions of strided frame slices, frames folded into the
    batch: kt 2-D convolutions, whatever the number of frames.

    before: conv3d(x[N, C, T, H, W], w[O, C/g, kt, kh, kw], b, stride, padding, dilation, g)
    after:  x padded in T; for each tap i: conv2d(fold(x[:, :, i*dt :: st][:, :, :T_out]), w[:, :, i],
            b if i == 0 else None, stride[1:], padding[1:], dilation[1:], g); summed; unfolded to
            [N, O, T_out, H', W']
    A symbolic frame count (a video model's dynamic num_frames: VideoMAE, ViViT) takes T_out from the
    last tap's slice, x[:, :, (kt-1)*dt :: st], which has exactly T_out frames.
    """
    found = _conv_args(node)
    if found is None:
        return False
    x, weight, bias, (st, sh, sw), (pt, ph, pw), (dt, dh, dw), groups = found
    _, c, t, h, w = node.args[0].meta["val"].shape
    _, o, t_out, h_out, w_out = node.meta["val"].shape
    c, o, kt = _known_int(c), _known_int(o), _known_int(weight.meta["val"].shape[2])
    t_out = _known_int(t_out) or t_out
    aten, made = torch.ops.aten, NewNodes(gm.graph)
    call = made.call
    with gm.graph.inserting_before(node):
        if pt:
            x = call(aten.constant_pad_nd.default, x, [0, 0, 0, 0, pt, pt], 0.0)
        total = None
        h, w = size_value(made, x, 3, h), size_value(made, x, 4, w)
        if not isinstance(t_out, int):
            last = call(aten.slice.Tensor, x, 2, (kt - 1) * dt, sys.maxsize, st)
            t_out = call(aten.sym_size.int, last, 2)
        for i in range(kt):
            if isinstance(t_out, int):
                frames = call(aten.slice.Tensor, x, 2, i * dt, i * dt + st * (t_out - 1) + 1, st)
            else:  # every tap's slice cut to T_out frames
                frames = call(aten.slice.Tensor, call(aten.slice.Tensor, x, 2, i * dt, sys.maxsize, st), 2, 0, t_out)
            folded = call(aten.reshape.default, call(aten.permute.default, frames, [0, 2, 1, 3, 4]), [-1, c, h, w])
            tap = call(aten.select.int, weight, 2, i)
            y = call(aten.convolution.default, folded, tap, bias if i == 0 else None, [sh, sw], [ph, pw],
                     [dh, dw], False, [0, 0], groups)
            total = y if total is None else call(aten.add.Tensor, total, y)
        unfolded = call(aten.reshape.default, total, [-1, t_out, o, size_value(made, total, 2, h_out),
                                                      size_value(made, total, 3, w_out)])
        call(aten.permute.default, unfolded, [0, 2, 1, 3, 4])
    replace_node(gm, node, made)
    return True


@register_fx_node_fix("executorch")
def _fix_alias_as_its_input(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """``alias`` (a full-range slice, ``x[:, :, :H, :W]`` at H, W == x's sizes) becomes ``alias_copy``,
    whose output takes its dim order from the fake strides (contiguous) and whose kernel requires the
    same dim order in and out. When an XNNPACK delegate returns its input channels-last, the run fails:
    "Check failed (tensors_have_same_dim_order(in, out))" (Swin2SR's final crop). An alias of a value
    is that value: use it directly. An alias of a graph input, or of a value the graph also returns,
    is left alone (the program would return one buffer twice, or its own input).

    before: y = alias(x)
    after:  y = x
    """
    if node.op != "call_function" or node.target is not torch.ops.aten.alias.default:
        return False
    source = node.args[0]
    if not isinstance(source, torch.fx.Node) or source.op != "call_function":
        return False
    if node not in source.users:
        # the source's use list does not hold this alias (seen after a masked_scatter that the program also
        # returns: its users read [output]); erasing the alias would then fail in fx ("KeyError: alias",
        # Qwen2-VL and Glm5Next static steps), so it is left as it is
        return False
    if any(user.op == "output" for user in source.users) and any(user.op == "output" for user in node.users):
        return False
    node.replace_all_uses_with(source)
    gm.graph.erase_node(node)
    return True


_POOLS_2D = (torch.ops.aten.max_pool2d.default, torch.ops.aten.avg_pool2d.default)


@register_fx_node_fix("executorch")
def _fix_unbatched_pool_as_batched(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """A 2-D pool over an unbatched [C, H, W] input: XNNPACK's partitioner takes it, then its channels-last
    pass refuses the 3-D tensor ("Attempting to convert non-NHWC compatible node to NHWC"; SuperPoint's
    non-maximum suppression pools each image's [1, H, W] score map). Pool a batch of one instead.

    before: max_pool2d(x[C, H, W], ...)
    after:  squeeze(max_pool2d(unsqueeze(x, 0), ...), 0)
    """
    if node.op != "call_function" or node.target not in _POOLS_2D:
        return False
    x = fake_val(node.args[0])
    if x is None or x.dim() != 3:
        return False
    aten, new = torch.ops.aten, NewNodes(gm.graph)
    with gm.graph.inserting_before(node):
        batched = new.call(aten.unsqueeze.default, node.args[0], 0)
        pooled = new.call(node.target, batched, *node.args[1:], **node.kwargs)
        new.call(aten.squeeze.dim, pooled, 0)
    replace_node(gm, node, new)
    return True
