"""The quantized sweep: one item per (backend, recipe, catalog class), onnx and executorch, static shapes.

Each item quantizes the class's tiny model with the recipe (PT2E, calibrated on the item's inputs),
exports it, runs it in the backend's runtime, and compares with PyTorch's quantized model, in units of
the output's quantization step (sweeps/quantized.py, exporters/parity.py).
"""


def test_quantized(quantized_case, request, quantized_patches):
    from sweeps.quantized import run_quantized_case
    from sweeps.runner import StageFailure, property_recorder, report_failure

    case = quantized_case
    record_property = property_recorder(request.node.user_properties)
    for key, value in (("model_class", case.entry.class_name), ("model_type", case.entry.model_type),
                       ("backend", case.backend), ("variant", case.variant), ("test", "quantized"),
                       ("repro", case.repro)):
        record_property(key, value)
    try:
        run_quantized_case(case, record_property)
    except StageFailure as failure:
        report_failure(failure, record_property, case)
