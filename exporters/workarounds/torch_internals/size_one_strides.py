"""Torch patch: ``Tensor.reshape`` and ``Tensor.contiguous`` of a non-contiguous tensor add the guard
``size != 1`` on its dynamic dims.

Cause. ``reshape`` returns a view when the strides allow one and a copy otherwise; the C++ stride
computation (``computeStride``) asks whether each dim is 1, because a dim of size 1 can take any
stride. Under ``backed_size_oblivious`` (how exporters lets dynamic dims take size 1, Stage 4 in
exporters/tracing.py) that question on a dynamic dim becomes a plain guard, ``s0 != 1``, so the
artifact refuses size 1 although the model computes it. Every grouped-query attention hits it:
``repeat_kv`` (``hidden_states[:, :, None].expand(...).reshape(...)``) guards the sequence length,
and a one-token decode step is refused. ``contiguous()`` asks the same question to decide whether it
can return the tensor itself (``attn_output.transpose(1, 2).contiguous()`` after every sdpa call).

What this changes (while tracing with size-1 dims allowed, on symbolic sizes only). A reshape of a
tensor that is not known to be contiguous (asked without a guard) is done as what ``reshape`` does
when no view exists: a contiguous copy, then a view. The values are the same at every size; the graph
holds a copy where the traced size might have allowed a view. Contiguous tensors and static shapes are
reshaped as before. ``contiguous()`` of such a tensor is a copy (torch's own answer at every size
but 1, where it returns the tensor itself: the same values).

    before: x[:, :, None].expand(b, h, 3, s, d).reshape(b, 3 * h, s, d)   -> guard s != 1
    after:  x[:, :, None].expand(b, h, 3, s, d).clone(contiguous).view(b, 3 * h, s, d)   (no guard)
    before: out.transpose(1, 2).contiguous()   -> guard s != 1
    after:  out.transpose(1, 2).clone(contiguous)   (no guard)

Cost. Whether a tensor is provably contiguous is asked through the shape environment, about 4 ms a
call on a symbolic tensor (each size and stride comparison is evaluated statically): 100 ms of a
0.6 s dynamic BERT export. Most tensors asked are contiguous with strides that are, term for term,
the products of the later sizes (``(32*s41, 8*s41, 8, 1)`` for sizes ``(s18, 4, s41, 8)``); those
are recognized from the expressions alone (``_plainly_contiguous``), and only the rest go to torch's
``is_contiguous_or_false``. The answer is the same: a term-for-term match is what that function
proves first (a dim's stride equal to the expected stride), and a size that is the number 1 is
skipped by both.

Remove when: torch's view stride computation treats backed size-oblivious dims as it treats unbacked
ones (no guard on ``size == 1``; pytorch/pytorch "harden backed_size_oblivious" work).
"""

from __future__ import annotations

import functools

import sympy
import torch

from exporters.utils import ActedFlag, register_patch


def _oblivious() -> bool:
    from torch.fx.experimental import _config as fx_config

    return bool(fx_config.backed_size_oblivious)


def _symbolic(tensor: torch.Tensor) -> bool:
    return any(isinstance(s, torch.SymInt) and not s.node.expr.is_number for s in tensor.shape)


def _expr(value) -> sympy.Expr:
    return value.node.expr if isinstance(value, torch.SymInt) else sympy.Integer(value)


def _plainly_contiguous(tensor: torch.Tensor) -> bool:
    """True when each stride is, as a sympy expression, the product of the later sizes (dims of size
    the number 1 skipped, as torch skips them): contiguous without asking the shape environment.
    False means "not shown here", not "not contiguous"."""
    expected = sympy.Integer(1)
    for size, stride in zip(reversed(tensor.shape), reversed(tensor.stride())):
        size = _expr(size)
        if size == 1:
            continue
        if _expr(stride) != expected:
            return False
        expected = expected * size
    return True


def _copied(tensor) -> bool:
    """Whether to copy: a symbolic-sized tensor, while size-1 dims are allowed, not provably contiguous."""
    from torch._prims_common import is_contiguous_or_false

    return (isinstance(tensor, torch.Tensor) and _oblivious() and _symbolic(tensor)
            and not _plainly_contiguous(tensor) and not is_contiguous_or_false(tensor))


def copy_then_view(reshape):
    acted = ActedFlag()

    @functools.wraps(reshape)
    def reshaped(self, *shape):
        if not _copied(self):
            return reshape(self, *shape)
        acted.set()
        return self.clone(memory_format=torch.contiguous_format).view(*shape)

    reshaped.acted = acted
    return reshaped


def copy_if_unsure(contiguous):
    acted = ActedFlag()

    @functools.wraps(contiguous)
    def contiguous_copy(self, memory_format=torch.contiguous_format):
        if memory_format is not torch.contiguous_format or not _copied(self):
            return contiguous(self, memory_format=memory_format)
        acted.set()
        return self.clone(memory_format=torch.contiguous_format)

    contiguous_copy.acted = acted
    return contiguous_copy


@register_patch("dynamo", "torch.Tensor.reshape")
def _patch_reshape_no_size_one_guard(original):
    return copy_then_view(original)


@register_patch("dynamo", "torch.Tensor.contiguous")
def _patch_contiguous_no_size_one_guard(original):
    return copy_if_unsure(original)
