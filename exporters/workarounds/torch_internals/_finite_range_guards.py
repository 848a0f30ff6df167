"""Torch helper: a size condition that has one value over a dim's whole bounded range is decided, not guarded.

Cause. When torch's ShapeEnv cannot decide a condition on symbolic sizes by value-range analysis and
its axioms (``_maybe_evaluate_static`` returns None), it evaluates it at the traced sizes and records
a guard. torch.export then refuses the export if the guard mentions a dim the user declared dynamic
("Not all values of seq ... in the specified range seq <= 64 satisfy the generated guard"), even when
the condition holds for every size in that range: the analysis cannot see through modular
arithmetic. A chunked recurrence pads the sequence to a multiple of its chunk and loops over the
chunks (transformers' ``torch_chunk_gated_delta_rule``, ``chunk_size=64``): the chunk count
``(s + (64 - s % 64) % 64) // 64 == 1`` is true for every s in [1, 64], and the export of a
linear-attention decoder with a dynamic sequence bounded by 64 failed on it.

What this changes (while tracing only). Where ``_maybe_evaluate_static`` (a plain query: no axioms,
ranges or hint substitution of the caller's own) leaves a condition undecided and every symbol in it
has a finite integer range with at most ``MAX_POINTS`` points in all, the condition is evaluated at
every point. If it has one value at all of them, that value is the answer (no guard); otherwise it
stays undecided and torch guards as before. A value that holds at every point of the ranges holds
for every size the artifact accepts; ranges only narrow as tracing goes on, so it stays true.

    before: (s + (64 - s % 64) % 64) // 64 == 1, s in [1, 64] -> guard -> constraint violation
    after:  the same at s = 1..64: all True -> True, no guard

Remove when: torch's ShapeEnv decides a condition over a small bounded range exactly (or bounds
floor divisions and remainders tightly enough to prove such a chunk count).
"""

from __future__ import annotations

import itertools

MAX_POINTS = 256  # a bounded dim of the runner folders (64); the sweep's max_dim 1024 stays with torch


def decide_over_range(env, expr):
    """``expr``'s one value over the finite ranges of its symbols in ``env`` (a sympy Boolean or
    number), or None where it has several, a range is unbounded or too large, or it does not evaluate
    to a constant."""
    import sympy

    expr = env.replace(expr)
    symbols = sorted(expr.free_symbols, key=str)
    if not symbols:
        return None
    memo = env.__dict__.setdefault("_finite_range_decisions", {})
    ranges = []
    points = 1
    for symbol in symbols:
        vr = env.var_to_range.get(symbol)
        if vr is None or not (vr.lower.is_Integer and vr.upper.is_Integer):
            return None
        lower, upper = int(vr.lower), int(vr.upper)
        points *= max(upper - lower + 1, 0)
        if points > MAX_POINTS or points == 0:
            return None
        ranges.append((lower, upper))
    key = (expr, tuple(ranges))
    if key in memo:
        return memo[key]
    value = None
    for combination in itertools.product(*(range(lo, hi + 1) for lo, hi in ranges)):
        try:
            out = expr.xreplace({s: sympy.Integer(v) for s, v in zip(symbols, combination)})
        except (ZeroDivisionError, TypeError, ValueError, AssertionError):
            # a point where torch's sympy functions refuse their arguments (Mod of a negative value raises
            # AssertionError: SeamlessM4T's speech encoder lengths): not decided here, torch guards as before
            value = None
            break
        if out.free_symbols or not (out.is_Boolean or out.is_Number):
            value = None
            break
        if value is None:
            value = out
        elif out != value:
            value = None
            break
    memo[key] = value
    return value
