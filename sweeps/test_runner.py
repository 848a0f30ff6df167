"""The runner sweep: one item per (runtime, decoder LM class of the causal-LM mapping).

Each item saves the folder a runtime's own LLM runner loads (``save(runner=True)``), runs that runner
(ExecuTorch's ``TextLLMRunner``, onnxruntime-genai), and compares its greedy tokens with eager
``model.generate(do_sample=False)`` (sweeps/llm_runners.py says what is checked).
"""


def test_runner(runner_case, request, runner_patches):
    from sweeps.llm_runners import run_runner_case
    from sweeps.runner import StageFailure, property_recorder, report_failure

    case = runner_case
    record_property = property_recorder(request.node.user_properties)
    for key, value in (("model_class", case.entry.class_name), ("model_type", case.entry.model_type),
                       ("backend", case.backend), ("variant", case.variant), ("test", "runner"),
                       ("repro", case.repro)):
        record_property(key, value)
    try:
        run_runner_case(case, record_property)
    except StageFailure as failure:
        report_failure(failure, record_property, case)
