"""One sweep item, stage by stage: build -> eager -> export -> lower -> run -> compare -> shapes.

Shared by the pytest sweep (``sweeps/test_export.py``) and the triage command (``sweeps.repro``).
A tiny model and its eager reference are built once per process and reused by every backend and
variant of that class (items are grouped by class across xdist workers).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

BACKENDS = ("dynamo", "onnx", "executorch")
VARIANTS = ("static", "dynamic")
SEED = 0


# test_runner's runtimes: the runtime's own LLM runner, the backend whose artifact it loads, and the
# variant name its items carry (ExecuTorch's runner loads a static cache, onnxruntime-genai a growing one)
RUNTIMES = {"executorch-llm": ("executorch", "llm"), "ort-genai": ("onnx", "genai")}
RUNNER_CACHE = {"llm": "static", "genai": "dynamic"}  # the cache form of each runner variant (skip scopes)
# test_quantized: its recipes (an item's variant) and backends (dynamo runs the quantized reference
# itself: a unit test there, tests/test_quantization.py)
RECIPES = ("int8",)
QUANTIZED_BACKENDS = ("onnx", "executorch")


@dataclasses.dataclass(frozen=True)
class Case:
    backend: str
    variant: str
    entry: Any  # sweeps.zoo.CatalogEntry
    test: str = "export"  # "export", "generate" or "runner"

    @property
    def id(self) -> str:
        if self.test == "runner":
            runtime = next(k for k, v in RUNTIMES.items() if v == (self.backend, self.variant))
            return f"{runtime}-{self.entry.class_name}"
        return f"{self.backend}-{self.variant}-{self.entry.class_name}"

    @property
    def repro(self) -> str:
        prefix = "" if self.test == "export" else f"{self.test}:"
        return f"python -m sweeps.repro {prefix}{self.id}"


@dataclasses.dataclass
class Reference:
    tiny: Any  # sweeps.zoo.TinyModel
    expected: dict  # flattened eager outputs at the traced inputs


def property_recorder(properties: list) -> Callable[[str, Any], None]:
    """Like pytest's record_property on ``properties`` (a node's user_properties), but a key recorded again
    (the stage, as it advances) is updated in place, so the report carries one value per key, the last one."""

    def record(key: str, value: Any) -> None:
        for i, (k, _) in enumerate(properties):
            if k == key:
                properties[i] = (key, value)
                return
        properties.append((key, value))

    return record


def report_failure(failure: StageFailure, record: Callable[[str, Any], None], case: Case) -> None:
    """Record a failed item's stage and error signature, then xfail it (a class whose build needs a package
    that is not installed) or raise the AssertionError pytest shows, with the repro."""
    import pytest

    from sweeps.signature import error_signature, root_cause
    from sweeps.zoo import BlockedByPackage

    cause = root_cause(failure.__cause__)
    record("stage", failure.stage)
    record("error", error_signature(cause))
    if isinstance(cause, BlockedByPackage):
        pytest.xfail(f"build: {cause}")
    raise AssertionError(f"[{failure.stage}] {type(cause).__name__}: {cause}\nrepro: {case.repro}") from cause


class StageFailure(Exception):
    """Raised by ``run_case``: ``stage`` is where the item stopped, ``__cause__`` the original error."""

    def __init__(self, stage: str, cause: BaseException):
        self.stage = stage
        super().__init__(f"{stage}: {type(cause).__name__}: {cause}")


_CACHE: dict[tuple[str, int, float | None], Reference | BaseException] = {}
_CACHE_SIZE = 2  # items arrive grouped by class: the current class and the one before suffice


def reference(class_name: str, seed: int = SEED, init_range: float | None = None) -> Reference:
    """The tiny model of ``class_name`` and its eager outputs, built once per process.

    A build failure is cached too, so the six items of a class that cannot be built fail fast."""
    key = (class_name, seed, init_range)
    if key not in _CACHE:
        try:
            _CACHE[key] = _build_reference(class_name, seed, init_range)
        except Exception as exc:  # noqa: BLE001 - re-raised below, for this and later items
            _CACHE[key] = exc
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
    value = _CACHE[key]
    if isinstance(value, BaseException):
        raise value
    return value


def _build_reference(class_name: str, seed: int, init_range: float | None = None) -> Reference:
    import torch

    from exporters.utils import flatten_outputs
    from sweeps.zoo import build_tiny, resolve_models, run_eager

    (entry,) = [e for e in resolve_models([class_name]) if e.class_name == class_name]
    tiny = build_tiny(entry, seed=seed, check=False, init_range=init_range)  # the eager forward is the next stage
    try:
        # the zoo's own check: the same input layout the zoo validated (alternatives included)
        expected = flatten_outputs(run_eager(tiny, seed))
        bad = [k for k, t in expected.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
        if bad:
            raise ValueError(f"eager outputs {bad} are not finite: the tiny model is useless for parity")
    except Exception as exc:  # noqa: BLE001 - tagged with its stage
        raise StageFailure("eager", exc) from exc
    return Reference(tiny, expected)


def export_config(case: Case, exporter) -> tuple[Any, dict[str, Any]]:
    """The exporter config for this item and the properties it implies (ONNX optimizer off...)."""
    from skips import find_onnx_disable_optimize

    kwargs: dict[str, Any] = {"dynamic": case.variant == "dynamic"}
    props: dict[str, Any] = {}
    if case.backend == "onnx":
        entry = find_onnx_disable_optimize(case.entry.class_name, case.entry.model_type, case.variant)
        kwargs["optimize"] = entry is None
        props["onnx_optimize"] = entry is None
        if entry is not None:
            props["onnx_optimize_upstream"] = entry.upstream
    return exporter.config_class(**kwargs), props


def run_case(case: Case, record: Callable[[str, Any], None], keep_dir: str | None = None,
             sizes: dict[int, int] | None = None, registry: Any = None, *,
             reference_fn: Callable[[str], Reference] | None = None,
             config_overrides: dict[str, Any] | None = None, shapes: bool = True) -> Any:
    """Run one item; raise StageFailure naming the stage. ``record(key, value)`` gets the properties.

    ``registry`` replaces the default workaround registry (``sweeps.recheck`` switches one off);
    ``reference_fn(class_name)`` replaces the zoo build (tests pass a hand-built model);
    ``config_overrides`` set exporter config fields (``{"optimize": True}``); ``shapes=False``
    skips the dynamic-shape checks; ``sizes`` checks one set of sizes instead of drawing them."""
    import torch

    from exporters import ExportStageError, get_exporter
    from exporters.parity import assert_close
    from exporters.trace_reuse import active_store
    from sweeps.shapes import check_at, check_dynamic_shapes, check_size_one, format_sizes

    stage = "build"
    record("stage", stage)
    start = time.perf_counter()
    generated_before = _generated_code_keys()
    try:
        ref = (reference_fn or reference)(case.entry.class_name)
        model, inputs = ref.tiny.model, ref.tiny.inputs
        stage = "export"
        record("stage", stage)
        exporter = get_exporter(case.backend, registry=registry)
        config, props = export_config(case, exporter)
        for key, value in (config_overrides or {}).items():
            setattr(config, key, value)
            if key == "optimize":
                props["onnx_optimize"] = value
        for k, v in props.items():
            record(k, v)
        store = active_store()
        hits = store.hits if store is not None else 0
        try:
            artifact = exporter.export(model, inputs, config)
        except ExportStageError as exc:
            stage = exc.stage
            record("workarounds_fired", exc.workarounds_fired)
            raise
        record("workarounds_fired", artifact.workarounds_fired)
        if store is not None:  # traces taken from the one shared by the class's items (exporters/trace_reuse.py)
            record("trace_reused", store.hits - hits)
        record("baked_inputs", sorted(k for k, v in artifact.constants.items() if isinstance(v, torch.Tensor)))
        if "planned_bytes" in artifact.extra_metadata:  # ExecuTorch: the memory its plan allocates, and for which bounds
            record("planned_mb", round(artifact.extra_metadata["planned_bytes"] / 2**20, 1))
            record("max_dim", artifact.extra_metadata["max_dim"])
        if keep_dir:
            artifact.save(keep_dir)
        stage = "run"
        record("stage", stage)
        actual = artifact(**inputs)
        stage = "compare"
        record("stage", stage)
        assert_close(ref.expected, actual, case.backend)
        if case.variant == "dynamic" and shapes:
            from exporters.model_state import _snapshot_state, reset_model_state

            state = _snapshot_state(model)  # eager forwards at other shapes may reconfigure the model (Swin)
            stage = "shapes"
            record("stage", stage)
            record("dynamic_dims", sum(len(d) for d in artifact.dynamic_dims.values()))
            record("dynamic_by_input", {n: sorted(d) for n, d in artifact.dynamic_dims.items()})
            try:
                if sizes is not None:
                    verdict, detail = check_at(artifact, model, inputs, sizes, case.backend)
                    if verdict != "compared":
                        raise ValueError(f"sizes {format_sizes(sizes)}: {verdict} {detail}".strip())
                    record("shapes_checked", 1)
                else:
                    record("size_one", check_size_one(artifact, model, inputs, case.backend, case.repro))
                    record("shapes_checked", check_dynamic_shapes(artifact, model, inputs, case.backend, case.repro))
            finally:
                reset_model_state(model, state)
        stage = "done"
        record("stage", stage)
        return artifact
    except BaseException as exc:
        if passes_through(exc):
            if getattr(exc, "export_stage", None):  # a timeout inside the exporter: which of its stages
                record("stage", exc.export_stage)
            raise
        raise StageFailure(stage, exc) from exc
    finally:
        record("duration_s", round(time.perf_counter() - start, 3))
        _forget_generated_code(generated_before)
        rss = _rss_mb()
        if rss is not None:
            record("rss_mb", rss)  # benchmarks/throughput.py reads the growth per worker from these


def _fx_source_cache() -> dict | None:
    """``torch.fx.graph_module._loader.eval_cache``: the source of every recompiled GraphModule."""
    from torch.fx import graph_module

    cache = getattr(getattr(graph_module, "_loader", None), "eval_cache", None)
    return cache if isinstance(cache, dict) else None


def _generated_code_keys() -> set[str]:
    return set(_fx_source_cache() or ())


def _forget_generated_code(before: set[str]) -> None:
    """Drop the Python source torch.fx generated during one item. Every GraphModule recompile stores
    its source in ``torch.fx.graph_module._loader.eval_cache`` and a lazy ``linecache`` entry, and
    nothing ever removes them: measured at ~0.17 MB per BERT export, a steady per-item growth over a
    sweep. After the item its graphs are gone; only their traceback source lines would need it."""
    import linecache

    cache = _fx_source_cache()
    for key in [k for k in cache or () if k not in before]:
        del cache[key]
        linecache.cache.pop(key, None)


def _rss_mb() -> float | None:
    """Resident memory of this process now (Linux), for the memory benchmark."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


def passes_through(exc: BaseException) -> bool:
    """An exception an item re-raises as it is instead of wrapping it in a StageFailure: an interrupt,
    a StageFailure already, or a pytest outcome (skip, xfail, a timeout)."""
    return isinstance(exc, (KeyboardInterrupt, SystemExit, StageFailure)) or is_pytest_outcome(exc)


def is_pytest_outcome(exc: BaseException) -> bool:
    """pytest's skip/xfail/fail outcomes, and pytest-timeout's ``Failed: Timeout``. By isinstance:
    ``Failed`` sets its ``__module__`` to "builtins", so a check on the module name misses it and a
    timeout was recorded as a failure of whatever stage it interrupted."""
    from _pytest.outcomes import OutcomeException

    return isinstance(exc, OutcomeException)


def keep_dir_for(case: Case, root: str) -> str:
    return os.path.join(root, case.id)
