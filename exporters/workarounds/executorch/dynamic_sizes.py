"""ExecuTorch node fixes: sizes the lowering would specialize or plan wrongly (nonzero, data-dependent
slice bounds, symbolic empty tensors, a cat of empty inputs).
"""

from __future__ import annotations

import operator
import sys

import torch

from exporters.utils import NewNodes, copy_source_meta, fake_val, register_fx_node_fix, replace_node, replace_unpacked, size_value


@register_fx_node_fix("executorch")
def _fix_nonzero_as_masked_select(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """torch declares ``nonzero``'s [n, ndim] output column-major (strides ``(1, n)``, as ATen's CPU
    kernel fills it), ExecuTorch takes each tensor's dim order from the fake strides, and its
    portable nonzero kernel writes row-major. The program so labelled nonzero's output, and what
    follows it, with dim order (1, 0): the next kernel that checks dim order refused ("2 input
    tensors have different dim orders" in slice_copy: MusicFlamingo, OneFormer) and a bare
    ``return x.nonzero()`` came back with its indices scrambled. Select the flat positions of the
    nonzero elements instead (one masked_select, row-major like nonzero's order) and unravel them
    into per-dim indices, all contiguous.

    before: nonzero(x)                                   # [n, d], column-major
    after:  p = masked_select(arange(numel).view(shape), x != 0)
            (p[:, None] // tensor(strides)) % tensor(sizes)  # [n, d], row-major
    before: rows, cols = where(x)                        # columns of nonzero(x)
    after:  rows, cols = p // stride0, (p // stride1) % size1

    The count stays the nonzero's own unbacked size (its fake values are reused), so what the
    graph already derived from it still holds. Sizes may be symbolic (dynamic exports).
    """
    aten = torch.ops.aten
    unpacked = node.target in (aten.where.default, aten.nonzero_numpy.default)  # a tuple of index columns
    if node.op != "call_function" or not (node.target is aten.nonzero.default or unpacked) or len(node.args) != 1:
        return False
    x = node.args[0]
    xv, out = fake_val(x), node.meta.get("val")
    if unpacked and (out is None or any(u.target is not operator.getitem for u in node.users)):
        return False
    count = (out[0] if unpacked else out).shape[0] if out is not None else None
    if xv is None or count is None or xv.dim() == 0:
        return False
    g = gm.graph
    new = NewNodes(g)
    with g.inserting_before(node):
        def mul(a, b):  # an int, or a node of size arithmetic when either is symbolic
            return a * b if isinstance(a, int) and isinstance(b, int) else new.call(operator.mul, a, b)

        sizes = [s if isinstance(s, int) else new.call(aten.sym_size.int, x, k) for k, s in enumerate(xv.shape)]
        strides = [1]
        for size in reversed(sizes[1:]):
            strides.insert(0, mul(size, strides[0]))
        flat = new.call(aten.arange.default, mul(strides[0], sizes[0]), dtype=torch.int64)
        grid = new.call(aten.view.default, flat, sizes)
        mask = new.call(aten.ne.Scalar, x, 0)
        picked = new.call(aten.masked_select.default, grid, mask)
        picked.meta["val"] = xv.new_empty((count,), dtype=torch.int64)  # the nonzero's own count, no new symbol
        if unpacked:  # where(x) / nonzero_numpy(x): column k is (p // stride_k) % size_k
            columns = {}
            for k, (size, stride) in enumerate(zip(sizes, strides)):
                col = picked
                if stride != 1:
                    col = new.call(aten.div.Scalar_mode, col, stride, rounding_mode="floor")
                if k > 0:
                    col = new.call(aten.remainder.Scalar, col, size)
                columns[k] = col
            copy_source_meta(node, new)
            replace_unpacked(gm, node, columns)
            return True
        column = new.call(aten.unsqueeze.default, picked, -1)
        if len(sizes) > 1:  # row-wise (p // strides) % sizes, broadcast: stacking n-long columns gives
            # [0, 0] instead of [0, d] in the runtime when n == 0, a [d] vector of each has no such edge
            def vector(values):
                scalars = [new.call(aten.scalar_tensor.default, v, dtype=torch.int64) for v in values]
                return new.call(aten.stack.default, scalars)

            column = new.call(aten.div.Tensor_mode, column, vector(strides), rounding_mode="floor")
            new.call(aten.remainder.Tensor, column, vector(sizes))
    replace_node(gm, node, new)
    return True




@register_fx_node_fix("executorch")
def _fix_slice_bounds_checked(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """A slice bound read from data (``hidden_states[i, :length]`` with ``length`` from the attention
    mask: the XVector heads of Wav2Vec2, WavLM, Data2VecAudio, UniSpeechSat) is an unbacked symbol.
    torch.export's fake slice handles it, but the lowering turns the slice into slice_copy, whose meta
    is the decomposition that asks whether the bound is negative: "Could not guard on data-dependent
    expression u42 < 0" (caused by slice_forward). Check the bound is within [0, size] at run time
    (the artifact then refuses a negative or too-long bound instead of computing what eager's
    clamping would), which lets the decomposition decide its comparisons.

    before: slice(x, d, 0, u0)
    after:  _assert_scalar(u0 >= 0); _assert_scalar(u0 <= x.size(d)); slice(x, d, 0, u0)

    The size may itself be data-dependent (SuperPoint writes each image's u29 keypoints into rows
    padded to Max(u29, u31): "Could not guard on data-dependent expression u29 > Max(u29, u31)").

    Once the checks decide the bound, re-tracing the slice gives it the bound's own size, where the
    traced graph gave it a fresh symbol: ``slice(x, 0, None, u0)`` was ``[u1, ...]``, re-traced ``[u0, ...]``.
    The lowering's re-trace then renames u0 to u1 for the first slice and fails at a second slice
    with the same bound (Data2VecAudioForXVector's mean and std over ``hidden_states[i, :length]``:
    "AssertionError: u0 -> u1" in ``rebind_unbacked``). So the slice's fresh symbol is made the
    bound (``_slice_size_is_its_bound``) and no longer bound by the node.
    """
    import operator

    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols, statically_known_true

    if node.op != "call_function" or node.target is not torch.ops.aten.slice.Tensor:
        return False
    x = node.args[0]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    size = x.meta["val"].shape[dim] if isinstance(x, torch.fx.Node) and "val" in x.meta else None
    if not isinstance(size, (int, torch.SymInt)):
        return False
    changed = False
    for bound in node.args[2:4]:
        value = fake_val(bound)
        if not isinstance(value, torch.SymInt) or not free_unbacked_symbols(value):
            continue
        if statically_known_true(value >= 0) and statically_known_true(value <= size):
            continue
        torch._check(value >= 0)
        torch._check(value <= size)
        made = NewNodes(gm.graph)
        with gm.graph.inserting_before(node):
            limit_node = size if isinstance(size, int) else made.call(torch.ops.aten.sym_size.int, x, dim)
            for op, limit, what in ((operator.ge, 0, ">= 0"), (operator.le, limit_node, f"<= {size}")):
                made.call(torch.ops.aten._assert_scalar.default, made.call(op, bound, limit),
                          f"slice bound {bound.name} must be {what} (dim {dim} of {x.name}) in this ExecuTorch program")
        copy_source_meta(node, made)
        changed = True
    return _slice_size_is_its_bound(node, dim) or changed


def _slice_size_is_its_bound(node: torch.fx.Node, dim: int) -> bool:
    """After ``_fix_slice_bounds_checked``: when the slice's start and end are now known to lie in
    [0, size] (what re-tracing it decides too), its size along ``dim`` is ``end - start``. The traced
    meta gave it a fresh unbacked symbol: tell the shape environment that symbol equals ``end - start``
    and drop the node's binding of it, so a re-trace has nothing to rename. This holds for every such
    slice, also one whose bound an earlier slice's checks decided. Returns whether it changed the node."""
    import sympy
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    val, bindings = node.meta.get("val"), node.meta.get("unbacked_bindings")
    if not isinstance(val, torch.Tensor) or not bindings:
        return False
    size = val.shape[dim]
    x = node.args[0]
    full = x.meta["val"].shape[dim]
    def value(i, default):
        arg = node.args[i] if len(node.args) > i else None
        arg = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg
        return default if arg is None or (isinstance(arg, int) and arg >= sys.maxsize) else arg

    start, end, step = value(2, 0), value(3, full), value(4, 1)
    if not isinstance(size, torch.SymInt) or step != 1 or size.node.expr not in bindings:
        return False
    decided = all(statically_known_true(b >= 0) and statically_known_true(b <= full) for b in (start, end))
    if not (decided and statically_known_true(end >= start)):
        return False
    length, symbol, shape_env = end - start, size.node.expr, size.node.shape_env
    target = length.node.expr if isinstance(length, torch.SymInt) else sympy.Integer(length)
    shape_env._set_replacement(symbol, target, "slice bounds checked")
    if shape_env.replacements.get(symbol) != target:
        return False  # the shape environment refused it: keep the binding
    rest = {k: v for k, v in bindings.items() if k != symbol}
    if rest:
        node.meta["unbacked_bindings"] = rest
    else:
        del node.meta["unbacked_bindings"]
    return True




_EMPTY = (torch.ops.aten.new_empty.default, torch.ops.aten.empty.memory_format)


@register_fx_node_fix("executorch")
def _fix_symbolic_empty_as_full(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """ExecuTorch's edge lowering turns ``empty`` into ``dim_order_ops::_empty_dim_order``, whose ``size``
    is ``int[]``, not ``SymInt[]`` (MemoryFormatOpsPass, exir/passes/dim_order_ops_registry.py): calling it
    with symbolic sizes reads each one as an int, which specializes the input dims behind them to their
    traced values in a frozen shape environment ("Ignored guard s70 == 7, this could result in accuracy
    problems"). The whole program is then planned static: the DeepSeek-V3-style MLA ``expand_kv``
    (``kv_nope.new_empty(batch, heads, seq, dim)``, 17 model families) refused every other sequence
    length ("Attempted to resize a bounded tensor with a maximum capacity of 14 elements to 16"). An
    empty tensor's contents are undefined, so a zero-filled one of the same size is a valid value;
    ``full`` takes ``SymInt[]`` and stays dynamic. Static sizes are left alone.

    before: e = new_empty(x, [s0, 4, s1, 12])        after: e = full([s0, 4, s1, 12], 0, dtype=x.dtype)
    """
    if node.op != "call_function" or node.target not in _EMPTY:
        return False
    val = fake_val(node)
    if val is None or not any(isinstance(d, torch.SymInt) for d in val.shape):
        return False
    if node.target is torch.ops.aten.empty.memory_format and node.kwargs.get("memory_format") not in (
            None, torch.contiguous_format, torch.preserve_format):
        return False
    size = node.args[1] if node.target is torch.ops.aten.new_empty.default else node.args[0]
    _zeros_in_place_of(gm, node, NewNodes(gm.graph), size)
    return True




def _zeros_in_place_of(gm: torch.fx.GraphModule, node: torch.fx.Node, made: NewNodes, sizes: list) -> None:
    """Replace ``node`` by ``full(sizes, 0)`` of its dtype and device (its fake value kept); ``made`` holds
    the nodes already added for ``sizes``."""
    val = fake_val(node)
    with gm.graph.inserting_before(node):
        full = made.call(torch.ops.aten.full.default, sizes, 0, dtype=val.dtype, device=val.device)
    full.meta["val"] = val
    copy_source_meta(node, made)
    node.replace_all_uses_with(full)
    gm.graph.erase_node(node)


@register_fx_node_fix("executorch")
def _fix_empty_cat_as_full(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """ExecuTorch's PruneEmptyTensorsPass replaces a ``cat`` whose inputs are all empty with
    ``full(tuple(out.meta["val"].shape), 0)`` (exir/passes/prune_empty_tensors_pass.py): with dynamic
    shapes that tuple holds SymInt objects, not graph nodes, and the emitter stops ("Unsupported type
    encountered in int list", at ``aten.full.out(args = ((s43, 1, s53, 0), 0))``). Glm5Next's MLA has no
    rotary part (``qk_rope_head_dim = 0``), so its cache update concatenates (B, 1, S, 0) keys. Done here
    first, with the sizes as graph values: the same empty tensor, and nothing left for that pass.

    before: y = cat([a[s0, 1, s1, 0], b[s0, 1, s2, 0]], 2)
    after:  y = full([sym_size(a, 0), 1, sym_size(a, 2) + sym_size(b, 2), 0], 0, dtype=a.dtype)
    """
    if node.op != "call_function" or node.target is not torch.ops.aten.cat.default:
        return False
    val, parts = fake_val(node), list(node.args[0])
    if val is None or not parts or not any(isinstance(d, torch.SymInt) for d in val.shape):
        return False
    vals = [fake_val(p) for p in parts]
    if any(v is None for v in vals) or not any(isinstance(d, int) and d == 0 for d in val.shape):
        return False  # not certainly empty
    dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % val.dim()
    # a legacy 1-D empty input (a cache's initial torch.tensor([])) takes no part in the sizes
    ranked = [(part, value) for part, value in zip(parts, vals) if value.dim() == val.dim()]
    if not ranked:
        return False
    made = NewNodes(gm.graph)
    with gm.graph.inserting_before(node):
        sizes = []
        for d in range(val.dim()):
            if d != dim:
                sizes.append(size_value(made, ranked[0][0], d, ranked[0][1].shape[d]))
                continue
            total, *rest = [size_value(made, part, d, value.shape[d]) for part, value in ranked]
            for extent in rest:
                total = total + extent if isinstance(total, int) and isinstance(extent, int) else \
                    made.call(operator.add, total, extent)
            sizes.append(total)
    _zeros_in_place_of(gm, node, made, sizes)
    return True
