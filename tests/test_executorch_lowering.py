"""ExecutorchExporter's backend preparation and lowering loop: bounded dynamic shapes, retries (per-op
partitions, unbacked sizes bounded by trace), saved buffers, and the artifact's runtime errors
(exporters/exporter_executorch.py, exporters/executorch/)."""

from __future__ import annotations

import pytest
import torch

import exporters.executorch.lowering as lowering
import exporters.exporter_executorch as et
from exporters import ExportStageError
from exporters.executorch.artifact import load_forward, missing_kernels, runtime_error_name


def test_prepare_for_xnnpack_moves_to_cpu_fp32():
    model = torch.nn.Linear(2, 2).to(torch.float64)
    m, inputs, partitioners = et._BACKEND_PREPARE["xnnpack"](model, {"x": torch.zeros(1, 2), "flag": True})
    assert next(m.parameters()).dtype == torch.float32
    assert inputs["flag"] is True and inputs["x"].device.type == "cpu"
    assert len(partitioners) == 1 and "Xnnpack" in type(partitioners[0]).__name__


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA device")
def test_prepare_for_cuda_without_gpu_says_no_cuda_device():
    with pytest.raises(RuntimeError, match=r"(?i)cuda device"):
        et._BACKEND_PREPARE["cuda"](torch.nn.Linear(2, 2), {"x": torch.zeros(1, 2)})
    from exporters import ExecutorchConfig, ExecutorchExporter

    with pytest.raises(Exception, match=r"(?i)cuda device"):
        ExecutorchExporter().export(torch.nn.Linear(2, 2), {"input": torch.zeros(1, 2)}, ExecutorchConfig(backend="cuda"))


def test_executorch_unknown_backend_lists_registered():
    from exporters import ExecutorchConfig, ExecutorchExporter

    with pytest.raises(ValueError, match="xnnpack"):
        ExecutorchExporter().export(torch.nn.Linear(2, 2), {"input": torch.zeros(1, 2)}, ExecutorchConfig(backend="vulkan9"))


def test_executorch_bounds_unbounded_dims_before_tracing():
    """Memory planning needs every dynamic dim bounded when torch.export runs."""
    from torch.export import Dim

    spec = {"x": {0: Dim("n", min=2), 1: Dim("m", min=2, max=10), 2: Dim.AUTO}, "y": [None, {0: Dim.AUTO(max=5)}]}
    bounded = et.bound_dynamic_shapes(spec, 64)
    assert (bounded["x"][0].min, bounded["x"][0].max) == (2, 64)
    assert bounded["x"][1].max == 10  # already bounded: kept
    assert bounded["x"][2].max == 64
    assert bounded["y"][0] is None and bounded["y"][1][0].max == 5
    assert spec["x"][0].max != 64  # the caller's spec is not mutated


class _ReassignsItsBuffer(torch.nn.Module):
    """Reassigns its buffer in forward, as CTRL does with ``self.pos_encoding = self.pos_encoding.to(...)``."""

    def __init__(self):
        super().__init__()
        self.pos_encoding = torch.nn.Buffer(torch.randn(16, 8), persistent=False)

    def forward(self, x):
        self.pos_encoding = self.pos_encoding.to(device=x.device, dtype=x.dtype)
        return x + self.pos_encoding[: x.shape[0]]


def test_executorch_buffers_keep_their_values():
    """After to_edge the reassignment is a buffer mutation, and ExecuTorch saves a mutated buffer
    without its values unless told to: the program read zeros for the position encodings."""
    torch.manual_seed(0)
    model, inputs = _ReassignsItsBuffer().eval(), {"x": torch.randn(3, 8)}
    expected = model(**inputs)
    (actual,) = et.ExecutorchExporter().export(model, inputs)(**inputs).values()
    torch.testing.assert_close(actual, expected)


def test_executorch_runtime_error_codes_are_named():
    assert "MemoryAllocationFailed" in runtime_error_name("Failed to load method forward, error: 0x:21")
    assert "OperatorMissing" in runtime_error_name("error: 0x14")
    assert "unknown" in runtime_error_name("no code here")


class _DataDependentLength(torch.nn.Module):
    """A length read from data (Siglip2's patch grid, Lfm2-VL's image token count)."""

    def forward(self, x, counts):
        n = counts.sum().item()
        torch._check(n >= 0)
        return torch.arange(n, dtype=x.dtype) * x.sum()  # a length bounded by nothing but the data


