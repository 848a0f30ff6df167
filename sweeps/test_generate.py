"""The generate sweep: one item per (backend, variant, generative model class).

Each item exports the class's prefill and decode step (``export_for_generation``), drives them token
by token from the artifacts alone, and compares with eager ``model.generate(do_sample=False)``
(sweeps/generate.py says what is checked). Variant ``dynamic``: the growing cache, batch, prompt and
past length dynamic. Variant ``static``: one step over a fixed-size cache updated in place (mutable
buffers on dynamo and ExecuTorch, input/output pairs on ONNX), at the zoo's batch and prompt.
"""



def test_generate(generate_case, request, generate_patches):
    from sweeps.generate import run_generate_case
    from sweeps.runner import StageFailure, property_recorder, report_failure

    case = generate_case
    record_property = property_recorder(request.node.user_properties)
    for key, value in (("model_class", case.entry.class_name), ("model_type", case.entry.model_type),
                       ("backend", case.backend), ("variant", case.variant), ("test", "generate"),
                       ("repro", case.repro)):
        record_property(key, value)
    try:
        run_generate_case(case, record_property)
    except StageFailure as failure:
        report_failure(failure, record_property, case)
