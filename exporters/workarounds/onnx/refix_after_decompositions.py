"""ONNX patch: the FX node fixes re-run after torch.onnx's own run_decompositions.
"""

from __future__ import annotations

import functools
from typing import Any

from exporters.utils import apply_fx_node_fixes, register_patch
from exporters.workarounds.onnx.translations import _ONNX_COMPLEX_TRANSLATION_TABLE, _ONNX_TRANSLATION_TABLE, _is_complex

# ── Stage 2: ONNX patches ────────────────────────────────────────────────────
# Patches on torch.onnx internals, installed around torch.onnx.export. The one below re-runs the
# FX node fixes after torch.onnx's own run_decompositions, so that nodes the decomposition
# introduces (shape guards, alias ops) are fixed before lowering.

_CURRENT: dict[str, Any] = {}  # the registry and fired log of the export in progress


@register_patch("onnx", "torch.onnx._internal.exporter._fx_passes.decompose_with_registry")
def _patch_refix_after_decompositions(original):
    """Re-run the FX node fixes on the graph torch.onnx has just decomposed."""
    @functools.wraps(original)
    def decompose(exported_program, registry):
        for target, function in _ONNX_COMPLEX_TRANSLATION_TABLE.items():
            # torch.onnx.export's custom_translation_table registers real-valued functions only
            registry.register_op(target, function, is_complex=True)
        program = original(exported_program, registry)
        reg, fired = _CURRENT.get("registry"), _CURRENT.get("fired")
        if reg is not None:
            apply_fx_node_fixes(reg.fixes("onnx", "node"), program.graph_module, fired)
            for node in program.graph.nodes:  # custom translations this program will use
                if node.op != "call_function":
                    continue
                if node.target in _ONNX_TRANSLATION_TABLE:
                    fired.add(f"translation:onnx:{_ONNX_TRANSLATION_TABLE[node.target].__name__}")
                if node.target in _ONNX_COMPLEX_TRANSLATION_TABLE and _is_complex(node.args[0]):
                    fired.add(f"translation:onnx:{_ONNX_COMPLEX_TRANSLATION_TABLE[node.target].__name__}")
        return program

    return decompose
