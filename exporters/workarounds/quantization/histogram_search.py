"""Quantization speed patch: the histogram observer's range search gives the same range, in a few
array searches instead of tens of thousands of Python steps.

Cause. ``HistogramObserver._non_linear_param_search`` (torchao's pt2e/observer.py, called by
``calculate_qparams`` in ``convert_pt2e``) narrows the observed range by quantiles: it moves a lower or
an upper quantile bound by 1e-5 per step, up to 50,000 steps, and in each step walks bin indices one
by one, reading the cumulative histogram as 0-d tensors. Nearly every step changes nothing: the
bound moved less than one bin's mass. XNNPACK's static int8 recipe puts one such observer on every
quantized activation: 131 in a tiny Llama's int8 ONNX export, 3.8 s of its 15.6 s under cProfile
(``benchmarks/quantized_cost.py``), more than the fp32 export of the same model.

What this changes (around stage 0 only). The same search, step for step, with the steps that change
nothing skipped in bulk:
- the bin walks become binary searches of the cumulative histogram (a cumulative sum of non-negative
  counts never decreases), compared as float32, as torch compares a float32 tensor with a Python
  float;
- while the lower bound's bin stays put, only the upper quantile moves (the search moves the lower one
  only when its bin moved further than the upper one's). The upper quantile's values over the next
  steps are the same repeated float64 subtractions (``numpy.add.accumulate`` is sequential), so the
  first step whose bin differs is found at once.
The quantization error of each candidate range is still torchao's own ``_compute_quantization_error``,
and the loop keeps its exact decisions: new min and max are bit for bit the upstream ones
(``tests/test_quantization.py`` compares them on calibrated histograms and on synthetic ones with
empty and single-bin ranges). A histogram with a non-finite count takes the upstream search.

Remove when: torchao's search stops stepping one quantile increment at a time in Python.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from exporters.utils import ActedFlag, register_patch

STEP = 1e-5  # upstream's granularity ("stepsize")
_CHUNK = 4096  # upper-quantile steps examined per array operation while nothing changes


def _lower_bin(csum: np.ndarray, threshold: np.float32, start: int, end: int) -> int:
    """Upstream: ``l = start; while l < end and csum[l] < threshold: l += 1``."""
    return min(end, max(start, int(np.searchsorted(csum, threshold, side="left"))))


def _upper_bin(csum: np.ndarray, threshold: np.float32, start: int, end: int) -> int:
    """Upstream: ``r = end; while r > start and csum[r] > threshold: r -= 1``."""
    return max(start, min(end, int(np.searchsorted(csum, threshold, side="right")) - 1))


def _steps_until_upper_moves(csum: np.ndarray, total: float, alpha: float, beta: float, end: int,
                             degenerate: bool) -> tuple[float, bool]:
    """Advance the upper quantile ``beta`` over the steps in which nothing moves (the lower bin is at the
    start and the upper bin at the end). Returns (beta before the first step whose upper bin moves, True),
    or (beta where the loop condition ``alpha < beta`` fails, False)."""
    last = csum[end]
    while True:
        betas = np.add.accumulate(np.concatenate(([beta], np.full(_CHUNK, -STEP))))
        # step k (1-based) runs when alpha < betas[k-1] and moves the upper bin when last > f32(betas[k] * total)
        runs = alpha < betas[:-1]
        moves = np.zeros(_CHUNK, dtype=bool) if degenerate else last > (betas[1:] * total).astype(np.float32)
        stop_run = np.flatnonzero(~runs)
        stop_move = np.flatnonzero(runs & moves)
        first_stop = stop_run[0] if stop_run.size else _CHUNK
        first_move = stop_move[0] if stop_move.size else _CHUNK
        if first_move < first_stop:
            return float(betas[first_move]), True
        if first_stop < _CHUNK:
            return float(betas[first_stop]), False
        beta = float(betas[-1])


def range_search(observer) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``observer._non_linear_param_search()``'s result, or None where the fast path does not apply."""
    histogram = observer.histogram
    if histogram.dim() != 1 or histogram.size(0) != observer.bins or not bool(torch.isfinite(histogram).all()):
        return None
    bin_width = (observer.max_val - observer.min_val) / observer.bins
    total = torch.sum(histogram).item()
    csum = torch.cumsum(histogram, dim=0).numpy()
    if csum.size > 1 and bool((np.diff(csum) < 0).any()):
        return None  # a negative count: the bin walks are not binary searches
    alpha, beta = 0.0, 1.0
    start_bin, end_bin = 0, observer.bins - 1
    norm_min = float("inf")
    while alpha < beta:
        next_alpha = alpha + STEP
        lower = _lower_bin(csum, np.float32(next_alpha * total), start_bin, end_bin)
        if lower == start_bin:
            beta, moved = _steps_until_upper_moves(csum, total, alpha, beta, end_bin, start_bin == end_bin)
            if not moved:
                break
        next_beta = beta - STEP
        upper = _upper_bin(csum, np.float32(next_beta * total), start_bin, end_bin)
        next_start, next_end = start_bin, end_bin
        if (lower - start_bin) > (end_bin - upper):
            next_start, alpha = lower, next_alpha
        else:
            next_end, beta = upper, next_beta
        if next_start == start_bin and next_end == end_bin:
            continue
        norm = observer._compute_quantization_error(next_start, next_end)
        if norm > norm_min:
            break
        norm_min, start_bin, end_bin = norm, next_start, next_end
    return observer.min_val + bin_width * start_bin, observer.min_val + bin_width * (end_bin + 1)


@register_patch("dynamo", "torchao.quantization.pt2e.observer.HistogramObserver._non_linear_param_search")
def _patch_histogram_range_search(original):
    acted = ActedFlag()

    @functools.wraps(original)
    def patched(self):
        found = range_search(self)
        if found is None:
            return original(self)
        acted.set()
        return found

    patched.acted = acted
    return patched
