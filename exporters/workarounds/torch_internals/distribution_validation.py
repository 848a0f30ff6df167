"""Patch (all backends): a ``torch.distributions`` object built while tracing does not validate its
arguments.

Cause. ``Distribution.__init__`` (torch/distributions/distribution.py) checks each parameter against
its constraint when validation is on (the default outside ``python -O``):
``if not torch._is_all_true(constraint.check(value)): raise ValueError(...)``. That is a Python branch
on tensor values, so torch.export stops there: ``GuardOnDataDependentSymNode: Could not guard on
data-dependent expression Eq(u0, 1)`` (Blt's patcher,
``torch.distributions.Categorical(logits=logits).entropy()`` at models/blt/modeling_blt.py:909). The
same holds for ``log_prob``'s sample check.

What this changes (while tracing only). A distribution is built with ``validate_args=False`` unless
the caller asked for validation by name; nothing it computes changes (validation only raises on
invalid values, and the graph could not carry that raise anyway).

    before: Categorical(logits=x)                       -> Eq(u0, 1) guard on x's values
    after:  Categorical(logits=x, validate_args=False)  -> no check

Remove when: torch's distribution validation asserts with ``torch._check`` (traceable) instead of a
Python branch, or transformers builds its distributions with ``validate_args=False``.
"""

from __future__ import annotations

import functools

from exporters.utils import ActedFlag, register_patch


@register_patch("dynamo", "torch.distributions.distribution.Distribution.__init__")
def _patch_distribution_no_validation(original):
    """A distribution validated its parameters with a Python branch on their values (a data-dependent
    guard): built while tracing, it does not validate them.

    before: Distribution.__init__(..., validate_args=None) -> if not all(constraint.check(p)): raise
    after:  Distribution.__init__(..., validate_args=False)
    """

    acted = ActedFlag()  # set when a distribution that would have validated did not

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        if len(args) < 3 and kwargs.get("validate_args") is None and self._validate_args:
            kwargs["validate_args"] = False
            acted.set()
        return original(self, *args, **kwargs)

    __init__.acted = acted
    return __init__
