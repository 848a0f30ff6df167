"""Blt on ONNX and ExecuTorch.

- ``exporters/workarounds/models/blt.py``: Blt's byte-group hash (``rolling_polynomial_hash``) sums
  int64 terms that wrap around; ONNX Runtime's int64 ReduceSum and Pow and ExecuTorch's int64 sum and pow
  kernels compute through floating point and lose the low bits the hash keeps (every hash id came back
  0). The patch spells the hash with constant powers and int64 adds, exact in all of them.
- ``_fix_scatter_reduce_by_segment`` (exporters/workarounds/executorch/missing_kernels.py) also takes
  an n-D scatter_reduce whose index and src have one shape (Blt pools byte states into patches with
  ``scatter_reduce(1, ids.expand(B, T, D), h, "amax", include_self=False)``): the ExecuTorch runtime has
  no ``aten::scatter_reduce.two_out`` kernel.
"""

from __future__ import annotations

import pytest
import torch
from _stage_helpers import _node_fix

import exporters.exporter_executorch as et
import exporters.exporter_onnx as onnx_exporter
from exporters.utils import FiredLog, apply_fx_node_fixes
from exporters.workarounds.executorch.missing_kernels import _fix_scatter_reduce_by_segment

transformers_blt = pytest.importorskip("transformers.models.blt.modeling_blt")

PATCH = "patch:dynamo:transformers.models.blt.modeling_blt.rolling_polynomial_hash"
TOKENS = torch.tensor([[98, 17, 127, 121, 16, 66, 119], [94, 12, 60, 126, 127, 19, 71]])


class _Hash(torch.nn.Module):
    """Blt's hash ids, as compute_hash_embeddings takes them: two primes, groups of 3 and 8 bytes."""

    def forward(self, tokens):
        return torch.stack([transformers_blt.byte_group_hash_function(tokens, group, prime, 64)
                            for prime in (1000000007, 5915587277) for group in (3, 8)])


def test_exact_rolling_hash_matches_eager_bit_for_bit():
    from exporters.workarounds.models.blt import exact_rolling_hash

    windows = torch.randint(0, 256, (3, 11, 8))
    for prime in (1000000007, 9576890767, 31):
        torch.testing.assert_close(exact_rolling_hash(windows, prime),
                                   transformers_blt.rolling_polynomial_hash(windows, prime), rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["onnx", "executorch"])
def test_blt_hash_ids_match_eager(backend):
    """Before the patch every id was 0 on both (onnx-static-BltModel: 448/448 elements differ)."""
    exporter = onnx_exporter.OnnxExporter() if backend == "onnx" else et.ExecutorchExporter()
    art = exporter.export(_Hash(), {"tokens": TOKENS})
    assert PATCH in art.workarounds_fired
    (actual,) = art(tokens=TOKENS).values()
    expected = _Hash()(TOKENS)
    assert expected.any()
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


class _PatchPooling(torch.nn.Module):
    """Blt's BltLocalEncoder.patch_reduce: byte states pooled per patch by amax, patches without a byte keep 0."""

    def __init__(self, reduce: str = "amax", include_self: bool = False, dim: int = 1):
        super().__init__()
        self.reduce, self.include_self, self.dim = reduce, include_self, dim

    def forward(self, hidden, patch_ids):
        index = patch_ids.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        base = torch.zeros(hidden.shape[0], 5, hidden.shape[-1])
        return base.scatter_reduce(self.dim, index, hidden, reduce=self.reduce, include_self=self.include_self)


IDS = torch.tensor([[0, 0, 1, 2, 2, 3, 3], [0, 1, 1, 1, 2, 2, 2]])  # patch 4 (and 3 of row 1) get nothing


@pytest.mark.parametrize("reduce, include_self", [("amax", False), ("amin", True), ("sum", False), ("mean", True)])
def test_nd_scatter_reduce_fix_matches_eager(reduce, include_self):
    hidden = torch.randn(2, 7, 6)
    gm = torch.export.export(_PatchPooling(reduce, include_self), (hidden, IDS)).module()
    fired = FiredLog()

    assert apply_fx_node_fixes(_node_fix(_fix_scatter_reduce_by_segment), gm, fired)
    assert not [n for n in gm.graph.nodes if n.target is torch.ops.aten.scatter_reduce.two]
    torch.testing.assert_close(gm(hidden, IDS), _PatchPooling(reduce, include_self)(hidden, IDS))


def test_nd_scatter_reduce_runs_in_the_executorch_runtime():
    """The runtime has no aten::scatter_reduce.two_out kernel; the flattened 1-D rewrite runs (its
    amax relies on the portable scatter writing in index order)."""
    inputs = {"hidden": torch.randn(2, 7, 6), "patch_ids": IDS}
    model = _PatchPooling()
    art = et.ExecutorchExporter().export(model, inputs)
    assert "fix:executorch:_fix_scatter_reduce_by_segment" in art.workarounds_fired
    (actual,) = art(**inputs).values()
    torch.testing.assert_close(actual, model(**inputs))


def test_nd_scatter_reduce_with_a_smaller_index_is_left_alone():
    """An index narrower than src off ``dim`` scatters only part of src: not a whole-row scatter."""

    class Partial(torch.nn.Module):
        def forward(self, src, index):
            return torch.zeros(3, 4).scatter_reduce(0, index, src, reduce="amax", include_self=False)

    src, index = torch.randn(5, 4), torch.tensor([[0, 1], [2, 0]])
    gm = torch.export.export(Partial(), (src, index)).module()
    node = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.scatter_reduce.two)
    assert not _fix_scatter_reduce_by_segment(gm, node)
