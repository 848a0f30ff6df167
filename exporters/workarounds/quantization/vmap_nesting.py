"""Quantization patch: PT2E's dead-code elimination keeps a graph's vmap nesting calls.

Cause. A model whose attention mask comes from a vmapped function (transformers' masking_utils vmaps mask
functions it cannot broadcast: Gemma 3's bidirectional image blocks, token-type masks) is exported, in the
graph stage 0 prepares (``torch.export.export(...).module()``), with functorch's
``_vmap_increment_nesting`` / ``_vmap_decrement_nesting`` calls (torch._functorch.predispatch) around ``_add_batch_dim`` /
``_remove_batch_dim``. Those calls return a level nobody reads, and fx's purity test
(``torch._library.utils.is_impure``) does not count them as side effects, so the dead-code elimination in
``prepare_pt2e`` (``_fuse_conv_bn_``, ``_fuse_linear_bn_``) and ``convert_pt2e`` removes them. The first
calibration call then adds a batch dimension at a vmap level that was never entered: "RuntimeError: Either
your tensor may have escaped from inside a function being vmapped ..." (Gemma3ForConditionalGeneration int8,
test_quantized onnx at 084ec21).

What this changes (around stage 0 only: ``QUANTIZATION_INTERNALS`` in exporters/utils.py). The purity test
says the two nesting calls are impure, as it says of ``torch._C._set_grad_enabled`` and autocast's enter and
exit, the other context calls a pre-dispatch graph keeps. Every other op is answered as before.

    before: prepare_pt2e(graph with vmap) -> nesting calls removed -> calibration raises
    after:  nesting calls kept -> calibration runs the vmapped mask as the exported graph does

Remove when: fx's ``_side_effectful_functions`` lists the vmap nesting calls.
"""

from __future__ import annotations

import functools

from exporters.utils import ActedFlag, register_patch


def _nesting_calls() -> tuple:
    """The nesting calls as a pre-dispatch graph holds them (torch._functorch.predispatch's wrappers)."""
    from torch._functorch import predispatch

    return predispatch._vmap_increment_nesting, predispatch._vmap_decrement_nesting


@register_patch("dynamo", "torch._library.utils.is_impure")
def _patch_vmap_nesting_is_impure(original):
    acted = ActedFlag()
    nesting = _nesting_calls()

    @functools.wraps(original)
    def is_impure(op, *args, **kwargs):
        if any(op is f for f in nesting):
            acted.set()
            return True
        return original(op, *args, **kwargs)

    is_impure.acted = acted  # fired only when a nesting call was asked about
    return is_impure
