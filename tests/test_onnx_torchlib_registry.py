"""exporters/workarounds/onnx/torchlib_registry.py: onnxscript's torchlib functions read once, torch.onnx's
registry still built per export from them."""

import torch

from exporters.utils import DEFAULT_REGISTRY, apply_patches
from exporters.workarounds.onnx import torchlib_registry


def _entry():
    (entry,) = [p for p in DEFAULT_REGISTRY.patches("onnx") if p.path.endswith("get_torchlib_ops")]
    return entry


def _registry_contents(registry):
    return {k: [(m.onnx_function, m.is_custom, m.is_complex) for m in v] for k, v in registry.functions.items()}


def test_torchlib_read_once_and_registry_built_as_before(monkeypatch):
    from onnxscript._framework_apis import torch_2_11
    from torch.onnx._internal.exporter import _registration

    entry = _entry()  # the default registry imports every workaround module (the quantized ones load quantized_decomposed)
    reads = []
    original = torch_2_11.get_torchlib_ops

    def counted():
        reads.append(1)
        return original()

    monkeypatch.setattr(torch_2_11, "get_torchlib_ops", counted)
    monkeypatch.setattr(torchlib_registry, "_READ", {})
    _registration.ONNXRegistry.from_torchlib(opset_version=18)  # the first imports torchlib (and the op namespaces it names)
    fresh = _registration.ONNXRegistry.from_torchlib(opset_version=18)  # torch's own build, unpatched
    reads.clear()
    with apply_patches([entry]) as fired:
        first = _registration.ONNXRegistry.from_torchlib(opset_version=18)
        first.register_op(torch.ops.aten.relu.default, lambda x: x)  # what custom_translation_table does
        second = _registration.ONNXRegistry().from_torchlib(opset_version=18)  # as torch.onnx's _compat.py calls it
    assert len(reads) == 1, "onnxscript's torchlib read again"
    assert fired.names() == [f"patch:onnx:{entry.path}"]
    assert _registry_contents(second) == _registry_contents(fresh)  # the same functions, in the same order
    assert first.get_decomps(torch.ops.aten.relu.default)[0].is_custom
    assert not any(m.is_custom for m in second.get_decomps(torch.ops.aten.relu.default))
    assert torch_2_11.get_torchlib_ops is counted  # restored after the block


def test_read_again_when_torchlib_gains_a_function(monkeypatch):
    from onnxscript._framework_apis import torch_2_11
    from onnxscript.function_libs.torch_lib import registration

    monkeypatch.setattr(torchlib_registry, "_READ", {})
    with apply_patches([_entry()]):
        before = torch_2_11.get_torchlib_ops()
        name, overloaded = next(iter(registration.default_registry.items()))
        monkeypatch.setattr(overloaded, "overloads", [*overloaded.overloads, overloaded.overloads[0]])
        after = torch_2_11.get_torchlib_ops()
    assert len(after) == len(before) + 1, f"{name}'s added overload not read"
