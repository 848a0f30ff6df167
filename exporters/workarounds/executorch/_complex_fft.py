"""The FFT rules of complex_as_real: fft/ifft/rfft/irfft (1-d, 2-d, n-d) and their decomposed forms
``_fft_r2c`` / ``_fft_c2c``, computed as matmuls with DFT matrices on (real, imag) pairs."""

from __future__ import annotations

import operator

import torch

from exporters.workarounds.executorch._complex_common import _REAL_OF, _is_complex, _rank, _Unhandled, _val

aten = torch.ops.aten


def _fft_irfft(rw, node, c, n=None, d=-1, norm=None):
    """irfft as a real DFT (NeuCodec, X-Codec 2: ISTFT of polar(magnitude, phase); Autoformer's
    autocorrelation, over dim 1): out[t] = scale * sum_k w_k (re_k cos(2 pi k t / n) - im_k sin(2 pi
    k t / n)), w_0 = w_{n/2} = 1, else 2; k * t is reduced mod n in int64 so that the angles stay
    exact. Another dim than the last is moved last for it and back after."""
    rank = _rank(c)
    if not rw.cx(c):
        raise _Unhandled("irfft of a complex tensor that is not rewritten")
    dim = rw.dim(d, rank)
    bins = _val(c).shape[dim]
    if not isinstance(bins, int):
        raise _Unhandled("irfft of a dynamic length")
    n = 2 * (bins - 1) if n is None else n
    scale = {None: 1.0 / n, "backward": 1.0 / n, "forward": 1.0, "ortho": n ** -0.5}.get(norm)
    if not isinstance(n, int) or n < 1 or scale is None:
        raise _Unhandled(f"irfft with n={n!r}, norm={norm!r}")
    real = rw.r(c) if dim == rank - 1 else rw.call(aten.transpose.int, rw.r(c), dim, rank - 1)
    out = _irfft_last(rw, real, rank, bins, n, scale)
    return out if dim == rank - 1 else rw.call(aten.transpose.int, out, dim, rank - 1)


