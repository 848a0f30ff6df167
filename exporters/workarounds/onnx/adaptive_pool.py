"""ONNX torch patch: adaptive pooling with symbolic sizes.
"""

from __future__ import annotations

import torch

from exporters.utils import register_patch

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
