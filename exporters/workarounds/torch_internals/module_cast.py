"""Torch patch: ``Module.to`` called inside forward returns the module when the cast changes nothing.

Cause. MoE routers cast their classifier inside forward (``self.classifier =
self.classifier.to(self.dtype)``: NLLB-MoE's ``_cast_classifier``, SwitchTransformers' router).
While torch.export traces, the parameters are fake tensors, and ``Module._apply``
(torch/nn/modules/module.py) swaps every fake parameter with ``torch.utils.swap_tensors``, even when
the conversion returned it unchanged; the swap is refused ("_apply(): Couldn't swap Linear.weight").

What this changes (while tracing only). A cast that would change no parameter's or buffer's dtype or
device, and asks for no memory format, returns the module as it is; a real cast still runs (and
fails).

    before: classifier.to(float32) -> Module._apply(swap every parameter)   after: classifier (no-op)

Remove when: ``Module._apply`` leaves a fake parameter whose conversion changed nothing in place
instead of swapping it, or the routers stop casting their classifier in forward (transformers'
modeling_nllb_moe.py, modeling_switch_transformers.py).
"""

from __future__ import annotations

import itertools

import torch

from exporters.utils import register_patch


@register_patch("dynamo", "torch.nn.Module.to")
def _patch_module_cast_in_forward(original):
    """MoE routers cast their classifier inside forward (``self.classifier = self.classifier.to(self.dtype)``:
    NLLB-MoE's ``_cast_classifier``, SwitchTransformers' router), which makes torch.export swap the
    parameters in place, and it refuses ("_apply(): Couldn't swap Linear.weight"). While tracing, a
    cast that would change nothing returns the module as it is; a real cast still runs (and fails).

    before: classifier.to(float32) -> Module._apply(swap every parameter)   after: classifier (no-op)
    """

    def to(self, *args, **kwargs):
        device, dtype, _non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
        unchanged = memory_format is None and all(
            (dtype is None or not (t.is_floating_point() or t.is_complex()) or t.dtype == dtype)
            and (device is None or t.device == torch.device(device))
            for t in itertools.chain(self.parameters(), self.buffers())
        )
        return self if unchanged else original(self, *args, **kwargs)

    return to
