"""Boolean compaction with a static length, for model patches: ``x[i][keep[i]]`` padded or cut to
``length`` rows, written as a gather so that no size depends on the mask's values.

Each kept position's rank among its row's kept positions (a cumulative sum) is its slot; slot ``r``
takes the row's ``r``-th kept position (the order boolean indexing yields), found as the argmax of a
one-hot comparison (no sort: ONNX and the ExecuTorch runtime have no stable sort). Slots past the
row's count are marked invalid.
"""

from __future__ import annotations

import torch


def kept_in_order(keep: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For a (batch, n) bool ``keep``: the (batch, length) index of each row's first ``length`` kept
    positions, in order, and a (batch, length) bool saying which slots hold one."""
    rank = keep.to(torch.int64).cumsum(1) - 1
    slot = torch.where(keep, rank, length)  # dropped positions go past the end
    slots = torch.arange(length, device=keep.device)
    order = (slot.unsqueeze(-1) == slots).to(torch.uint8).argmax(1)
    return order, slots[None, :] < keep.sum(1, keepdim=True)


def gather_rows(x: torch.Tensor, order: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` (batch, n, d) at rows ``order`` (batch, length); zeros where ``valid`` is False."""
    picked = x.gather(1, order.unsqueeze(-1).expand(-1, -1, x.size(-1)))
    if valid is None:
        return picked
    return torch.where(valid.unsqueeze(-1), picked, torch.zeros((), dtype=x.dtype, device=x.device))