def _irfft_last(rw, real, rank, bins, n, scale):
    """The irfft of ``real`` (a complex tensor of rank ``rank`` as real pairs, bins last) to length n."""
    used = min(bins, n // 2 + 1)  # bins past n // 2 are ignored; missing ones are zeros
    x = real if used == bins else rw.call(aten.slice.Tensor, real, rank - 1, 0, used)
    dtype = _val(real).dtype
    k = rw.call(aten.arange.default, used, dtype=torch.int64)
    t = rw.call(aten.arange.default, n, dtype=torch.int64)
    m = rw.call(aten.remainder.Scalar, rw.call(aten.mul.Tensor, rw.call(aten.unsqueeze.default, k, -1), t), n)
    angle = rw.call(aten.mul.Tensor, rw.call(aten._to_copy.default, m, dtype=dtype), 2 * torch.pi / n)
    # w_k * scale as a column: 2 - (k == 0) - (2k == n)
    nyquist = rw.call(aten.eq.Scalar, rw.call(aten.mul.Tensor, k, 2), n)
    edge = rw.call(aten._to_copy.default, rw.call(aten.add.Tensor, rw.call(aten.eq.Scalar, k, 0), nyquist), dtype=dtype)
    weight = rw.call(aten.mul.Tensor, rw.call(aten.rsub.Scalar, edge, 2.0), scale)
    weight = rw.call(aten.unsqueeze.default, weight, -1)
    cos = rw.call(aten.mul.Tensor, rw.call(aten.cos.default, angle), weight)
    sin = rw.call(aten.mul.Tensor, rw.call(aten.sin.default, angle), weight)
    re, im = rw.parts(x)
    return rw.call(aten.sub.Tensor, rw.call(aten.matmul.default, re, cos), rw.call(aten.matmul.default, im, sin))


def _dft_matrices(rw, rows, n, bins, scale, dtype):
    """cos and sin of 2 pi t k / n for t < rows, k < bins, times scale: [rows, bins] each; t * k is
    reduced mod n in int64 so that the angles stay exact."""
    t = rw.call(aten.arange.default, rows, dtype=torch.int64)
    k = rw.call(aten.arange.default, bins, dtype=torch.int64)
    m = rw.call(aten.remainder.Scalar, rw.call(aten.mul.Tensor, rw.call(aten.unsqueeze.default, t, -1), k), n)
    angle = rw.call(aten.mul.Tensor, rw.call(aten._to_copy.default, m, dtype=dtype), 2 * torch.pi / n)
    cos, sin = rw.call(aten.cos.default, angle), rw.call(aten.sin.default, angle)
    if scale != 1.0:
        cos, sin = rw.call(aten.mul.Tensor, cos, scale), rw.call(aten.mul.Tensor, sin, scale)
    return cos, sin


def _dft(rw, node, x, dims, sizes, scale_of, inverse=False, onesided=False):
    """The DFT of ``x`` (a complex node, or a real floating one) over ``dims`` (dims of the complex
    result, non-negative), each padded or trimmed to its entry of ``sizes`` (None: as it is), as real
    matmuls. Per dim of output length n, C[t, k] = cos(2 pi t k / n), S[t, k] = sin(2 pi t k / n):
    forward re' = re C + im S, im' = im C - re S; inverse re' = re C - im S, im' = im C + re S.
    ``scale_of(n)`` is the normalization of one dim; ``onesided`` keeps n // 2 + 1 bins of the last
    dim (rfft, _fft_r2c). Returns the [..., 2] node of the result."""
    val, out = _val(x), _val(node)
    if not isinstance(val, torch.Tensor) or not (rw.cx(x) or val.is_floating_point()) or not _is_complex(out):
        raise _Unhandled(f"{node.target} of a {getattr(val, 'dtype', val)} value")
    rank, dtype = val.dim(), _REAL_OF[out.dtype]
    if rw.cx(x):
        re, im = rw.parts(rw.r(x))
    else:
        re, im = (x if val.dtype == dtype else rw.call(aten._to_copy.default, x, dtype=dtype)), None
    if not dims or len(set(dims)) != len(dims) or len(sizes) != len(dims):
        raise _Unhandled(f"{node.target} over dims {dims!r} with sizes {sizes!r}")
    for i, (d, n) in enumerate(zip(dims, sizes)):
        length = val.shape[d]
        last = onesided and i == len(dims) - 1
        if isinstance(length, torch.SymInt) and (n is None or n == -1):
            # a dynamic length, transformed whole (FNet's fftn over the sequence): matrices of the
            # runtime length, built in the graph; only unnormalized, as a scale would be 1 / n at run time
            if scale_of(1) != 1.0 or scale_of(2) != 1.0:
                raise _Unhandled(f"{node.target} of a dynamic length over dim {d} with a normalization")
            size = rw.call(aten.sym_size.int, re, d)
            bins = rw.call(operator.add, rw.call(operator.floordiv, size, 2), 1) if last else size
            cos, sin = _dft_matrices_dynamic(rw, size, bins, dtype)
            rows = length
        else:
            n = length if n is None or n == -1 else n
            if not isinstance(length, int) or not isinstance(n, int) or n < 1:
                raise _Unhandled(f"{node.target} of a dynamic or empty length over dim {d}")
            scale = scale_of(n)
            if scale is None:
                raise _Unhandled(f"{node.target} with an unknown normalization")
            bins = n // 2 + 1 if last else n
            rows = min(length, n)  # zero padding past the input adds nothing; trimming drops rows
            cos, sin = _dft_matrices(rw, rows, n, bins, scale, dtype)

        def along(part):  # the part with dim d last (trimmed to ``rows``), or None
            if part is None:
                return None
            if rows < length:
                part = rw.call(aten.slice.Tensor, part, d, 0, rows)
            return part if d == rank - 1 else rw.call(aten.transpose.int, part, d, rank - 1)

        def mm(part, matrix):
            return rw.call(aten.matmul.default, part, matrix)

        r, j = along(re), along(im)
        sign_sub, sign_add = (aten.add.Tensor, aten.sub.Tensor) if inverse else (aten.sub.Tensor, aten.add.Tensor)
        if j is None:  # a real input: re' = re C, im' = -+ re S
            new_re, new_im = mm(r, cos), mm(r, sin)
            if not inverse:
                new_im = rw.call(aten.neg.default, new_im)
        else:
            new_re = rw.call(sign_add, mm(r, cos), mm(j, sin))  # forward: + , inverse: -
            new_im = rw.call(sign_sub, mm(j, cos), mm(r, sin))  # forward: - , inverse: +
        if d != rank - 1:
            new_re = rw.call(aten.transpose.int, new_re, d, rank - 1)
            new_im = rw.call(aten.transpose.int, new_im, d, rank - 1)
        re, im = new_re, new_im
    return rw.pack(re, im)


def _dft_matrices_dynamic(rw, n, bins, dtype):
    """``_dft_matrices`` for a length ``n`` known only at run time (a SymInt node): [n, bins] cos and sin
    of 2 pi t k / n, unscaled; t * k is reduced mod n in int64 (a tensor divisor, so the angles stay
    exact as in the static case)."""
    t = rw.call(aten.arange.default, n, dtype=torch.int64)
    k = rw.call(aten.arange.default, bins, dtype=torch.int64)
    n_int = rw.call(aten.scalar_tensor.default, n, dtype=torch.int64)
    m = rw.call(aten.remainder.Tensor, rw.call(aten.mul.Tensor, rw.call(aten.unsqueeze.default, t, -1), k), n_int)
    n_real = rw.call(aten.scalar_tensor.default, n, dtype=dtype)
    turns = rw.call(aten.div.Tensor, rw.call(aten._to_copy.default, m, dtype=dtype), n_real)
    angle = rw.call(aten.mul.Tensor, turns, 2 * torch.pi)
    return rw.call(aten.cos.default, angle), rw.call(aten.sin.default, angle)


_NORM = {  # str norm -> scale of one dim of length n, forward and inverse
    False: {None: lambda n: 1.0, "backward": lambda n: 1.0, "forward": lambda n: 1.0 / n, "ortho": lambda n: n ** -0.5},
    True: {None: lambda n: 1.0 / n, "backward": lambda n: 1.0 / n, "forward": lambda n: 1.0, "ortho": lambda n: n ** -0.5},
}


def _fft_dims(rw, x, s, dim):
    """The (dims, sizes) of an fft_fft*: dim None takes the last len(s) dims, or all of them."""
    rank = _rank(x)
    if dim is None:
        dim = list(range(rank - len(s), rank)) if s is not None else list(range(rank))
    dims = [dim] if isinstance(dim, int) else list(dim)
    sizes = [s] if isinstance(s, int) or s is None and isinstance(dim, int) else list(s) if s is not None \
        else [None] * len(dims)
    return [rw.dim(d, rank) for d in dims], sizes


def _fft_op(inverse=False, onesided=False, default_dim=None):
    """fft_fft / fft2 / fftn, fft_ifft / ifft2 / ifftn, fft_rfft / rfft2 / rfftn (FNet: fftn over the
    sequence and hidden dims, then .real)."""
    def handler(rw, node, x, s=None, dim=default_dim, norm=None):
        if onesided and rw.cx(x):
            raise _Unhandled("rfft of a complex tensor")
        dims, sizes = _fft_dims(rw, x, s, dim)
        norms = _NORM[inverse]
        if norm not in norms:
            raise _Unhandled(f"{node.target} with norm={norm!r}")
        return _dft(rw, node, x, dims, sizes, norms[norm], inverse=inverse, onesided=onesided)
    return handler


def _fft_1d(inverse=False, onesided=False):
    inner = _fft_op(inverse, onesided)

    def handler(rw, node, x, n=None, dim=-1, norm=None):
        return inner(rw, node, x, n, dim, norm)
    return handler


def _fft_normalization(normalization):
    """_fft_r2c / _fft_c2c normalization: 0 none, 1 by 1 / sqrt(prod n), 2 by 1 / prod n."""
    return {0: lambda n: 1.0, 1: lambda n: n ** -0.5, 2: lambda n: 1.0 / n}.get(normalization)


def _fft_r2c(rw, node, x, dim, normalization, onesided):
    """The decomposed real-to-complex FFT (what fft_fft of a real tensor becomes in to_edge)."""
    scale_of = _fft_normalization(normalization)
    if rw.cx(x) or scale_of is None:
        raise _Unhandled(f"_fft_r2c of a complex tensor or with normalization {normalization!r}")
    dims = [rw.dim(d, _rank(x)) for d in dim]
    return _dft(rw, node, x, dims, [None] * len(dims), scale_of, onesided=onesided)


def _fft_c2c(rw, node, x, dim, normalization, forward):
    scale_of = _fft_normalization(normalization)
    if not rw.cx(x) or scale_of is None:
        raise _Unhandled(f"_fft_c2c of a real tensor or with normalization {normalization!r}")
    dims = [rw.dim(d, _rank(x)) for d in dim]
    return _dft(rw, node, x, dims, [None] * len(dims), scale_of, inverse=not forward)
