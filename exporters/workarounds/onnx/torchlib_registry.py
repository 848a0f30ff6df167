"""ONNX patch: onnxscript's list of torchlib functions is read once, not at every export.

Cause. Every ``torch.onnx.export`` builds its registry afresh (``ONNXRegistry.from_torchlib``,
torch/onnx/_internal/exporter/_registration.py), and that build asks onnxscript for its torchlib functions
(``get_torchlib_ops``, defined in onnxscript/_framework_apis/torch_2_5.py), which reads every overload's
``function_ir``: for a traced function that re-reads and re-parses its Python source each time
(``inspect.getsource`` and ``ast.parse``, onnxscript/_internal/values.py). Measured on this 2-core machine,
warm: ``get_torchlib_ops()`` 0.8 to 1.3 s per call, the whole ``from_torchlib()`` 0.9 to 1.4 s, the rest of
it (resolving each name to a torch op) under 0.1 s. Every ONNX export pays it: each onnx test_export item,
each component of an onnx generate item, each quantized onnx item. cProfile of one quantized onnx BERT
export put 497 ``get_src_and_ast`` calls (2.3 s profiled) under ``get_torchlib_ops``.

What this changes. ``get_torchlib_ops`` is answered from a cache kept while onnxscript's torchlib registry
holds the same functions (its names and each name's overloads, by identity, checked at every call); each
call gets its own list of the same entries (frozen dataclasses). The registry torch builds from it is still
built per export, as before: a torch op namespace loaded since (``quantized_decomposed`` once PT2E runs)
is resolved then, and what an export registers (``custom_translation_table``) stays in its own registry.

    before: get_torchlib_ops() reads every function's source   after: the list read the first time

Remove when: torch.onnx keeps its torchlib registry between exports, or onnxscript caches ``function_ir``.
"""

from __future__ import annotations

import functools
from typing import Any

from exporters.utils import register_patch

_READ: dict[str, Any] = {}  # "key": what the torchlib registry held; "ops": get_torchlib_ops' answer for it


def torchlib_contents() -> tuple:
    """What ``get_torchlib_ops`` reads: each qualified name with its overloads and complex functions."""
    from onnxscript.function_libs.torch_lib import registration

    return tuple((name, tuple(map(id, f.overloads)), tuple(map(id, f.complex)))
                 for name, f in registration.default_registry.items())


# the name torch 2.13 calls (torch/onnx/_internal/_lazy_import.py: onnxscript_apis is torch_2_11, which re-exports it)
@register_patch("onnx", "onnxscript._framework_apis.torch_2_11.get_torchlib_ops")
def _patch_torchlib_read_once(original):
    @functools.wraps(original)
    def get_torchlib_ops():
        if "ops" not in _READ or _READ["key"] != torchlib_contents():  # first, or a function registered since
            ops = original()  # imports torchlib's ops first: the registry is full after it
            _READ.update(key=torchlib_contents(), ops=ops)
        return list(_READ["ops"])

    return get_torchlib_ops
