"""Model patch (Blt: BltModel, BltForCausalLM): the byte-group hash in exact int64 arithmetic.

Cause. Blt adds hash embeddings of byte n-grams: ``byte_group_hash_function`` takes
``rolling_polynomial_hash(windows, prime) % vocab`` (models/blt/modeling_blt.py:981), with

    prime_powers = torch.tensor(prime) ** torch.arange(group_size)     # up to prime**7, primes ~1e9..1e10
    return torch.sum(token_tensor * prime_powers, dim=-1)

Every term past the first wraps around int64 (eager: exact two's-complement arithmetic), and only the sum's
residue mod the hash vocabulary (a power of two in the tiny config: 64) matters, so the hash lives in
the low bits of a ~1e18 sum. Two backends compute those ops through floating point:

- ONNX Runtime (1.32): ReduceSum on int64 accumulates in double and casts back, saturating
  (ReduceSum([2**60 + 1, 1]) = 2**60, a wrapped sum comes back INT64_MAX); Pow on int64 computes
  std::pow in double (1000000007**2 = 1000000014000000000, eager ...049). The onnxscript optimizer folds
  the constant Pow, but not the ReduceSum: every sum came back a multiple of 128, every hash id ``% 64``
  was 0, and last_hidden_state differed in all 448 elements (onnx-static-BltModel).
- ExecuTorch's portable kernels: ``pow.Tensor_Tensor`` on int64 the same (through double) and
  ``sum.IntList_out`` on int64 accumulates in float (sum([0, 0, x]) != x for x ~ 5.8e18): the same
  all-zero hash ids.

Int64 Mul and Add are exact and wrap in both runtimes. What this changes: the prime powers become int64
constants computed in Python (exact, wrapped to int64 as torch's pow wraps), and the sum over the
group (a static size, 1 to 8) a chain of adds, so the program has no int64 pow or reduce. The values are
eager's bit for bit, including the wrap-around.

    before: sum(tokens * (tensor(prime) ** arange(g)), -1)
    after:  tokens[..., 0] * p0 + tokens[..., 1] * p1 + ... + tokens[..., g-1] * p(g-1)
            (p_i = prime**i wrapped to int64, a constant tensor)

Remove when: ONNX Runtime's int64 ReduceSum and ExecuTorch's int64 sum/pow kernels are exact (then the
original traces to the same values), or transformers computes the hash without int64 overflow: check with
``python -m sweeps.recheck workarounds --only patch:dynamo:transformers.models.blt.modeling_blt.rolling_polynomial_hash``.
"""

from __future__ import annotations

import torch

from exporters.utils import register_patch


def _as_int64(value: int) -> int:
    """``value`` wrapped to int64, as torch's int64 arithmetic wraps."""
    return (value + 2**63) % 2**64 - 2**63


def exact_rolling_hash(token_tensor: torch.Tensor, prime: int) -> torch.Tensor:
    """sum_i token_tensor[..., i] * prime**i in int64 (wrapping), with no pow or reduction op."""
    total = None
    for i in range(token_tensor.shape[-1]):
        power = torch.tensor(_as_int64(prime**i), dtype=torch.int64, device=token_tensor.device)
        term = token_tensor[..., i] * power
        total = term if total is None else total + term
    return total


@register_patch("dynamo", "transformers.models.blt.modeling_blt.rolling_polynomial_hash")
def _patch_blt_hash_without_int64_pow_and_sum(original):
    """Blt's n-gram hash: ``prime ** arange(g)`` and an int64 ``sum`` run through floating point in ONNX
    Runtime and ExecuTorch, losing the low bits the hash keeps; spelled as constant powers and adds.

    before: sum(tokens * (tensor(prime) ** arange(g)), -1)
    after:  tokens[..., 0] * p0 + ... + tokens[..., g-1] * p(g-1)     (p_i = prime**i wrapped to int64)
    """

    def rolling_polynomial_hash(token_tensor, prime: int = 1000000007):
        group = token_tensor.shape[-1]
        if (not isinstance(group, int) or group == 0 or token_tensor.dtype != torch.int64
                or not isinstance(prime, int)):
            return original(token_tensor, prime)
        return exact_rolling_hash(token_tensor, prime)

    return rolling_polynomial_hash
