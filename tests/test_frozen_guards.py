"""exporters/workarounds/torch_internals/frozen_guards.py: a frozen shape environment counts the guards it ignores without
formatting them, unless INFO logging asks for the message."""

from __future__ import annotations

import logging

import pytest
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from exporters.workarounds.torch_internals.frozen_guards import _patch_frozen_guard_counted_not_formatted


class _Unprintable:
    """Stands for a large sympy expression: formatting it is the cost the patch avoids."""

    def __format__(self, spec):
        raise AssertionError("formatted")

    __str__ = __repr__ = lambda self: format(self)


@pytest.fixture
def frozen_env():
    env = ShapeEnv()
    env.freeze()
    return env


def test_ignored_guard_counted_not_formatted(frozen_env):
    with pytest.raises(AssertionError, match="formatted"):  # torch's own method formats it
        ShapeEnv._check_frozen(frozen_env, _Unprintable(), 1)
    before = frozen_env.counter["ignored_backward_guard"]
    patched = _patch_frozen_guard_counted_not_formatted(ShapeEnv._check_frozen)
    patched(frozen_env, _Unprintable(), 1)
    assert frozen_env.counter["ignored_backward_guard"] == before + 1
    assert patched.acted() and not patched.acted()  # reported as fired once, for the call that skipped


def test_messages_still_come_when_logged(frozen_env):
    patched = _patch_frozen_guard_counted_not_formatted(ShapeEnv._check_frozen)
    logger = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        with pytest.raises(AssertionError, match="formatted"):
            patched(frozen_env, _Unprintable(), 1)
    finally:
        logger.setLevel(level)


def test_unfrozen_and_error_modes_are_torchs():
    calls = []
    patched = _patch_frozen_guard_counted_not_formatted(lambda self, expr, val: calls.append((expr, val)))
    env = ShapeEnv()  # not frozen
    patched(env, "s0 > 2", True)
    env.freeze()
    env._error_on_new_guards = True
    patched(env, "s0 > 3", True)
    assert calls == [("s0 > 2", True), ("s0 > 3", True)]
