"""Exporters for Hugging Face transformers models: torch.export, ONNX and ExecuTorch.

    from exporters import OnnxExporter, OnnxConfig
    artifact = OnnxExporter().export(model, inputs, config=OnnxConfig(dynamic=True))
    outputs = artifact(**inputs)          # {"logits": tensor, "past_key_values.0.key": tensor, ...}
    artifact.save("out/")                 # model.onnx + metadata.json

    with shared_traces():                 # one model on several backends: one torch.export trace where
        ...                               # their patches agree (exporters/trace_reuse.py)

Backend runtimes (onnxruntime, executorch) are imported lazily, on first use.
"""

from .base import Artifact, ExportConfig, ExportStageError, InputError
from .exporter_dynamo import DynamoConfig, DynamoExporter
from .trace_reuse import shared_traces
from .utils import BACKENDS

__all__ = [
    "Artifact", "BACKENDS", "DynamoConfig", "DynamoExporter", "ExecutorchConfig", "ExecutorchExporter",
    "ExportConfig", "ExportStageError", "InputError", "OnnxConfig", "OnnxExporter", "get_exporter",
    "load_artifact", "load_generator", "shared_traces",
]

_LAZY = {
    "OnnxExporter": "exporter_onnx", "OnnxConfig": "exporter_onnx",
    "ExecutorchExporter": "exporter_executorch", "ExecutorchConfig": "exporter_executorch",
    "load_artifact": "loading", "load_generator": "loading",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'exporters' has no attribute {name!r}")


def get_exporter(backend: str, registry=None):
    """The exporter for ``backend`` (one of BACKENDS)."""
    classes = {"dynamo": "DynamoExporter", "onnx": "OnnxExporter", "executorch": "ExecutorchExporter"}
    if backend not in classes:
        import difflib

        close = difflib.get_close_matches(backend, BACKENDS, n=3, cutoff=0.3)
        raise ValueError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}"
                         + (f" (did you mean {', '.join(close)}?)" if close else ""))
    return __getattr__(classes[backend])(registry=registry) if backend != "dynamo" else DynamoExporter(registry=registry)
