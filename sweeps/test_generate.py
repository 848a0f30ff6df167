"""The generate sweep: one item per (backend, variant, generative model class).

Each item exports the class's prefill and decode step (``export_for_generation``), drives them token
by token from the artifacts alone, and compares with eager ``model.generate(do_sample=False)``
(sweeps/generate.py says what is checked). Variant ``dynamic``: the growing cache, batch, prompt and
past length dynamic. The ``static`` variant (a fixed-size cache updated in place) is not collected
until exporters/generation builds that cache form.
"""

import pytest


def test_generate(generate_case, request, generate_patches):
    from sweeps.generate import run_generate_case
    from sweeps.runner import StageFailure
    from sweeps.signature import error_signature, root_cause

    case = generate_case
    properties = request.node.user_properties

    def record_property(key, value):
        for i, (k, _) in enumerate(properties):
            if k == key:
                properties[i] = (key, value)
                return
        properties.append((key, value))

    for key, value in (("model_class", case.entry.class_name), ("model_type", case.entry.model_type),
                       ("backend", case.backend), ("variant", case.variant), ("test", "generate"),
                       ("repro", case.repro)):
        record_property(key, value)
    try:
        run_generate_case(case, record_property)
    except StageFailure as failure:
        cause = root_cause(failure.__cause__)
        record_property("stage", failure.stage)
        record_property("error", error_signature(cause))
        from sweeps.zoo import BlockedByPackage

        if isinstance(cause, BlockedByPackage):
            pytest.xfail(f"build: {cause}")
        raise AssertionError(f"[{failure.stage}] {type(cause).__name__}: {cause}\nrepro: {case.repro}") from cause
