"""Helper for the model patches that act only while onnxruntime-genai's one graph is exported
(exporters/generation/genai_state.py): a closed form of a multi-token path that the model's own generate never
takes from a given state (rwkv_wkv.py, xlstm_mlstm.py)."""

from __future__ import annotations

import contextlib

_ENTERED: list[bool] = []


@contextlib.contextmanager
def one_graph_export():
    """Within: the patches that check ``exporting_one_graph()`` act (while the export's patches are installed)."""
    _ENTERED.append(True)
    try:
        yield
    finally:
        _ENTERED.pop()


def exporting_one_graph() -> bool:
    return bool(_ENTERED)
