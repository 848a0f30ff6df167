"""Torch patch: re-simplify only the shape axioms a new divisibility fact can change.

Cause. torch's ShapeEnv keeps the guards it has proven as ``axioms`` (expression -> truth) and
rewrites ``a // b`` as an exact division once it knows ``b`` divides ``a`` (``Mod(a, b)`` in its
``divisible`` set). Each time that set grows, the next ``_maybe_evaluate_static`` call
re-simplifies every axiom that contains a ``//``, whatever its symbols
(torch/fx/experimental/symbolic_shapes.py, ``resimplify_floor_div``, flagged by
``_update_version_counter``). Shifted-window attention (Swin and every model on a Swin backbone:
DonutSwin, MaskFormer, Mask2Former, OneFormer, Florence-2, SAM 2's Hiera) pads each stage to a
multiple of its window, so a dynamic export adds divisibility facts stage after stage while its
axioms fill with nested floor divisions: py-spy on ``python -m sweeps.repro
dynamo-dynamic-SwinModel`` put 61.5% of the export in ``resimplify_floor_div``, and DonutSwin,
Florence2 and Sam2 ran past the sweep's timeouts on dynamic exports.

What this changes (while tracing only). Before ``_maybe_evaluate_static`` runs with the flag set,
the axioms are re-simplified here and the flag cleared, but only those with a ``a // b`` whose
``Mod(a, b)`` is among the facts added since the last time: ``ShapeEnv.simplify`` turns a floor
division into an exact one only for such a pair, so for every other axiom it would return what
the axiom table already holds. Calls that pass their own ``axioms`` are left as they were. The same
patch (one per path) then decides what is left undecided over small bounded ranges
(``_finite_range_guards.py``, its own docstring).

    before: divisible grows by Mod(s0, 7) -> simplify(k) for every axiom k containing //
    after:  divisible grows by Mod(s0, 7) -> simplify(k) for the axioms containing (s0) // 7

What it cannot change: whether a guard holds. An axiom is a fact already proven; re-simplifying it
only adds the same fact in a second spelling, which helps later guards match it. Skipping an axiom
the new facts do not touch skips a spelling simplify would not have changed (other than through
a replacement that happened to arrive in the same step, which upstream itself only picks up by
that coincidence).

Remove when: ``ShapeEnv._maybe_evaluate_static`` (torch/fx/experimental/symbolic_shapes.py,
``resimplify_floor_div``) re-simplifies only the axioms a new divisibility fact can change, not
every axiom containing a floor division.
"""

from __future__ import annotations

from exporters.utils import ActedFlag, register_patch
from exporters.workarounds.torch_internals._finite_range_guards import decide_over_range


def resimplify_touched_axioms(env) -> int:
    """Re-simplify ``env``'s axioms whose floor divisions the divisibility facts added since the
    last call make exact; clear torch's re-simplify flag. Returns how many axioms were re-simplified."""
    from torch.utils._sympy.functions import FloorDiv, Mod

    env._resimplify_floor_div_axioms = False
    seen = env.__dict__.setdefault("_divisible_resimplified", set())
    new = env.divisible - seen
    seen |= env.divisible
    if not new:
        return 0
    mods = env.__dict__.setdefault("_axiom_floor_div_mods", {})
    updates = {}
    for key, value in list(env.axioms.items()):
        if key not in mods:
            mods[key] = tuple(Mod(*fd.args) for fd in key.atoms(FloorDiv)) if key.has(FloorDiv) else ()
        if any(env.replace(mod) in new for mod in mods[key]):
            updates[env.simplify(key)] = value
    env.axioms.update(updates)
    return len(updates)


@register_patch("dynamo", "torch.fx.experimental.symbolic_shapes.ShapeEnv._maybe_evaluate_static")
def _patch_floor_div_axioms_resimplified_by_need(original):
    acted = ActedFlag()  # set when a call re-simplifies

    def maybe_evaluate_static(self, expr, **kwargs):
        if getattr(self, "_resimplify_floor_div_axioms", False) and kwargs.get("axioms") is None:
            acted.set()
            resimplify_touched_axioms(self)
        out = original(self, expr, **kwargs)
        if out is None and not any(kwargs.get(k) for k in ("axioms", "var_to_range", "compute_hint", "unbacked_only")):
            # the one patch of this path also decides over small bounded ranges (_finite_range_guards.py)
            out = decide_over_range(self, expr)
            if out is not None:
                acted.set()
        return out

    maybe_evaluate_static.acted = acted  # fired only when it re-simplifies, not on every query
    maybe_evaluate_static.cache_clear = original.cache_clear  # ShapeEnv clears it when a range is refined
    return maybe_evaluate_static
