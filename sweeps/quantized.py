"""One quantized item: quantize a class's tiny model with a named recipe (PT2E, calibrated on the
item's inputs), export it statically, run it in the backend's runtime, and compare with PyTorch's own
quantized model (the artifact's ``reference``), by the rule in ``exporters.parity.compare_quantized``.

Stages: ``build``, ``eager``, ``quantize`` (prepare, calibrate, convert), ``export``, ``lower``, ``run``,
``compare``. Properties:
- ``quantize_ops``: quantize nodes in the converted model; ``quantizable`` is False when there are none
  (nothing the quantizer annotates: the export is the fp32 one, a fact recorded, not a failure);
- ``sqnr_db``: the quantization error itself, the reference's SQNR against fp32 eager on the first
  floating output eager and the reference share (``sqnr_by_output`` for every one); below
  ``SQNR_FLOOR_DB`` the quantized reference is ``useless``, and the report says so;
- ``steps_off``: the artifact's largest distance from the reference, in quantization steps;
- ``rounding_spread_steps``: how far the reference itself moves, in steps, when its quantized activations round
  one step the other way (exporters/quantization/rounding.py); an output's bound is the larger of that and
  ``QUANT_STEPS`` (exporters/parity.py);
- ``weight_range``, ``recipe``, ``workarounds_fired``;
- ``selection_ops``: top-k, sort, argmax... in the quantized model. On int8-grid values exact ties are
  common and one step elsewhere flips a choice, moving whole rows of the output. The recipe exposes each
  selection's input and indices as outputs (exporters/quantization/selections.py) and the artifact is
  compared with the reference run with the artifact's own choices: the selection inputs by the same rule
  (a choice that differs is then a tie within the bound), everything after them given those choices.
  ``selections_differ``: how many selections chose otherwise than the reference on its own.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from sweeps.runner import RECIPES

# Below this the quantized model's noise is a third of its signal's amplitude or more: a tiny random
# model whose outputs are that far from fp32 says nothing about a real checkpoint's accuracy (ViT's
# tiny classifier: 7.7 dB, its logits an order of magnitude below the hidden states' noise).
SQNR_FLOOR_DB = 10.0


def recipe_for(name: str, inputs: dict[str, Any]):
    from exporters.quantization import int8

    if name == "int8":  # selections exposed: the reference is run with the artifact's choices (selections.py)
        return int8(calibration=[inputs], expose_selections=True)
    raise ValueError(f"unknown recipe {name!r}; known: {RECIPES}")


def _check_deterministic(first: dict, second: dict) -> None:
    """Two runs of the quantized reference on the same inputs must agree exactly; one that draws random numbers
    in eval (SpeechT5's prenet dropout) leaves nothing to compare an artifact with, and a bound wide enough
    for its draws would pass anything."""
    import torch

    from exporters.parity import ParityError

    for name, value in first.items():
        other = second.get(name)
        if not (isinstance(value, torch.Tensor) and isinstance(other, torch.Tensor) and value.shape == other.shape):
            continue
        same = value == other
        if value.is_floating_point():
            same |= value.isnan() & other.isnan()  # NaN where both runs give NaN is the same result
        if not bool(same.all()):
            gap = (value.double() - other.double()).abs().nan_to_num(nan=float("inf")).max().item()
            raise ParityError(f"the quantized reference is not deterministic: two runs on the same inputs differ at "
                              f"{name!r} (max |difference| {gap:.3g}); a random op runs in eval, so there is no "
                              "reference to compare the artifact with")


def run_quantized_case(case, record: Callable[[str, Any], None]) -> Any:
    """Run one quantized item; raise ``sweeps.runner.StageFailure`` naming the stage."""
    import torch

    from exporters import ExportStageError, get_exporter
    from exporters.parity import assert_close_quantized, compare_quantized, quantization_step, sqnr_db, steps_off
    from exporters.pytrees import flatten_outputs
    from exporters.quantization.rounding import FIRST_SEEDS, SEEDS
    from exporters.quantization.selections import choices
    from sweeps.runner import StageFailure, passes_through, reference

    stage = "build"
    record("stage", stage)
    record("recipe", case.variant)
    start = time.perf_counter()
    try:
        ref = reference(case.entry.class_name)
        model, inputs = ref.tiny.model, ref.tiny.inputs
        stage = "quantize"
        record("stage", stage)
        exporter = get_exporter(case.backend)
        config = exporter.config_class(dynamic=False, quantization=recipe_for(case.variant, inputs))
        try:
            artifact = exporter.export(model, inputs, config)
        except ExportStageError as exc:
            stage = exc.stage
            record("workarounds_fired", exc.workarounds_fired)
            raise
        record("workarounds_fired", artifact.workarounds_fired)
        meta = artifact.extra_metadata["quantization"]
        record("quantize_ops", meta["quantize_ops"])
        record("quantizable", meta["quantize_ops"] > 0)
        record("weight_range", meta["weight_range"])
        record("selection_ops", meta["selection_ops"])
        stage = "run"
        record("stage", stage)
        actual = {k: torch.as_tensor(v) for k, v in flatten_outputs(artifact(**inputs)).items()}
        own, scales = artifact.reference_scales(**inputs)  # and the grids of the outputs that leave a quantize
        _check_deterministic(own, artifact.reference(**inputs))
        expected = own
        if meta["selection_outputs"]:  # the reference given the artifact's choices (module docstring)
            chosen = choices(actual, meta["selection_outputs"])
            expected = artifact.reference_given(chosen, **inputs)
            record("selections_differ", sum(not torch.equal(a, b) for a, b in
                                            zip(chosen, choices(own, meta["selection_outputs"]), strict=True)))
        sqnr = {k: round(sqnr_db(ref.expected[k], v), 2) for k, v in own.items()
                if isinstance(v, torch.Tensor) and v.is_floating_point() and k in ref.expected
                and ref.expected[k].shape == v.shape}
        if sqnr:
            first = next(iter(sqnr.values()))
            record("sqnr_db", first if math.isfinite(first) else None)
            record("sqnr_by_output", {k: (v if math.isfinite(v) else None) for k, v in sqnr.items()})
            record("useless", bool(first < SQNR_FLOOR_DB))
        steps = [steps_off(v, actual[k], scales.get(k)) for k, v in expected.items()
                 if isinstance(v, torch.Tensor) and v.is_floating_point() and k in actual
                 and tuple(torch.as_tensor(actual[k]).shape) == tuple(v.shape)]
        if steps:
            record("steps_off", round(max(steps), 4) if math.isfinite(max(steps)) else None)
        # the model's own sensitivity to one-step rounding: the worst of rounding.SEEDS, the first three measured first
        spread = artifact.reference_spread(own, FIRST_SEEDS, **inputs)
        seeds = len(FIRST_SEEDS)
        within = not compare_quantized(expected, actual, case.backend, spread, scales)
        if not within:
            more = artifact.reference_spread(own, SEEDS[seeds:], **inputs)
            spread = {k: max(spread.get(k, 0.0), more.get(k, 0.0)) for k in {*spread, *more}}
            seeds = len(SEEDS)
        record("rounding_spread_seeds", seeds)
        grid = {k: quantization_step(expected[k], scales.get(k)) for k in spread}
        spread_steps = [spread[k] / grid[k] for k in spread if grid[k] > 0]
        if spread_steps:
            record("rounding_spread_steps", round(max(spread_steps), 4) if math.isfinite(max(spread_steps)) else None)
        stage = "compare"
        record("stage", stage)
        try:
            if not within:  # the comparison above passed as it is; past the first seeds, again with all of them
                assert_close_quantized(expected, actual, case.backend, spread, scales)
        except AssertionError as exc:
            if meta["selection_ops"] and not meta["selection_outputs"]:  # a choice the check could not give
                raise type(exc)(f"the quantized model selects ({', '.join(meta['selection_ops'])}) over int8-grid values, "
                                f"where a tie or a one-step difference flips a choice: {exc}") from exc
            if meta["selection_outputs"]:  # compared given the artifact's choices: the arithmetic differs
                raise type(exc)(f"given the artifact's own choices ({len(chosen)} selections), {exc}") from exc
            raise
        stage = "done"
        record("stage", stage)
        return artifact
    except BaseException as exc:
        if passes_through(exc):
            if getattr(exc, "export_stage", None):
                record("stage", exc.export_stage)
            raise
        raise StageFailure(stage, exc) from exc
    finally:
        record("duration_s", round(time.perf_counter() - start, 3))
