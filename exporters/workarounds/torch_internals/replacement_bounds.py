"""Torch patch: a symbol replacement whose bounds check trips on int_oo arithmetic is skipped, not fatal.

Cause. When torch learns ``a == tgt`` for a symbol ``a`` (``ShapeEnv._set_replacement``), it narrows
the range of ``tgt``'s one free symbol ``b`` by inverting the equality, recomputes ``tgt``'s bound,
and asserts it now lies inside ``a``'s. With an unbounded symbol the recomputed upper end is
``int_oo`` arithmetic that lands past ``a``'s (``VR[2048, 9223372036854775808] not a subset of
src_bound=VR[2048, 9223372036854775806]``). Voxtral's and Inkling's ``get_placeholder_mask`` reach
it on a dynamic export, from ``torch_compilable_check(inputs_embeds[mask].numel() ==
features.numel())``: an unbacked count set equal to a symbolic feature size.

What this changes (while tracing only). That AssertionError ends the call the way torch's own next
step does when a target's bound is not inside the source's: the replacement is not made (the
"skipped set_replacement ... not subset of" branch). The range refinements made before the check
are facts implied by the equality, and they stay; the equality itself stays a guard or runtime
assertion, as every equality torch does not turn into a replacement.

    before: _set_replacement(u0, 2048*s1) -> AssertionError: tgt_bound=... not a subset of src_bound=...
    after:  _set_replacement(u0, 2048*s1) -> no replacement; u0 == 2048*s1 stays asserted

Remove when: ``ShapeEnv._set_replacement`` (torch/fx/experimental/symbolic_shapes.py) skips a
replacement whose recomputed bound overflows through ``int_oo`` arithmetic, as it skips any other
target whose bound is not inside the source's, instead of asserting.
"""

from __future__ import annotations

import functools

from exporters.utils import ActedFlag, register_patch

_MESSAGE = "not a subset of src_bound"


@register_patch("dynamo", "torch.fx.experimental.symbolic_shapes.ShapeEnv._set_replacement")
def _patch_replacement_bounds_overflow_skipped(original):
    acted = ActedFlag()  # set when a call skips a replacement

    @functools.wraps(original)
    def set_replacement(self, a, tgt, msg):
        try:
            return original(self, a, tgt, msg)
        except AssertionError as exc:
            if _MESSAGE not in str(exc):
                raise
            acted.set()
            self.log.debug("skipped set_replacement %s = %s (%s): %s", a, tgt, msg, exc)
            return None

    set_replacement.acted = acted  # fired only when it skipped a replacement
    return set_replacement