def test_executorch_unbacked_size_bounded_by_its_traced_value(monkeypatch):
    inputs = {"x": torch.randn(8, 3), "counts": torch.tensor([2, 1, 2])}
    with monkeypatch.context() as m:
        m.setattr(lowering, "bound_unbacked_sizes_by_trace", lambda program, inputs: False)
        with pytest.raises(ExportStageError, match="Cannot evaluate a finite upper bound"):
            et.ExecutorchExporter().export(_DataDependentLength(), inputs)
    art = et.ExecutorchExporter().export(_DataDependentLength(), inputs)
    assert "fix:executorch:bound_unbacked_sizes_by_trace" in art.workarounds_fired
    for counts in ([2, 1, 2], [1, 1, 1]):  # the traced length and a shorter one
        feed = {"x": inputs["x"], "counts": torch.tensor(counts)}
        torch.testing.assert_close(next(iter(art(**feed).values())), _DataDependentLength()(**feed))
    with pytest.raises(RuntimeError, match="resize"):  # longer than planned: refused, not wrong
        art(x=inputs["x"], counts=torch.tensor([3, 3, 1]))


class _LengthFromMask(torch.nn.Module):
    """Longformer's padded length / JetMoE's expert counts: a size read from data that grows with the
    (dynamic) sequence."""

    def forward(self, x, mask):
        n = mask.sum().item()
        torch._check(n >= 0)
        return torch.arange(n, dtype=x.dtype) * x.amax()  # amax: exact, whatever the order


def test_executorch_unbacked_size_bounded_at_the_largest_inputs():
    inputs = {"x": torch.randn(2, 7), "mask": torch.ones(2, 7, dtype=torch.long)}
    seq = torch.export.Dim("seq", min=2, max=32)
    art = et.ExecutorchExporter().export(_LengthFromMask(), inputs, et.ExecutorchConfig(
        dynamic=True, dynamic_shapes={"x": {1: seq}, "mask": {1: seq}}))
    assert "fix:executorch:bound_unbacked_sizes_by_trace" in art.workarounds_fired
    for length in (7, 12, 32):  # bounded at the traced 14 only, 24 and 64 were refused
        feed = {"x": torch.randn(2, length), "mask": torch.ones(2, length, dtype=torch.long)}
        torch.testing.assert_close(next(iter(art(**feed).values())), _LengthFromMask()(**feed))


