"""The one place that says how close an exported artifact must be to eager PyTorch.

Every element is compared (no "5% may mismatch" allowance): |actual - expected| <= atol + rtol * |expected|.
Integer and boolean outputs must match exactly. Tolerances are per backend, fp32:
dynamo runs the same kernels as eager, ONNX Runtime and ExecuTorch (XNNPACK) reorder
reductions and fuse ops, hence their looser bound.
"""

from __future__ import annotations

import torch

# backend -> (atol, rtol) for float32 outputs
TOLERANCES: dict[str, tuple[float, float]] = {
    "dynamo": (1e-5, 1e-5),
    "onnx": (1e-4, 1e-4),
    "executorch": (1e-4, 1e-4),
}


class ParityError(AssertionError):
    """An exported artifact's outputs differ from eager beyond the backend's tolerance."""


def _worst(expected: torch.Tensor, actual: torch.Tensor, atol: float, rtol: float) -> str | None:
    e = expected.detach().to(torch.float64)
    a = actual.detach().to(torch.float64)
    nan_mismatch = torch.isnan(e) != torch.isnan(a)
    err = torch.where(a == e, torch.zeros_like(e), (a - e).abs())  # equal infinities match
    excess = err - (atol + rtol * e.abs())
    excess = torch.where(torch.isnan(e) & torch.isnan(a), torch.full_like(excess, -1.0), excess)
    excess = torch.where(nan_mismatch | torch.isnan(excess), torch.full_like(excess, float("inf")), excess)
    bad = excess > 0
    if not bool(bad.any()):
        return None
    flat = int(torch.argmax(excess).item())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), e.shape)) if e.dim() else ()
    return (
        f"{int(bad.sum())}/{e.numel()} elements differ; worst at {list(index)}: "
        f"expected {e[index].item():.6g}, got {a[index].item():.6g}, abs err {err[index].item():.3g} "
        f"(atol={atol:g}, rtol={rtol:g})"
    )


def compare(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor], backend: str) -> list[str]:
    """Problems found, one line per output; empty when the outputs match."""
    atol, rtol = TOLERANCES[backend]
    problems = []
    missing = [k for k in expected if k not in actual]
    extra = [k for k in actual if k not in expected]
    if missing:
        problems.append(f"outputs missing from the artifact: {missing}")
    if extra:
        problems.append(f"outputs the artifact has but eager does not: {extra}")
    for name in expected:
        if name not in actual:
            continue
        e, a = expected[name], torch.as_tensor(actual[name])
        if tuple(e.shape) != tuple(a.shape):
            problems.append(f"{name}: shape {tuple(a.shape)} != eager {tuple(e.shape)}")
            continue
        if e.dtype.is_floating_point or e.dtype.is_complex:
            if e.is_complex():
                e, a = torch.view_as_real(e), torch.view_as_real(a)
            msg = _worst(e, a, atol, rtol)
            if msg:
                problems.append(f"{name}: {msg}")
        elif not (torch.equal(e, a.to(e.dtype)) and torch.equal(a.to(e.dtype).to(a.dtype), a)):  # lossless too
            diff = int((e != a.to(e.dtype)).sum())
            problems.append(f"{name}: {diff}/{e.numel()} elements of an exact ({e.dtype}) output differ")
    return problems


def assert_close(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor], backend: str) -> None:
    problems = compare(expected, actual, backend)
    if problems:
        # the first problem on the first line: it is what reports group failures by
        raise ParityError(f"{backend} artifact does not match eager: " + "\n  ".join(problems))
