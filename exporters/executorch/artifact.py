"""The ExecuTorch artifact: a .pte program run in the ExecuTorch runtime, its inputs checked against the
program's memory plan, and runtime errors named.
"""

from __future__ import annotations

import torch

from exporters.base import Artifact


def missing_kernels(buffer: bytes, registered) -> list[str]:
    """The operators a .pte program calls (outside delegates) that the runtime has no kernel for,
    as ``namespace::op.overload``, in program order."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    registered = set(registered)
    names = []
    for plan in deserialize_pte_binary(buffer).program.execution_plan:
        for op in plan.operators:
            name = f"{op.name}.{op.overload}" if op.overload else op.name
            if name not in registered and name not in names:
                names.append(name)
    return names


# executorch/runtime/core/error.h: the codes a failed load reports, by name
_RUNTIME_ERRORS = {
    0x01: "Internal", 0x02: "InvalidState", 0x10: "NotSupported", 0x11: "NotImplemented",
    0x12: "InvalidArgument", 0x13: "InvalidType", 0x14: "OperatorMissing", 0x20: "NotFound",
    0x21: "MemoryAllocationFailed (the method's planned memory or a buffer could not be allocated)",
    0x22: "AccessFailed", 0x23: "InvalidProgram", 0x25: "OutOfResources",
    0x30: "DelegateInvalidCompatibility", 0x31: "DelegateMemoryAllocationFailed", 0x32: "DelegateInvalidHandle",
}


def runtime_error_name(message: str) -> str:
    """The name of the ExecuTorch error code in ``message`` ("... error: 0x:21" -> MemoryAllocationFailed)."""
    import re

    found = re.search(r"0x:?([0-9a-fA-F]+)", message)
    code = int(found.group(1), 16) if found else None
    return f"ExecuTorch error {_RUNTIME_ERRORS.get(code, 'code unknown to this suite')}"


def load_forward(buffer: bytes):
    """Load a .pte program and its ``forward`` method; a method that cannot load because the runtime
    lacks a kernel names the missing operators instead of an error code."""
    from executorch.runtime import Runtime, Verification

    runtime = Runtime.get()
    program = runtime.load_program(buffer, verification=Verification.Minimal)
    try:
        return program, program.load_method("forward")
    except RuntimeError as exc:
        missing = missing_kernels(buffer, runtime.operator_registry.operator_names)
        if not missing:
            raise RuntimeError(f"{exc}: {runtime_error_name(str(exc))}") from exc
        raise RuntimeError(
            f"the ExecuTorch runtime has no kernel for {', '.join(missing)}, which the program calls "
            "outside any delegate: lower the op to ops the runtime has (an executorch node fix) or "
            f"link a kernel library that registers it ({exc})"
        ) from exc


# the runtime's log lines that say why a call failed: a kernel's check, a missing operator, a delegate's refused
# output resize ("Attempted to resize a static tensor. Expected shape (1, 16, 8, 8), but received (1, 8, 8, 8)"),
# and the instruction that failed
_RUNTIME_FAILURE_LINES = ("Check failed", "KernelCall failed", "Missing operator", "failed with error",
                          "Attempted to resize", "Failed to resize", "execute failed at instruction")


def execute_with_runtime_log(method, inputs):
    """``method.execute(inputs)``; when it fails, the error carries what the runtime logged about it.
    The runtime reports only a code ("method->execute() failed with error 0x12") and logs the cause
    ("Check failed (in.dim() == 3 || in.dim() == 4) ...", "KernelCall failed at instruction 0:9 in
    operator aten::convolution.out"), which a report never sees. Its log is captured during the call,
    at the file descriptor and at ``sys.stderr`` (the bindings write to either, depending on what
    stderr is), and passed on unchanged."""
    import contextlib
    import io
    import os
    import sys
    import tempfile

    sys.stderr.flush()
    python_log = io.StringIO()
    with tempfile.TemporaryFile() as fd_log:
        saved = os.dup(2)
        os.dup2(fd_log.fileno(), 2)
        try:
            with contextlib.redirect_stderr(python_log):
                return method.execute(inputs)
        except RuntimeError as exc:
            os.dup2(saved, 2)
            fd_log.seek(0)
            logged = fd_log.read().decode(errors="replace") + python_log.getvalue()
            lines = [line.strip() for line in logged.splitlines() if any(key in line for key in _RUNTIME_FAILURE_LINES)]
            if not lines:
                raise
            raise RuntimeError(f"{exc}; the runtime logged: {' | '.join(lines[:4])}") from exc
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            fd_log.seek(0)
            os.write(2, fd_log.read())
            sys.stderr.write(python_log.getvalue())


class ExecutorchArtifact(Artifact):
    backend = "executorch"
    file_name = "model.pte"

    def __init__(self, buffer: bytes, *, mutated_inputs: tuple[str, ...] = (), planned_bytes: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.buffer = buffer
        self.mutated_inputs = tuple(mutated_inputs)
        self.extra_metadata["mutated_inputs"] = list(self.mutated_inputs)
        try:
            self._program, self._method = load_forward(buffer)
        except MemoryError as exc:
            if planned_bytes is None:
                raise
            raise MemoryError(
                f"loading the program allocates its memory plan, {planned_bytes / 2**30:.1f} GiB for every dynamic "
                f"dim at its upper bound (max_dim {self.config.max_dim}), and this machine could not ({exc}): "
                "export with smaller bounds (ExecutorchConfig.max_dim, or dynamic_shapes with a max per dim)"
            ) from exc

    def _run(self, ordered):
        self._check_planned_sizes(ordered)
        outputs = execute_with_runtime_log(self._method, [t.contiguous() for t in ordered])
        outputs = [o if isinstance(o, torch.Tensor) else torch.as_tensor(o) for o in outputs]
        # the program returns the inputs forward mutated in place (``pixel_values *= mask``) ahead of
        # its outputs: write them back into the caller's tensors, as eager and the dynamo artifact do
        k = len(self.mutated_inputs)
        if k and len(outputs) == k + len(self.output_names):
            for name, value in zip(self.mutated_inputs, outputs[:k]):
                ordered[self.input_names.index(name)].copy_(value)
            outputs = outputs[k:]
        return outputs

    def _planned_input_sizes(self) -> list[tuple[int, ...] | None] | None:
        """Each input's planned sizes (its bound per dim) from the method's metadata, read once per
        artifact; None for a non-tensor input; None altogether for a runtime without these bindings."""
        if not hasattr(self, "_planned"):
            self._planned = self._read_planned_input_sizes()
        return self._planned

    def _read_planned_input_sizes(self) -> list[tuple[int, ...] | None] | None:
        try:
            meta = self._program.metadata("forward")
            count = meta.num_inputs()
        except Exception:  # noqa: BLE001  (a runtime without these bindings: its own error stands)
            return None
        planned = []
        for i in range(count):
            try:
                planned.append(tuple(meta.input_tensor_meta(i).sizes()))
            except Exception:  # noqa: BLE001  (not a tensor input)
                planned.append(None)
        return planned

    def _check_planned_sizes(self, ordered) -> None:
        """The runtime refuses an input larger than the memory its program planned for it with a bare
        code (``set_inputs`` 0x10 for a tensor planned static, 0x12 for one past its bound); name the
        input, the dim and the planned bound instead. The input checks take what torch.export allowed:
        a plan smaller than that means the lowering specialized or narrowed a dynamic dim (AutoformerModel's
        batch, planned at its traced 2 while its range was [2, 64]), which is the export's defect, so this
        is a RuntimeError and not an InputError that the shape checks would skip."""
        planned = self._planned_input_sizes()
        if planned is None or len(planned) != len(ordered):
            return
        for name, value, sizes in zip(self.input_names, ordered, planned):
            if sizes is None or len(sizes) != value.dim():
                continue
            for d, (size, bound) in enumerate(zip(value.shape, sizes)):
                if size <= bound:
                    continue
                spec = self.input_specs[name][2].get(d)
                narrowed = (f"; torch.export gave it the range [{spec['min']}, {spec['max']}] ({spec['symbol']}), "
                            "so the ExecuTorch lowering specialized or narrowed it"
                            if spec and (spec["max"] is None or spec["max"] > bound) else "")
                raise PlannedShapeError(
                    f"input {name!r} dim {d} is {size}, but the ExecuTorch program was planned for at most {bound}"
                    + narrowed)

    def _save_model(self, path):
        with open(path, "wb") as f:
            f.write(self.buffer)


class PlannedShapeError(RuntimeError):
    """An ExecuTorch artifact called with an input larger than its program's memory plan allows."""
