"""Patch (all backends): a guard ignored by a frozen shape environment is not formatted unless logged.

Cause. After torch.export, the program's shape environment is frozen; the lowerings' re-traces
(ExecuTorch's ``to_edge``, torch.onnx's decompositions) then meet guards they may not add, and
``ShapeEnv._check_frozen`` (torch/fx/experimental/symbolic_shapes.py) builds, for each, the string
``f"{expr} == {concrete_val}"`` for a signpost event that torch only logs at INFO
(``torch._utils_internal.signpost_event``), before any logger is asked whether it is on. On
size-heavy dynamic programs the sympy printing is a real share of the lowering: py-spy on
Swinv2Model's ExecuTorch dynamic export put 11% of its samples in ``Printable.__str__`` called from
there.

What this changes. When the shape environment is frozen, raising is off and neither logger is
enabled at INFO, the ignored guard is only counted (``counter["ignored_backward_guard"]``, as torch
does); otherwise torch's own method runs, messages included (``TORCH_LOGS=dynamic`` still prints
them).

    before: frozen: counter += 1; signpost_event(..., f"{expr} == {val}"); log.info(...)
    after:  frozen, INFO off: counter += 1

Remove when: ``ShapeEnv._check_frozen`` builds that message only for a logger that is on; measure
the share with
``python benchmarks/frozen_guard_cost.py <Class> --backend executorch``.
"""

from __future__ import annotations

import functools
import logging

from exporters.utils import ActedFlag, register_patch

_LOGGERS = ("torch.fx.experimental.symbolic_shapes", "torch._utils_internal")


def _messages_wanted() -> bool:
    return any(logging.getLogger(name).isEnabledFor(logging.INFO) for name in _LOGGERS)


@register_patch("dynamo", "torch.fx.experimental.symbolic_shapes.ShapeEnv._check_frozen")
def _patch_frozen_guard_counted_not_formatted(original):
    """A frozen shape environment formatted every guard it ignored (sympy printing) for an INFO message
    nobody logs: it only counts them unless INFO is on.

    before: counter += 1; signpost_event(..., f"{expr} == {val}")
    after:  counter += 1
    """

    acted = ActedFlag()  # set when a call skipped the formatting

    @functools.wraps(original)
    def _check_frozen(self, expr, concrete_val):
        if self._error_on_new_guards or not self.frozen or _messages_wanted():
            return original(self, expr, concrete_val)
        self.counter["ignored_backward_guard"] += 1
        acted.set()
        return None

    _check_frozen.acted = acted  # fired only on exports whose re-trace met a frozen guard
    return _check_frozen
