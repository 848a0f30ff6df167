"""The conformance sweep: one item per (backend, variant, model class).

Each item builds the class's tiny model (once per process), runs eager, exports with the
backend's exporter, runs the artifact in its runtime, compares to eager, and for dynamic items
compares again at Hypothesis-drawn shapes. Properties recorded for the report: model_class,
model_type, backend, variant, stage (the last reached), error (normalized signature), repro.
"""



def test_export(sweep_case, request, export_patches, keep_artifacts):
    from sweeps.runner import StageFailure, keep_dir_for, property_recorder, report_failure, run_case

    case = sweep_case
    record_property = property_recorder(request.node.user_properties)
    for key, value in (("model_class", case.entry.class_name), ("model_type", case.entry.model_type),
                       ("backend", case.backend), ("variant", case.variant), ("repro", case.repro)):
        record_property(key, value)
    keep = keep_dir_for(case, keep_artifacts) if keep_artifacts else None
    try:
        run_case(case, record_property, keep_dir=keep)
    except StageFailure as failure:
        report_failure(failure, record_property, case)
