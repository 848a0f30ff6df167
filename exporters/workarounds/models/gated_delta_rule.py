"""Model patch: the gated delta rule's triangular solve, traced as a few matmuls instead of a 63-step loop.

Cause. The chunked gated delta rule of the linear-attention models (Qwen3-Next, Qwen3.5, Qwen3.5-MoE,
OLMo-Hybrid, Qwen4-Exp; ``torch_chunk_gated_delta_rule`` in each modeling file) solves a unit lower
triangular system per chunk. Eager calls ``torch.linalg.solve_triangular``; when
``is_torchdynamo_exporting()`` it builds the inverse by forward substitution instead ("not all
export targets support the fast triangular solver"):

    for i in range(1, chunk_size):          # 63 steps for the default chunk of 64
        row = ut_system[..., i, :i].clone(); sub = ut_system[..., :i, :i].clone()
        ut_system[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)

Unrolled, that is some 500 nodes per linear-attention layer of slices, clones and in-place writes,
whatever the sequence length: the programs are large and every lowering after torch.export is slow
on them (the tiny Qwen3_5TextModel took 136 s to lower for ExecuTorch static, 200 s for ONNX
static, against 3 s for torch.export; ExecuTorch dynamic ran past the sweep's 900 s), and XNNPACK
cuts them into hundreds of partitions.

What this changes (while tracing only). Two patches that work together:

- ``torch.linalg.solve_triangular(A, B, upper=False, unitriangular=True)`` of size ``n`` is
  computed as ``X = (I + P^(2^(m-1))) ... (I + P^2)(I + P) B`` with ``P = -tril(A, -1)`` and
  ``m = ceil(log2 n)``: since ``P`` is strictly lower triangular, ``P^n = 0`` and the product is
  exactly ``sum_k P^k = (I - P)^-1 = A^-1`` (the Neumann series, finite). 2m - 1 matmuls (11 for
  ``n = 64``), no loop. Any other call runs torch's solver. ``m`` needs ``n``: a symbolic ``n`` is
  specialized to its traced value (a guard). In the delta rule ``n`` is the constant chunk size,
  which a dynamic export still carries as ``(L + pad) // ((L + pad) // 64)`` (torch does not
  simplify it to 64), so the guard holds for every length; the only callers in transformers 5.23
  are these five functions.
- each family's ``is_torchdynamo_exporting`` (used in that modeling file only by this function)
  answers False while the solve above is installed, so the export traces the eager spelling, which
  then goes through it. Without the solve patch it answers as before.

    before: 63 x (slice, clone, slice, clone, unsqueeze, mul, sum, add, index_put) per layer
    after:  P = -tril(A, -1); X = B; for j in range(6): X = X + P @ X; P = P @ P

Why it is exact. Both sides compute the same ``A^-1 B``; the rounding differs (matmul sums instead of
substitution order), as LAPACK's blocked solve differs from the loop.

Remove when: ``torch_chunk_gated_delta_rule`` traces a loop-free triangular solve under export
instead of the forward-substitution loop it takes when ``is_torchdynamo_exporting()`` (transformers'
modeling_qwen3_next.py, modeling_qwen3_5.py, modeling_qwen3_5_moe.py, modeling_olmo_hybrid.py,
modeling_qwen4_exp.py), or ExecuTorch and ONNX take ``linalg_solve_triangular``.
"""

from __future__ import annotations

import math

import torch

from exporters.utils import ActedFlag, register_patch

_FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_moe", "olmo_hybrid", "qwen4_exp")
EXPORTING_FLAG_PATHS = tuple(f"transformers.models.{m}.modeling_{m}.is_torchdynamo_exporting" for m in _FAMILIES)


def unit_lower_solve(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``A^-1 B`` for ``A`` unit lower triangular (its diagonal and upper part ignored), as
    ``ceil(log2 n)`` Neumann-series factors; ``n`` must be known to count them."""
    n = int(a.shape[-1])  # a symbolic n is specialized to its traced value: a guard torch keeps
    power = -torch.tril(a, diagonal=-1)
    x = b
    steps = math.ceil(math.log2(n)) if n > 1 else 0  # P^(2^steps) = 0 once 2^steps >= n
    for step in range(steps):
        x = x + power @ x
        if step + 1 < steps:
            power = power @ power
    return x


@register_patch("dynamo", "torch.linalg.solve_triangular")
def _patch_unit_lower_solve_as_products(original):
    """A unit lower triangular solve traced as log2(n) Neumann factors (matmuls); a symbolic n is
    specialized (see ``unit_lower_solve``)."""

    acted = ActedFlag()  # set only on the calls spelled as products

    def solve_triangular(a, b, *args, upper, left=True, unitriangular=False, **kwargs):
        if args or kwargs or upper or not left or not unitriangular:
            return original(a, b, *args, upper=upper, left=left, unitriangular=unitriangular, **kwargs)
        acted.set()
        return unit_lower_solve(a, b)

    solve_triangular.acted = acted
    solve_triangular.unit_lower_by_products = True  # what the exporting flags below check for
    return solve_triangular


@register_patch("dynamo", *EXPORTING_FLAG_PATHS)
def _patch_delta_rule_takes_eager_solve(original):
    """The gated delta rule's "am I exporting" check answers False while the solve above is
    installed, so its loop-free eager spelling is traced."""

    acted = ActedFlag()

    def is_torchdynamo_exporting():
        if getattr(torch.linalg.solve_triangular, "unit_lower_by_products", False):
            acted.set()
            return False
        return original()

    is_torchdynamo_exporting.acted = acted
    return is_torchdynamo_exporting
