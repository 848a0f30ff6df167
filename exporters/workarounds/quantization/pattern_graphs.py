"""Quantization speed patch: the pattern graphs PT2E matches against are traced once per process, not
once per quantized model.

Cause. ``torchao.quantization.pt2e.utils._get_aten_graph_module_for_pattern`` turns a small Python
pattern (conv + batch norm, with and without relu; dropout and batch norm in train and eval form)
into an aten graph with a strict ``torch.export.export`` of it at fixed example inputs. XNNPACK's
quantizer (``_do_annotate_conv_bn``, executorch/backends/xnnpack/quantizer/xnnpack_quantizer_utils.py)
and ``prepare_pt2e``'s train/eval rewrites (torchao's pt2e/export_utils.py) call it on every
``prepare_pt2e``: 12 exports of the same patterns per quantized model, 8.8 s of a tiny BERT's 30.7 s
int8 ONNX export under cProfile (one export, after an fp32 export had warmed the process up).

What this changes (around stage 0 only). The traced pattern graph is kept per pattern: the pattern's
function code, its closure's values (the conv function, ``inplace``), its defaults, the example
inputs' shapes and dtypes, ``is_cuda`` and the keyword arguments. A later call with the same key gets
a deep copy of the kept graph module (the callers edit the graph they get: dead code elimination,
recompile). A pattern that is a module with weights, or whose closure or arguments hold something
that is not hashable, is traced as before.

    before: 12 strict torch.export calls per prepare_pt2e
    after:  12 in the process's first prepare_pt2e, none after

Why the result is the same: the pattern graph depends only on the key (a strict export of pure tensor
ops at those shapes); the example inputs' values do not enter a graph whose ops do not branch on them.
``tests/test_quantization.py`` checks that the converted graph is the same code with and without.

Remove when: torchao caches its pattern graphs (or builds them without ``torch.export``).
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch

from exporters.utils import ActedFlag, register_patch

PATHS = (
    "torchao.quantization.pt2e.utils._get_aten_graph_module_for_pattern",
    "executorch.backends.xnnpack.quantizer.xnnpack_quantizer_utils._get_aten_graph_module_for_pattern",
)
_KEPT: dict[Any, torch.fx.GraphModule] = {}


def _value_key(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device.type)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_value_key(v) for v in value))
    hash(value)  # TypeError: not kept
    return value


def pattern_key(pattern: Any, example_inputs: tuple, is_cuda: bool, kwargs: dict) -> Any:
    """The key a traced pattern graph is kept under; raises TypeError where it cannot be kept."""
    fn = pattern
    if isinstance(pattern, torch.nn.Module):
        if any(True for _ in pattern.parameters()) or any(True for _ in pattern.buffers()):
            raise TypeError("a pattern module with state")
        fn = getattr(pattern, "fn", None)
        if fn is None:
            raise TypeError("a pattern module without fn")
    code = getattr(fn, "__code__", None)
    if code is None:
        raise TypeError("a pattern without code")
    closure = tuple(_value_key(c.cell_contents) for c in (fn.__closure__ or ()))
    defaults = _value_key(tuple(fn.__defaults__ or ()))
    return (code, closure, defaults, _value_key(tuple(example_inputs)), bool(is_cuda),
            tuple(sorted((k, _value_key(v)) for k, v in kwargs.items())))


@register_patch("dynamo", *PATHS)
def _patch_pattern_graphs_traced_once(original):
    acted = ActedFlag()

    @functools.wraps(original)
    def patched(pattern, example_inputs, is_cuda=False, **kwargs):
        try:
            key = pattern_key(pattern, example_inputs, is_cuda, kwargs)
        except (TypeError, ValueError):
            return original(pattern, example_inputs, is_cuda, **kwargs)
        kept = _KEPT.get(key)
        if kept is None:
            kept = _KEPT[key] = original(pattern, example_inputs, is_cuda, **kwargs)
        else:
            acted.set()
        return copy.deepcopy(kept)

    patched.acted = acted
    return patched
