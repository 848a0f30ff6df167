"""The peer side of ``benchmarks/peer_compare.py``: one item built, exported with ``transformers.exporters``,
run and compared with our rule, in a child process (steps 1-6 of peer_compare's docstring), and the dynamic
dims and candidate shapes of step 6.

Imported by peer_compare.py, which first puts the repository root on ``sys.path``.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from typing import Any

from sweeps.report.summary import PEER_PRE_EXPORT as PRE_EXPORT_STAGES

SEED = 0
PEER_CONFIGS = {"dynamo": "DynamoConfig", "onnx": "OnnxConfig", "executorch": "ExecutorchConfig"}
MAX_SHAPE_CANDIDATES = 5


# ── the peer, in a child process ──────────────────────────────────────────────

def _flatten_actual(actual: Any, expected: Mapping[str, Any]) -> dict[str, Any]:
    """The peer's outputs under our names: ``flatten_outputs`` on what it returns (a ModelOutput),
    or, for a flat list/tuple of tensors, positionally onto ``list(expected)`` when counts match."""
    import torch

    from exporters.utils import flatten_outputs

    if isinstance(actual, (list, tuple)) and not hasattr(actual, "keys") \
            and all(isinstance(t, torch.Tensor) for t in actual) and len(actual) == len(expected):
        return dict(zip(list(expected), actual))
    return flatten_outputs(actual)


def _ep_dynamic_dims(ep, inputs: Mapping[str, Any]) -> dict[str, dict[int, dict[str, int | None]]]:
    """``{input name: {dim: {"min", "max"}}}`` of a torch ExportedProgram's symbolic user inputs."""
    import sympy
    import torch
    import torch.fx._pytree as fx_pytree
    from torch.export.graph_signature import InputKind

    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    user = [placeholders.get(s.arg.name) for s in ep.graph_signature.input_specs
            if s.kind == InputKind.USER_INPUT]
    tensor_names = {id(v): k for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    try:
        leaves = fx_pytree.tree_flatten_spec(((), dict(inputs)), ep.call_spec.in_spec)
        names = [tensor_names.get(id(leaf)) for leaf in leaves]
        if len(names) != len(user):
            raise ValueError("leaf count")
    except Exception:  # noqa: BLE001 - fall back on placeholder names (torch names them after the kwargs)
        names = [n.name if n is not None and n.name in tensor_names.values() else None for n in user]
    dims: dict[str, dict[int, dict[str, int | None]]] = {}
    for name, node in zip(names, user):
        val = node.meta.get("val") if node is not None else None
        if name is None or not isinstance(val, torch.Tensor):
            continue
        for d, size in enumerate(val.shape):
            if not isinstance(size, torch.SymInt):
                continue
            expr = size.node.expr
            low = high = None
            if isinstance(expr, sympy.Symbol) and expr in ep.range_constraints:
                vr = ep.range_constraints[expr]
                low, high = _finite_int(vr.lower), _finite_int(vr.upper)
            dims.setdefault(name, {})[d] = {"min": low, "max": high}
    return dims


def _finite_int(bound) -> int | None:
    """A range bound as an int; None for an infinite one (torch's ``int_oo``)."""
    try:
        value = int(bound)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None
    return value if abs(value) < 2**62 else None


def _onnx_dynamic_dims(model, inputs: Mapping[str, Any]) -> dict[str, dict[int, dict[str, int | None]]]:
    dims: dict[str, dict[int, dict[str, int | None]]] = {}
    for value in model.graph.inputs:
        name = value.name[len("input."):] if value.name.startswith("input.") else value.name
        if name not in inputs or value.shape is None:
            continue
        for d, size in enumerate(value.shape):
            if not isinstance(size, int):
                dims.setdefault(name, {})[d] = {"min": None, "max": None}
    return dims


def peer_dynamic_dims(backend: str, program: Any, inputs: Mapping[str, Any]) -> dict:
    """The dynamic input dims of the peer's program (see the module docstring)."""
    if backend == "onnx":
        return _onnx_dynamic_dims(program, inputs)
    if backend == "executorch":
        program = program.exported_program()
    return _ep_dynamic_dims(program, inputs)


class _ShapeView:
    """What ``sweeps.shapes.size_groups`` / ``resize_inputs`` read off one of our artifacts."""

    def __init__(self, dynamic_dims, inputs):
        self.dynamic_dims = dynamic_dims
        self.input_specs = {k: (tuple(v.shape), v.dtype) for k, v in inputs.items() if hasattr(v, "shape")}


def shape_candidates(groups: Mapping[int, tuple[int, int]], limit: int = MAX_SHAPE_CANDIDATES) -> list[dict]:
    """A few deterministic ``{traced size: new size}`` choices within the groups' bounds."""
    def step(k, lo, hi, new):
        return new if lo <= new <= hi else k

    raw = [
        {k: step(k, lo, hi, k + 1) if k + 1 <= hi else step(k, lo, hi, k - 1) for k, (lo, hi) in groups.items()},
        {k: step(k, lo, hi, min(2 * k, hi)) for k, (lo, hi) in groups.items()},
    ]
    for g in groups:
        lo, hi = groups[g]
        raw.append({k: (step(k, lo, hi, k + 1) if k == g else k) for k in groups})
    out: list[dict] = []
    for sizes in raw:
        if any(sizes[k] != k for k in sizes) and sizes not in out:
            out.append(sizes)
    return out[:limit]


def _check_other_shape(backend, exported, program, model, inputs) -> tuple[int, str]:
    """Compare at one other shape. Returns (shapes compared, note); raises on a mismatch or when the
    peer refuses every candidate that eager takes."""
    import torch

    from exporters.parity import compare
    from exporters.utils import flatten_outputs
    from sweeps.shapes import ShapeMismatch, format_sizes, resize_inputs, size_groups

    view = _ShapeView(peer_dynamic_dims(backend, program, inputs), inputs)
    groups = size_groups(view)
    if not groups:
        return 0, "no dynamic dims in the peer's program"
    refused = []
    for sizes in shape_candidates(groups):
        new_inputs = resize_inputs(inputs, view, sizes)
        try:
            with torch.no_grad():
                expected = flatten_outputs(model(**new_inputs))
        except Exception:  # noqa: BLE001 - the model does not take this shape
            continue
        if not all(bool(torch.isfinite(t).all()) for t in expected.values() if t.is_floating_point()):
            continue
        try:
            actual = _flatten_actual(exported(**new_inputs), expected)
        except Exception as exc:  # noqa: BLE001 - counted as a refusal (lenient: see ASYMMETRY_NOTE)
            from sweeps.signature import error_signature

            refused.append(f"{format_sizes(sizes)}: {error_signature(exc)}")
            continue
        problems = compare(expected, actual, backend)
        if problems:
            raise ShapeMismatch(f"at sizes {format_sizes(sizes)} (traced=new): " + "; ".join(problems))
        return 1, f"compared at sizes {format_sizes(sizes)}"
    if refused:
        raise ShapeMismatch(f"the peer refuses every shape eager takes ({len(refused)}), e.g. {refused[0]}")
    return 0, "eager takes none of the candidate shapes"


def peer_int8_quantizer(backend: str, inputs: Mapping[str, Any], captured: dict[str, Any]):
    """The peer's ``PT2EQuantizer`` with XNNPACK's stock quantizer at our int8 recipe's settings (symmetric,
    per-channel, static, our weight range for the backend), calibrated on the item's inputs; the module
    ``convert_pt2e`` returns and the inputs it was traced with are kept in ``captured`` (the reference)."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from transformers.exporters.quantizers import PT2EQuantizer

    from exporters.quantization import int8

    low, high = int8(calibration=[dict(inputs)]).weight_range(backend)
    stock = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(
        is_per_channel=True, weight_qmin=low, weight_qmax=high))

    class Capturing(PT2EQuantizer):
        def quantize(self, model, sample_inputs, export_format):
            converted = super().quantize(model, sample_inputs, export_format)
            captured.update(module=converted, inputs=dict(sample_inputs))
            return converted

    return Capturing(stock, calibration_dataset=[dict(inputs)])


def _quantized_verdict(captured: Mapping[str, Any], eager: Mapping[str, Any], actual_raw: Any, backend: str) -> dict:
    """Raise our quantized rule's ParityError where the peer's artifact is off its own quantized model
    (the ``convert_pt2e`` module run in PyTorch); return the reference's SQNR against fp32 eager."""
    import torch

    from exporters.parity import assert_close_quantized, sqnr_db
    from exporters.utils import flatten_outputs

    if "module" not in captured:
        raise RuntimeError("the peer's export never called its PT2EQuantizer")
    with torch.no_grad():
        reference = flatten_outputs(captured["module"](**captured["inputs"]))
    actual = {k: torch.as_tensor(v) for k, v in _flatten_actual(actual_raw, reference).items()}
    first = next((k for k, v in reference.items() if v.is_floating_point() and k in eager
                  and eager[k].shape == v.shape), None)
    assert_close_quantized(reference, actual, backend)
    return {"peer_sqnr_db": round(sqnr_db(eager[first], reference[first]), 2) if first else None}


def load_on_cpu(exported, backend: str) -> None:
    """The peer's programs loaded on their runtime on CPU: ONNX Runtime with one intra-op thread, like ours;
    ExecuTorch ignores the device (the program runs where it was lowered for)."""
    if backend == "onnx":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        exported.to("cpu", session_options=options)
    else:
        exported.to("cpu")


def peer_item(class_name: str, backend: str, variant: str, onnx_optimize: bool | None = None) -> dict[str, Any]:
    """Export one item with the peer and compare it to eager with our rule. Runs in a child process. A generate
    item (variant ``generate-static`` / ``generate-dynamic``) is ``peer_generate.peer_generate_item``'s."""
    if variant.startswith("generate-"):
        from peer_generate import peer_generate_item

        return peer_generate_item(class_name, backend, variant, onnx_optimize)
    warnings.filterwarnings("ignore")
    stage = "build"
    row: dict[str, Any] = {"class": class_name, "backend": backend, "variant": variant}
    start = time.perf_counter()
    try:
        import torch

        from sweeps.zoo import build_tiny, resolve_models, run_eager

        (entry,) = [e for e in resolve_models([class_name]) if e.class_name == class_name]
        tiny = build_tiny(entry, seed=SEED, check=False)
        stage = "eager"
        # the zoo's eager check, as our sweep runs it: where the generic inputs are refused it switches
        # to the layout alternative the zoo validated, so both sides get the same inputs
        with torch.no_grad():
            eager_raw = run_eager(tiny, SEED)
        model, inputs = tiny.model, tiny.inputs
        stage = "export"
        from transformers import exporters as peer

        kwargs: dict[str, Any] = {"dynamic": variant == "dynamic"}
        if backend == "onnx" and onnx_optimize is not None:
            kwargs["optimize"] = onnx_optimize
        captured: dict[str, Any] = {}
        if variant == "int8":
            kwargs["quantizer"] = peer_int8_quantizer(backend, inputs, captured)
        config = getattr(peer, PEER_CONFIGS[backend])(**kwargs)
        exporter = peer.AutoHfExporter.from_config(config)
        exported = exporter.export(model, dict(inputs), config)
        stage = "run"
        load_on_cpu(exported, backend)
        actual_raw = exported(**inputs)
        stage = "compare"
        from exporters.parity import compare
        from exporters.utils import flatten_outputs

        # flattened after the peer export: both sides see the same pytree registration
        expected = flatten_outputs(eager_raw)
        bad = [k for k, t in expected.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
        if bad:
            stage = "eager"
            raise ValueError(f"eager outputs {bad} are not finite: the tiny model is useless for parity")
        if variant == "int8":  # judged against the peer's own quantized model, by our quantized rule
            row.update(_quantized_verdict(captured, expected, actual_raw, backend))
            stage = "done"
            row.update(peer="pass", peer_stage=stage)
            row["peer_duration_s"] = round(time.perf_counter() - start, 3)
            return row
        problems = compare(expected, _flatten_actual(actual_raw, expected), backend)
        if problems:
            from exporters.parity import ParityError

            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            # the first problem on the first line: that line is the error signature
            raise ParityError(f"{backend} peer artifact does not match eager: {problems[0]}{more}\n  "
                              + "\n  ".join(problems))
        if variant == "dynamic":
            stage = "shapes"
            checked, note = _check_other_shape(backend, exported, exported.program, model, inputs)
            row.update(shapes_checked=checked, shapes_note=note)
        stage = "done"
        row.update(peer="pass", peer_stage=stage)
    except BaseException as exc:  # noqa: BLE001 - the item's verdict
        from sweeps.signature import error_signature

        not_compared = stage in PRE_EXPORT_STAGES  # no export to judge: our side fails there too
        row.update(peer="not compared" if not_compared else "fail", peer_stage=stage,
                   peer_error=error_signature(exc), peer_detail=str(exc)[:2000])
    row["peer_duration_s"] = round(time.perf_counter() - start, 3)
    return row
