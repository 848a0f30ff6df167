"""ExecuTorch node fixes: ops the runtime has no kernel for, rewritten with ops it has (bucketize,
bincount, erfinv, sort, cummax/cummin, embedding_bag, scatter_reduce, randn_like/rand_like,
antialiased bicubic upsampling).
"""

from __future__ import annotations

import math
import operator

import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from exporters.utils import NewNodes, copy_source_meta, fake_val, register_fx_node_fix, replace_node, replace_unpacked, size_value


@register_fx_node_fix("executorch")
def _fix_bucketize_as_comparisons(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The ExecuTorch runtime has no kernel for ``aten::bucketize.Tensor_out`` nor
    ``aten::searchsorted.Tensor_out`` (the program lowers, then fails to load: "Missing operator";
    Idefics2/3, SmolVLM and Phi-4-multimodal bucket patch coordinates with bucketize, MusicFlamingo
    searches its time grid with searchsorted). A bucket or insertion index is a count of boundaries
    below the value, so compute it with a comparison and a sum, which the portable kernels have.

    before: bucketize(x, boundaries, right=r, out_int32=i)
    after:  sum((boundaries <= x[..., None] if r else boundaries < x[..., None]).to(int32 if i else int64), -1)
    before: searchsorted(seq, x, right=r)      # seq 1-D, or [..., M] with x [..., K] (row-wise)
    after:  sum(seq <= x[..., None] if r else seq < x[..., None], -1)  # seq[..., None, :] when row-wise

    A searchsorted with a ``sorter`` is left alone (the permutation would need a gather first).
    """
    aten = torch.ops.aten
    if node.op != "call_function":
        return False
    if node.target is aten.bucketize.Tensor:
        x, boundaries = node.args[:2]
        right = node.kwargs.get("right", False)
    elif node.target in (aten.searchsorted.Tensor, aten.searchsorted.Scalar):
        boundaries, x = node.args[:2]
        if node.kwargs.get("sorter") is not None or len(node.args) > 2:
            return False
        side = node.kwargs.get("side")
        right = side == "right" if side is not None else node.kwargs.get("right", False)
    else:
        return False
    out_int32 = node.kwargs.get("out_int32", False)
    seq = fake_val(boundaries)
    if seq is None:
        return False  # without the sequence's rank, 1-D and row-wise search cannot be told apart
    new, dtype = NewNodes(gm.graph), torch.int32 if out_int32 else torch.int64
    with gm.graph.inserting_before(node):
        if node.target is aten.searchsorted.Tensor and seq.dim() > 1:
            # row-wise, seq [..., M] and x [..., K]: compare every value of a row with that row's boundaries
            boundaries = new.call(aten.unsqueeze.default, boundaries, -2)
        if isinstance(x, torch.fx.Node):
            below = new.call(aten.le.Tensor if right else aten.lt.Tensor, boundaries, new.call(aten.unsqueeze.default, x, -1))
        else:  # searchsorted.Scalar: one value, a 0-d result
            below = new.call(aten.le.Scalar if right else aten.lt.Scalar, boundaries, x)
        new.call(aten.sum.dim_IntList, new.call(aten._to_copy.default, below, dtype=dtype), [-1], dtype=dtype)
    replace_node(gm, node, new)
    return True




def _input_dim_of(gm: torch.fx.GraphModule, size: torch.SymInt) -> tuple[torch.fx.Node, int] | None:
    """(placeholder, dim) of an input whose size is exactly ``size``'s symbol, else None."""
    if free_unbacked_symbols(size) or not size.node.expr.is_Symbol:
        return None
    for node in gm.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(val, torch.Tensor):
            for d, s in enumerate(val.shape):
                if isinstance(s, torch.SymInt) and s.node.expr == size.node.expr:
                    return node, d
    return None


@register_fx_node_fix("executorch")
def _fix_bincount_of_known_length(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The ExecuTorch runtime has no kernel for ``aten::bincount.out`` (Splinter counts question
    tokens per row with ``torch.bincount(rows)``). Its length is data-dependent, but when the graph
    pins it (Splinter checks it equals the batch size; a dynamic batch is read back from the input)
    the counts are a comparison with each bin and a sum, which the portable kernels have. An unweighted bincount only; one whose length the
    graph does not pin is left alone.

    before: bincount(x)                                  # length u0, asserted == B
    after:  sum(x[:, None] == arange(B)[None, :], 0)
    """
    aten = torch.ops.aten
    if node.op != "call_function" or node.target is not aten.bincount.default:
        return False
    args = {"weights": None, "minlength": 0, **dict(zip(("self", "weights", "minlength"), node.args)), **node.kwargs}
    out, x = node.meta.get("val"), args["self"]
    xv = fake_val(x)
    if args["weights"] is not None or out is None or xv is None:
        return False
    length = out.shape[0]
    length = length if isinstance(length, int) else (length.node.maybe_as_int() or _input_dim_of(gm, length))
    if length is None:
        return False
    new = NewNodes(gm.graph)
    with gm.graph.inserting_before(node):
        if isinstance(length, tuple):  # pinned to a dynamic input size (the batch): read it back
            length = new.call(aten.sym_size.int, *length)
        bins = new.call(aten.arange.default, length, dtype=xv.dtype)
        hits = new.call(aten.eq.Tensor, new.call(aten.unsqueeze.default, x, -1), bins)
        counts = new.call(aten._to_copy.default, hits, dtype=torch.int64)
        new.call(aten.sum.dim_IntList, counts, [0], dtype=torch.int64)
    replace_node(gm, node, new)
    return True




@register_fx_node_fix("executorch")
def _fix_erfinv_as_polynomial(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The ExecuTorch runtime has no kernel for ``aten::erfinv.out`` (Gemma 3n's activation sparsity
    takes ``Normal(0, 1).icdf``: "the ExecuTorch runtime has no kernel for aten::erfinv.out"). Compute it
    with Giles' single-precision polynomial approximation, as the ONNX exporter does.

    before: erfinv(x)    after: x * where(w < 5, p_central(w - 2.5), p_tail(sqrt(w) - 3)), w = -log((1 - x)(1 + x))
    """
    from exporters.workarounds._erfinv import _ERFINV_CENTRAL, _ERFINV_TAIL

    if node.op != "call_function" or node.target is not torch.ops.aten.erfinv.default:
        return False
    aten, made = torch.ops.aten, NewNodes(gm.graph)
    call = made.call
    x = node.args[0]
    with gm.graph.inserting_before(node):
        one_minus = call(aten.rsub.Scalar, x, 1.0)
        one_plus = call(aten.add.Scalar, x, 1.0)
        w = call(aten.neg.default, call(aten.log.default, call(aten.mul.Tensor, one_minus, one_plus)))
        central = call(aten.sub.Scalar, w, 2.5)
        tail = call(aten.sub.Scalar, call(aten.sqrt.default, w), 3.0)
        p_central = call(aten.mul.Scalar, call(aten.ones_like.default, x), _ERFINV_CENTRAL[0])
        p_tail = call(aten.mul.Scalar, call(aten.ones_like.default, x), _ERFINV_TAIL[0])
        for a, b in zip(_ERFINV_CENTRAL[1:], _ERFINV_TAIL[1:]):
            p_central = call(aten.add.Scalar, call(aten.mul.Tensor, p_central, central), a)
            p_tail = call(aten.add.Scalar, call(aten.mul.Tensor, p_tail, tail), b)
        picked = call(aten.where.self, call(aten.lt.Scalar, w, 5.0), p_central, p_tail)
        call(aten.mul.Tensor, picked, x)
    replace_node(gm, node, made)
    return True




_SORTS = {
    torch.ops.aten.sort.default: ("self", "dim", "descending"),
    torch.ops.aten.sort.stable: ("self",),  # stable, dim, descending are keyword-only
    torch.ops.aten.argsort.default: ("self", "dim", "descending"),
    torch.ops.aten.argsort.stable: ("self",),
}


@register_fx_node_fix("executorch")
def _fix_sort_as_topk(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The ExecuTorch runtime has no kernel for ``aten::sort.values`` (JetMoe groups tokens by expert
    with ``top_k_experts.flatten().sort()``, Hiera's masking takes ``argsort`` of noise: "the ExecuTorch
    runtime has no kernel for aten::sort.values"). A full sort along ``dim`` is a top-k with ``k`` the
    size of ``dim``, which the portable kernels have (``topk.values``), sorted, largest first when
    descending.

    topk promises no order among equal keys, and eager's sort of a short row keeps them in index
    order: PP-DocLayoutV2 moves its detections to the front with ``argsort(mask.int(), descending=True)``
    and its outputs came back permuted. Integer and bool keys (at most 32 bits, a static row) are
    made distinct first, ``key * n + position`` (``n - 1 - position`` when descending), which orders
    ties by position, exactly, so ``stable=True`` holds too; values are then gathered from the input.
    Float keys take the plain top-k (ties in another order than eager's are possible), and a stable
    float sort is left alone.

    before: values, indices = sort(x, dim, descending)    argsort(x, dim, descending)
    after:  values, indices = topk(x, x.size(dim), dim, largest=descending, sorted=True)    topk(...)[1]
    after (int keys): indices = topk(x.long() * n + ties, n, dim, descending)[1]; values = gather(x, dim, indices)
    """
    if node.op != "call_function" or node.target not in _SORTS:
        return False
    args = {"dim": -1, "descending": False, "stable": False, **dict(zip(_SORTS[node.target], node.args)), **node.kwargs}
    x = args["self"]
    val = fake_val(x)
    if val is None or val.dim() == 0:
        return False
    dim = args["dim"] % val.dim()
    size = val.shape[dim]
    exact = isinstance(size, int) and (val.dtype == torch.bool or (not val.dtype.is_floating_point
                                       and not val.dtype.is_complex and val.dtype.itemsize <= 4))
    if args["stable"] and not exact:
        return False
    aten, made = torch.ops.aten, NewNodes(gm.graph)
    descending = bool(args["descending"])
    argsort = node.target in (aten.argsort.default, aten.argsort.stable)
    with gm.graph.inserting_before(node):
        if exact:  # key * n + position: distinct keys, ties ordered by position
            position = made.call(aten.arange.default, size, dtype=torch.int64)
            if descending:
                position = made.call(aten.rsub.Scalar, position, size - 1)
            position = made.call(aten.view.default, position, [size] + [1] * (val.dim() - 1 - dim))
            key = made.call(aten._to_copy.default, x, dtype=torch.int64)
            key = made.call(aten.add.Tensor, made.call(aten.mul.Scalar, key, size), position)
            topk = made.call(aten.topk.default, key, size, dim, descending, True)
        else:
            k = size if isinstance(size, int) else made.call(aten.sym_size.int, x, dim)
            topk = made.call(aten.topk.default, x, k, dim, descending, True)
        if argsort or exact:
            indices = made.call(operator.getitem, topk, 1)
        if exact and not argsort:  # the sorted values, from the input rather than the made-up keys
            values = made.call(aten.gather.default, x, dim, indices)
    if exact and not argsort:
        copy_source_meta(node, made)
        replace_unpacked(gm, node, {0: values, 1: indices})
    else:  # argsort: the indices; a plain sort: topk's (values, indices) as they are
        replace_node(gm, node, made)
    return True




_CUMULATIVE = {torch.ops.aten.cummax.default: torch.ops.aten.amax.default,
               torch.ops.aten.cummin.default: torch.ops.aten.amin.default}


@register_fx_node_fix("executorch")
def _fix_cumulative_extreme_as_masked_reduction(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The ExecuTorch runtime has no kernel for ``aten::cummax.out`` / ``aten::cummin.out`` (Grounding
    DINO finds each token's previous and next special token with them: "the ExecuTorch runtime has no
    kernel for aten::cummax.out, aten::cummin.out"). Along a dim of length n (static, or dynamic: the
    text length of a dynamic export), the running extreme at i is the extreme over the positions j <= i:
    a reduction over an (n x n) lower-triangular mask, in ops the portable kernels have. Its index is
    eager's, the last position j <= i holding it (except after a NaN, whose running value is NaN as in
    eager but whose index is -1).

    before: values, indices = cummax(x, dim)
    after:  xt = x.transpose(dim, -1); keep[i, j] = j <= i
            values = amax(where(keep, xt[..., None, :], lowest), -1)
            indices = amax(where(keep & (xt[..., None, :] == values[..., None]), arange(n), -1), -1)
            (both transposed back; cummin: amin, highest)
    """
    if node.op != "call_function" or node.target not in _CUMULATIVE:
        return False
    x, dim = node.args[0], node.args[1]
    val = fake_val(x)
    if (val is None or val.dim() == 0 or val.dtype == torch.bool
            or any(u.op != "call_function" or u.target is not operator.getitem for u in node.users)):
        return False
    dim %= val.dim()
    last = val.dim() - 1
    reduce = _CUMULATIVE[node.target]
    info = torch.finfo(val.dtype) if val.is_floating_point() else torch.iinfo(val.dtype)
    lowest = (-math.inf if val.is_floating_point() else info.min) if reduce is torch.ops.aten.amax.default else (
        math.inf if val.is_floating_point() else info.max)
    aten, made = torch.ops.aten, NewNodes(gm.graph)
    call = made.call
    with gm.graph.inserting_before(node):
        n = size_value(made, x, dim, val.shape[dim])  # a dynamic length: an (n x n) mask planned at its bound
        xt = call(aten.transpose.int, x, dim, last) if dim != last else x
        positions = call(aten.arange.start_step, 0, n, 1, dtype=torch.int64)
        keep = call(aten.le.Tensor, call(aten.unsqueeze.default, positions, 0), call(aten.unsqueeze.default, positions, 1))
        rows = call(aten.unsqueeze.default, xt, -2)  # (..., 1, n): row i sees every j
        values = call(reduce, call(aten.where.self, keep, rows, call(aten.full_like.default, rows, lowest)), [-1])
        hit = call(aten.logical_and.default, keep, call(aten.eq.Tensor, rows, call(aten.unsqueeze.default, values, -1)))
        indices = call(aten.amax.default, call(aten.where.ScalarOther, hit, positions, -1), [-1])
        if dim != last:
            values = call(aten.transpose.int, values, dim, last)
            indices = call(aten.transpose.int, indices, dim, last)
    copy_source_meta(node, made)
    replace_unpacked(gm, node, {0: values, 1: indices})
    return True


_EMBEDDING_BAGS = (torch.ops.aten.embedding_bag.default, torch.ops.aten.embedding_bag.padding_idx,
                   torch.ops.aten._embedding_bag.default)
_BAG_REDUCTIONS = {0: torch.ops.aten.sum.dim_IntList, 1: torch.ops.aten.mean.dim, 2: torch.ops.aten.amax.default}


@register_fx_node_fix("executorch")
def _fix_embedding_bag_of_equal_bags(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The ExecuTorch runtime has no kernel for ``aten::_embedding_bag.out`` (Kimi K2.5's vision tower
    resamples its position grid bicubically as a weighted ``F.embedding_bag`` over 2-D indices: "the
    ExecuTorch runtime has no kernel for aten::_embedding_bag.out"). 2-D indices make bags of one
    length L, so ``F.embedding_bag`` passes ``offsets = arange(0, N, L)``; for those offsets the bag
    is a gather, a weighting and a reduction over a (bags, L, dim) view, in portable ops. Other
    offsets (bags of different lengths), ``include_last_offset`` and ``padding_idx`` are left alone.

    before: embedding_bag(table, idx[N], offsets=arange(0, N, L), mode, per_sample_weights=w[N])[0]
    after:  reduce_mode((table[idx] * w[:, None]).view(N // L, L, dim), dim=1)
    """
    if node.op != "call_function" or node.target not in _EMBEDDING_BAGS:
        return False
    names = ("weight", "indices", "offsets", "scale_grad_by_freq", "mode", "sparse", "per_sample_weights",
             "include_last_offset", "padding_idx")
    args = {"mode": 0, "per_sample_weights": None, "include_last_offset": False, "padding_idx": None,
            **dict(zip(names, node.args)), **node.kwargs}
    offsets, indices = args["offsets"], args["indices"]
    ival = fake_val(indices)
    if (ival is None or ival.dim() != 1 or not isinstance(ival.shape[0], int) or args["include_last_offset"]
            or args["padding_idx"] not in (None, -1) or args["mode"] not in _BAG_REDUCTIONS
            or not isinstance(offsets, torch.fx.Node) or offsets.target is not torch.ops.aten.arange.start_step
            or any(u.op != "call_function" or u.target is not operator.getitem or (u.args[1] != 0 and u.users)
                   for u in node.users)):
        return False
    n = ival.shape[0]
    start, end, step = (list(offsets.args) + [1])[:3]
    if not all(isinstance(v, int) for v in (start, end, step)) or start != 0 or step <= 0 or end != n or n % step:
        return False
    aten, made = torch.ops.aten, NewNodes(gm.graph)
    call = made.call
    with gm.graph.inserting_before(node):
        rows = call(aten.index_select.default, args["weight"], 0, indices)
        if args["per_sample_weights"] is not None:
            rows = call(aten.mul.Tensor, rows, call(aten.unsqueeze.default, args["per_sample_weights"], -1))
        bags = call(aten.view.default, rows, [n // step, step, -1])
        reduced = call(_BAG_REDUCTIONS[args["mode"]], bags, [1])
    copy_source_meta(node, made)
    replace_unpacked(gm, node, {0: reduced})  # offset2bag, bag_size, max_indices: checked unused above
    return True


@register_fx_node_fix("executorch")
def _fix_scatter_reduce_by_segment(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The ExecuTorch runtime has no kernel for ``aten::scatter_reduce.two_out`` (TAPAS reduces table
    cells by segment with it: "the ExecuTorch runtime has no kernel for aten::scatter_reduce.two_out").
    For a 1-D reduction, spell it in ops the portable kernels have, in memory O(segments + elements):
    TAPAS's segment count grows with the batch (65536 x batch for its position reset), and a
    (segments x elements) membership mask planned at the upper bounds did not load (std::bad_alloc).

    - sum and mean accumulate with ``index_put(accumulate=True)``;
    - amax and amin order the elements by value (``topk`` of all of them: the runtime has no sort)
      so that each segment's extreme comes last, then ``scatter`` them: the portable scatter kernel
      writes in index order, so the last write, the extreme, stays (a unit test runs it in the runtime).

    before: scatter_reduce(self[S], 0, index[N], src[N], reduce, include_self)
    after:  sum/mean: total = index_put(include_self ? self : zeros, [index], src, accumulate=True)
                      count = index_put(zeros, [index], ones, accumulate=True)
                      mean: total / (count + 1) with self, else total / max(count, 1)
                      without self: where(count > 0, total, self)   (an empty segment keeps self)
            amax:     values, order = topk(src, N, largest=False)   (ascending; amin: descending)
                      r = scatter(self, 0, index[order], values)     (an empty segment keeps self)
                      with self: maximum(r, self)                    (amin: minimum)

    An n-D scatter whose index and src have one shape, equal to self's off ``dim`` (Blt pools byte
    states into patches: scatter_reduce(zeros[B, P, D], 1, ids[B, T, D], h[B, T, D], "amax",
    include_self=False)), is that 1-D one over flattened tensors (``_flatten_scatter``): ``dim`` moved
    first, element (i, r) of the other R positions goes to index[i, r] * R + r, and the result is
    reshaped and permuted back.
    """
    if node.op != "call_function" or node.target is not torch.ops.aten.scatter_reduce.two:
        return False
    names = ("self", "dim", "index", "src", "reduce", "include_self")
    args = {"include_self": True, **dict(zip(names, node.args)), **node.kwargs}
    vals = [fake_val(args[k]) for k in ("self", "index", "src")]
    reduce, include_self = args["reduce"], args["include_self"]
    if (reduce not in ("sum", "mean", "amax", "amin") or any(v is None or v.dim() == 0 for v in vals)
            or not vals[2].is_floating_point() or vals[1].dtype != torch.int64):
        return False
    rank = vals[0].dim()
    dim = args["dim"] % rank if -rank <= args["dim"] < rank else None
    if dim is None or (rank > 1 and not _scatters_whole_rows(vals, dim)):
        return False
    aten, made = torch.ops.aten, NewNodes(gm.graph)
    call = made.call
    self_, index, src = args["self"], args["index"], args["src"]
    with gm.graph.inserting_before(node):
        if rank > 1:
            self_, index, src, n, restore = _flatten_scatter(made, args["self"], index, src, dim, vals)
        else:
            n = size_value(made, src, 0, vals[2].shape[0])
        if reduce in ("amax", "amin"):
            ordered = call(aten.topk.default, src, n, 0, reduce == "amin", True)
            values, order = call(operator.getitem, ordered, 0), call(operator.getitem, ordered, 1)
            reduced = call(aten.scatter.src, self_, 0, call(aten.index_select.default, index, 0, order), values)
            if include_self:
                call(aten.maximum.default if reduce == "amax" else aten.minimum.default, reduced, self_)
        else:
            zeros = call(aten.full_like.default, self_, 0.0)
            count = None
            if reduce == "mean" or not include_self:  # how many elements each segment got
                count = call(aten.index_put.default, zeros, [index], call(aten.full_like.default, src, 1.0), True)
            reduced = call(aten.index_put.default, self_ if include_self else zeros, [index], src, True)
            if reduce == "mean":
                reduced = call(aten.div.Tensor, reduced, call(aten.add.Tensor, count, 1.0) if include_self
                               else call(aten.clamp_min.default, count, 1.0))
            if not include_self:
                call(aten.where.self, call(aten.gt.Scalar, count, 0), reduced, self_)
        if rank > 1:
            restore(made[-1])
    replace_node(gm, node, made)
    return True


def _scatters_whole_rows(vals, dim: int) -> bool:
    """An n-D scatter_reduce whose index and src have one shape, equal to self's off ``dim`` (Blt's
    patch pooling: ``zeros[B, P, D].scatter_reduce(1, patch_ids[B, T, 1].expand(B, T, D), h[B, T, D],
    "amax", include_self=False)``): every element of src goes to the position of self that differs from
    its own only along ``dim``, so the scatter is a 1-D one over the flattened tensors."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    self_val, index_val, src_val = vals
    if not (self_val.dim() == index_val.dim() == src_val.dim()):
        return False
    return all(statically_known_true(a == b) for a, b in zip(index_val.shape, src_val.shape)) and all(
        statically_known_true(index_val.shape[d] == self_val.shape[d]) for d in range(self_val.dim()) if d != dim)


def _flatten_scatter(made: NewNodes, self_, index, src, dim: int, vals):
    """``dim`` moved first and the rest flattened: self [S, R], index and src [N, R] with R the product of
    the other sizes, and the target of element (i, r) is index[i, r] * R + r, so a 1-D scatter over
    self.reshape(S * R). Returns the 1-D self, index, src, their length N * R, and a function that adds
    the nodes turning a 1-D result back into self's layout."""
    aten, call = torch.ops.aten, made.call
    rank = vals[0].dim()
    order = [dim, *(d for d in range(rank) if d != dim)]
    inverse = [order.index(d) for d in range(rank)]
    rest = [size_value(made, self_, d, vals[0].shape[d]) for d in order[1:]]
    width = 1
    for size in rest:
        width = width * size if isinstance(width, int) and isinstance(size, int) else call(operator.mul, width, size)
    length = size_value(made, index, dim, vals[1].shape[dim])
    n = length * width if isinstance(length, int) and isinstance(width, int) else call(operator.mul, length, width)

    def flat(x):
        return call(aten.reshape.default, call(aten.permute.default, x, order), [-1])

    offsets = call(aten.reshape.default, call(aten.arange.start_step, 0, width, 1, dtype=torch.int64), rest)
    target = call(aten.add.Tensor, call(aten.mul.Tensor, call(aten.permute.default, index, order), width), offsets)
    target = call(aten.reshape.default, target, [-1])

    def restore(result):
        rows = size_value(made, self_, dim, vals[0].shape[dim])
        call(aten.permute.default, call(aten.reshape.default, result, [rows, *rest]), inverse)

    return flat(self_), target, flat(src), n, restore




_RANDOM_LIKE = {"randn_like": "randn", "rand_like": "rand"}


@register_fx_node_fix("executorch")
def _fix_random_like_as_sized(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The ExecuTorch runtime has kernels for ``randn.out`` and ``rand.out`` but not for
    ``randn_like.out`` nor ``rand_like.out`` (VITS draws its prior noise with ``randn_like``, scaled by
    noise_scale): draw with the sized op at the input's sizes and dtype.

    before: randn_like(x, dtype=d)
    after:  randn([x.size(0), ...], dtype=d or x.dtype)     # symbolic sizes through sym_size
    """
    aten = torch.ops.aten
    packet = getattr(node.target, "overloadpacket", None)
    if node.op != "call_function" or packet is None or packet.__name__ not in _RANDOM_LIKE:
        return False
    x = fake_val(node.args[0])
    if x is None or node.kwargs.get("memory_format") not in (None, torch.preserve_format, torch.contiguous_format):
        return False
    new = NewNodes(gm.graph)
    with gm.graph.inserting_before(node):
        sizes = [d if isinstance(d, int) else new.call(aten.sym_size.int, node.args[0], i) for i, d in enumerate(x.shape)]
        sized = getattr(aten, _RANDOM_LIKE[packet.__name__]).default
        new.call(sized, sizes, dtype=node.kwargs.get("dtype") or x.dtype)
    replace_node(gm, node, new)
    return True


def _aa_bicubic_weights(new: NewNodes, n_in, n_out, align_corners: bool, scale: float | None):
    """The [n_out, n_in] matrix of ATen's antialiased bicubic resampling along one axis (Keys' cubic,
    a = -0.5, stretched by the scale when downsampling, each row normalised to sum 1), built from
    aranges so that it needs no constant tensor. ``n_in`` and ``n_out`` are ints, or ``sym_size``
    nodes for symbolic sizes: the step and the stretch are then computed as 0-d tensors in the
    program, the stretch without a branch (``min(1 / step, 1)``)."""
    aten, a = torch.ops.aten, -0.5
    call = new.call
    if isinstance(n_in, int) and isinstance(n_out, int):
        if align_corners:
            step = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        else:
            step = 1.0 / scale if scale else n_in / n_out
        stretch = 1.0 / step if step >= 1.0 else 1.0
        half_step = 0.5 * step
    else:
        def scalar(value):  # a size node or a number, as a 0-d float32 tensor
            return call(aten.scalar_tensor.default, value, dtype=torch.float32)

        if align_corners:  # (n_in - 1) / (n_out - 1), 0 for a single output
            span = call(aten.clamp_min.default, call(aten.sub.Tensor, scalar(n_out), 1.0), 1.0)
            step = call(aten.where.self, call(aten.gt.Scalar, scalar(n_out), 1.0),
                        call(aten.div.Tensor, call(aten.sub.Tensor, scalar(n_in), 1.0), span), scalar(0))
        elif scale:
            step = scalar(1.0 / scale)
        else:
            step = call(aten.div.Tensor, scalar(n_in), scalar(n_out))
        stretch = call(aten.clamp_max.default, call(aten.reciprocal.default, step), 1.0)  # 1/0 = inf -> 1
        half_step = call(aten.mul.Tensor, step, 0.5)
    centers = call(aten.unsqueeze.default, call(aten.add.Tensor, call(aten.mul.Tensor, call(
        aten.arange.default, n_out, dtype=torch.float32), step), half_step), -1)
    taps = call(aten.unsqueeze.default, call(aten.add.Tensor, call(aten.arange.default, n_in, dtype=torch.float32), 0.5), 0)
    x = call(aten.abs.default, call(aten.mul.Tensor, call(aten.sub.Tensor, taps, centers), stretch))
    near = call(aten.add.Tensor, call(aten.mul.Tensor, call(aten.mul.Tensor, call(
        aten.sub.Tensor, call(aten.mul.Tensor, x, a + 2.0), a + 3.0), x), x), 1.0)  # ((a+2)x - (a+3))x^2 + 1
    far = call(aten.mul.Tensor, call(aten.sub.Tensor, call(aten.mul.Tensor, call(aten.add.Tensor, call(
        aten.mul.Tensor, call(aten.sub.Tensor, x, 5.0), x), 8.0), x), 4.0), a)  # (((x-5)x + 8)x - 4)a
    zero = call(aten.full.default, [], 0.0, dtype=torch.float32)
    w = call(aten.where.self, call(aten.lt.Scalar, x, 1.0), near,
             call(aten.where.self, call(aten.lt.Scalar, x, 2.0), far, zero))
    return call(aten.div.Tensor, w, call(aten.sum.dim_IntList, w, [-1], True))


@register_fx_node_fix("executorch")
def _fix_bicubic_aa_as_matmuls(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The ExecuTorch runtime has no kernel for ``aten::_upsample_bicubic2d_aa.out``
    (``F.interpolate(mode="bicubic", antialias=True)``: UnlimitedOcr resizes its position embeddings
    with it); the program lowers, then fails to load. The resampling is separable and linear: a
    weight matrix per axis, applied by two matmuls. Symbolic sizes (UnlimitedOcr's dynamic export
    resizes to the image's patch grid) build the matrices from ``sym_size`` reads.

    before: _upsample_bicubic2d_aa(x[..., H, W], [H', W'], align_corners, scales)
    after:  Wh[H', H] @ x @ Ww[W', W].T      # the weight matrices built from aranges

    A dtype other than float32 is left alone.
    """
    aten = torch.ops.aten
    if node.op != "call_function":
        return False
    if node.target is aten._upsample_bicubic2d_aa.default:
        args = dict(zip(("input", "output_size", "align_corners", "scales_h", "scales_w"), node.args))
        args.update(node.kwargs)
        scales = (args.get("scales_h"), args.get("scales_w"))
    elif node.target is aten._upsample_bicubic2d_aa.vec:
        args = dict(zip(("input", "output_size", "align_corners", "scale_factors"), node.args))
        args.update(node.kwargs)
        scales = tuple(args.get("scale_factors") or (None, None))
    else:
        return False
    x, out = fake_val(args["input"]), node.meta.get("val")
    if x is None or out is None or x.dtype != torch.float32:
        return False
    align = bool(args["align_corners"])
    requested = args.get("output_size")
    if requested is not None and len(requested) == 2 and all(isinstance(n, (int, torch.fx.Node)) for n in requested):
        h_out, w_out = requested  # ints, or the nodes reading the symbolic sizes
    elif isinstance(out.shape[-2], int) and isinstance(out.shape[-1], int):
        h_out, w_out = out.shape[-2], out.shape[-1]
    else:
        return False  # symbolic output sizes from scale factors alone: no node holds them
    new = NewNodes(gm.graph)
    with gm.graph.inserting_before(node):
        h, w = (size_value(new, args["input"], x.dim() + d, x.shape[d]) for d in (-2, -1))
        rows = _aa_bicubic_weights(new, h, h_out, align, scales[0])
        cols = _aa_bicubic_weights(new, w, w_out, align, scales[1])
        resized = new.call(aten.matmul.default, rows, args["input"])
        new.call(aten.matmul.default, resized, new.call(aten.t.default, cols))
    replace_node(gm, node, new)
    return True