def test_executorch_missing_kernel_is_named():
    """A program that calls an op the runtime has no kernel for fails to load with the op's name,
    not an error code."""
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    class B(torch.nn.Module):
        def forward(self, x):
            return torch.bucketize(x, torch.tensor([0.1, 0.5]), right=True)

    program = torch.export.export(B(), (torch.rand(4),))
    buffer = to_edge_transform_and_lower(program, compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_executorch().buffer
    assert missing_kernels(buffer, ["dim_order_ops::_clone_dim_order.out"]) == ["aten::bucketize.Tensor_out"]
    with pytest.raises(RuntimeError, match=r"no kernel for aten::bucketize.Tensor_out, which the program calls"):
        load_forward(buffer)


def test_executorch_partition_cycle_lowers_again_per_op(monkeypatch):
    """FlavaForPreTraining: fusing XNNPACK's partitions found a dependency cycle between two of them. The
    exporter lowers again with one partition per op, and names that in the workarounds fired."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    real, seen = lowering._lower_program, []

    def cyclic_unless_per_op(program, partitioners, et_patches, fired, constant_methods=None):
        seen.append([getattr(p, "per_op_mode", None) for p in partitioners])
        if not all(p.per_op_mode for p in partitioners if isinstance(p, XnnpackPartitioner)):
            raise AssertionError("Invalid partition, found dependency cycles")
        return real(program, partitioners, et_patches, fired, constant_methods)

    monkeypatch.setattr(lowering, "_lower_program", cyclic_unless_per_op)
    inputs = {"input": torch.randn(2, 5)}
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    art = et.ExecutorchExporter().export(model, inputs)
    assert seen == [[False], [True]]
    assert "fix:executorch:per_op_partitions_on_cycle" in art.workarounds_fired
    torch.testing.assert_close(art(**inputs)["output"], model(inputs["input"]))
    assert lowering.per_op_partitioners([]) is None  # no XNNPACK partitioner: the error is raised as it is
    monkeypatch.setattr(lowering, "_lower_program", lambda *a: (_ for _ in ()).throw(AssertionError("something else")))
    with pytest.raises(ExportStageError, match="something else"):
        et.ExecutorchExporter().export(model, inputs)


class _PairConv(torch.nn.Module):
    """EfficientLoFTR's backbone: image pairs folded into the conv batch, an unstrided 3x3 conv."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, kernel_size=3, padding=1)

    def forward(self, pixel_values):
        b, pair, c, h, w = pixel_values.shape
        return self.conv(pixel_values.reshape(b * pair, c, h, w))


def test_executorch_conv_batch_not_narrowed_by_cpu_kernel_choice():
    """ATen's CPU conv choice reads batch >= 16; the lowering must not keep that as a bound on the batch."""
    model = _PairConv().eval()
    batch = torch.export.Dim("batch", min=2, max=32)
    art = et.ExecutorchExporter().export(model, {"pixel_values": torch.randn(2, 2, 3, 8, 8)}, et.ExecutorchConfig(
        dynamic=True, dynamic_shapes={"pixel_values": {0: batch}}))
    assert art._planned_input_sizes()[0][0] == 32  # narrowed to 7 (2*b < 16) before cpu_conv_heuristics_off
    feed = torch.randn(20, 2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(next(iter(art(pixel_values=feed).values())), model(feed), rtol=1e-4, atol=1e-4)
    assert torch.backends.mkldnn.enabled  # restored after the lowering


def test_a_failed_call_carries_the_runtime_log_lines_that_say_why():
    """The runtime reports a code (0x10) and logs the cause; the error carries the cause's lines, not the noise."""
    import sys

    from exporters.executorch.artifact import execute_with_runtime_log

    class Method:
        def execute(self, inputs):
            print("[cpuinfo_utils.cpp:87] Failed to open midr file", file=sys.stderr)
            print("[tensor_impl.cpp:135] Attempted to resize a static tensor. Expected shape (1, 16, 8, 8), but "
                  "received (1, 8, 8, 8).", file=sys.stderr)
            print("[XNNExecutor.cpp:279] Failed to resize output tensor for XNNExecutor", file=sys.stderr)
            print("[method.cpp:1528] CALL_DELEGATE execute failed at instruction 147: 0x10", file=sys.stderr)
            raise RuntimeError("method->execute() failed with error 0x10")

    with pytest.raises(RuntimeError) as info:
        execute_with_runtime_log(Method(), [])
    message = str(info.value)
    assert "Attempted to resize a static tensor. Expected shape (1, 16, 8, 8)" in message
    assert "execute failed at instruction 147" in message and "midr" not in message


class _CrossAttends(torch.nn.Module):
    """Reads its input through a view whose layout depends on the input's strides, as FSMT's decoder
    reads ``encoder_outputs`` (``transpose(0, 1)`` then a linear and a ``view`` of its heads)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, hidden):
        return self.proj(hidden.transpose(0, 1)).reshape(hidden.shape[1], -1)


@pytest.mark.parametrize("dynamic", [False, True])
def test_executorch_traces_a_transposed_input_as_the_contiguous_input_it_is_fed(dynamic):
    """An example input held transposed (FSMT's encoder returns ``x.transpose(0, 1)``, which generate hands
    the prefill) is traced contiguous: the artifact feeds the runtime contiguous memory, and a program
    planned for the input's dim order (1, 0, 2) read it transposed (FSMT's prefill logits 7.7e-4 off)."""
    from exporters import ExecutorchConfig, ExecutorchExporter

    torch.manual_seed(0)
    model = _CrossAttends().eval()
    hidden = torch.randn(3, 2, 8).transpose(0, 1)  # (2, 3, 8), strides (8, 16, 1)
    assert not hidden.is_contiguous()
    artifact = ExecutorchExporter().export(model, {"hidden": hidden}, ExecutorchConfig(dynamic=dynamic))
    with torch.no_grad():
        want = model(hidden)
    got = next(iter(artifact(hidden=hidden).values()))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
