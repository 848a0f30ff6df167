"""What the three exporters share: their config, the artifact they return, and its metadata."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .utils import DEFAULT_REGISTRY, Registry

_VERSIONED = ("torch", "transformers", "onnx", "onnxscript", "onnxruntime", "executorch")


def package_versions() -> dict[str, str]:
    out = {}
    for name in _VERSIONED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


class ExportStageError(RuntimeError):
    """An export failed; ``stage`` says where (export, lower, run) and ``__cause__`` holds the original."""

    def __init__(self, stage: str, backend: str, cause: BaseException):
        self.stage = stage
        self.export_stage = stage  # the name docs/CONTRACTS.md promises
        self.backend = backend
        # the workarounds that fired before the failure: a report tells a dead workaround from one
        # whose classes all fail at a later point
        self.workarounds_fired: list[str] = []
        super().__init__(f"[{backend}/{stage}] {type(cause).__name__}: {cause}")


class InputError(ValueError):
    """An artifact was called with inputs it was not exported for."""


@dataclasses.dataclass
class ExportConfig:
    dynamic: bool = False  # every tensor dim Dim.AUTO (torch decides which stay dynamic)
    dynamic_shapes: Any = None  # explicit torch.export dynamic_shapes; overrides `dynamic`
    strict: bool = False  # torch.export strict mode (TorchDynamo tracing)
    max_dim: int = 1024  # upper bound given to every dynamic dim (ExecuTorch must plan memory for it)
    # dynamic dims take size 1 (a decode step's sequence, a batch of one) unless the model's own code
    # branches on it: torch's backed_size_oblivious during export, every Dim.AUTO with min=1.
    # False: torch's default 0/1 specialization, where every dynamic dim traced at >= 2 refuses 1.
    accept_size_one: bool = True
    # tensor inputs whose values are baked into the artifact (layout metadata such as image_grid_thw,
    # image_sizes): None = every integer input named like exporters.specialize.SPECIALIZED_INPUTS,
    # () = none. The artifact refuses other values, naming the input.
    specialize: tuple[str, ...] | None = None
    # a quantization recipe (exporters.quantization.int8(calibration=[...])): the model is prepared,
    # calibrated and converted with PT2E first, and the artifact keeps the converted module as its
    # ``reference``; None exports the model as it is
    quantization: Any = None
    # (input, dim) pairs of a dynamic export whose dim may be 0 (min=0 instead of 1): a cache leaf's past axis,
    # where the decode graph also runs the prompt from an empty cache (exporters/generation/empty_past.py)
    may_be_empty: tuple[tuple[str, int], ...] = ()


def _plain_json(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain_json(v) for v in value)
    return isinstance(value, dict) and all(isinstance(k, str) and _plain_json(v) for k, v in value.items())


def _constant_json(value: Any) -> Any:
    """A baked input as JSON: a tensor as its values and dtype, a plain value as itself, else its repr
    (kept for people; ``exporters.loading`` refuses to rebuild an artifact with such a constant)."""
    if isinstance(value, torch.Tensor):
        return {"tensor": value.tolist(), "dtype": str(value.dtype).removeprefix("torch.")}
    if _plain_json(value):
        return {"value": value}
    return {"repr": repr(value)}


class Artifact:
    """The result of an export: callable with the same keyword tensors as the model's forward."""

    backend = ""
    file_name = ""
    reference = None  # a quantized export: PyTorch's quantized model, called as the artifact (Exporter._with_reference)
    reference_spread = None  # and how far one-step rounding moves its outputs (exporters/quantization/rounding.py)
    reference_scales = None  # and the grid of each output that leaves a quantize (exporters/quantization/grid.py)
    reference_given = None  # and the reference run with given selection indices (exporters/quantization/selections.py)

    def __init__(self, *, input_names, output_names, input_specs, constants, fired, config, extra_metadata=None,
                 guards=None):
        self.input_names: list[str] = list(input_names)
        self.output_names: list[str] = list(output_names)
        # input name -> (traced shape, dtype, {dim: {"symbol", "min", "max"}})
        self.input_specs: dict[str, tuple[tuple[int, ...], torch.dtype, dict[int, dict]]] = input_specs
        self.constants: dict[str, Any] = constants
        self.workarounds_fired: list[str] = list(fired)
        self.config = config
        self.extra_metadata = dict(extra_metadata or {})
        self.guards: Callable[..., Any] | None = guards  # the traced program's guard function, if any

    @property
    def dynamic_dims(self) -> dict[str, dict[int, dict]]:
        return {name: dims for name, (_, _, dims) in self.input_specs.items() if dims}

    @property
    def metadata(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "input_names": self.input_names,
            "output_names": self.output_names,
            "inputs": {
                name: {"shape": list(shape), "dtype": str(dtype).replace("torch.", "")}
                for name, (shape, dtype, _) in self.input_specs.items()
            },
            "dynamic_dims": {n: {str(d): v for d, v in dims.items()} for n, dims in self.dynamic_dims.items()},
            "constant_inputs": {k: repr(v.tolist() if isinstance(v, torch.Tensor) else v)
                                for k, v in self.constants.items()},
            # the same, in a form exporters.loading reads back (plain JSON values; nothing evaluated)
            "constants": {k: _constant_json(v) for k, v in self.constants.items()},
            "workarounds_fired": self.workarounds_fired,
            "config": {k: repr(v) for k, v in dataclasses.asdict(self.config).items()},
            "config_values": {k: v for k, v in dataclasses.asdict(self.config).items() if _plain_json(v)},
            "versions": package_versions(),
            **self.extra_metadata,
        }

    # calling
    def check_inputs(self, inputs: Mapping[str, Any]) -> list[torch.Tensor]:
        """Validate names, dtypes and shapes against what was exported; return tensors in order."""
        unexpected = [k for k in inputs if k not in self.input_specs and k not in self.constants]
        missing = [k for k in self.input_names if k not in inputs]
        if unexpected or missing:
            raise InputError(
                f"{self.backend} artifact takes inputs {self.input_names}"
                + (f"; missing {missing}" if missing else "")
                + (f"; unexpected {unexpected}" if unexpected else "")
            )
        for name, value in inputs.items():
            if name not in self.constants:
                continue
            baked = self.constants[name]
            if isinstance(baked, torch.Tensor):
                if not (isinstance(value, torch.Tensor) and value.shape == baked.shape and torch.equal(value, baked)):
                    got = value.tolist() if isinstance(value, torch.Tensor) else value
                    raise InputError(
                        f"input {name!r} was specialized at export time (its values set shapes inside the model): "
                        f"the artifact was exported for {name}={baked.tolist()}, got {got}; re-export for these "
                        "values, or export with ExportConfig(specialize=()) to keep it an input"
                    )
            elif not isinstance(value, torch.Tensor) and value != baked:
                raise InputError(
                    f"{name}={value!r} was baked into the artifact as {baked!r} at export time; "
                    "re-export to change it"
                )
        ordered = []
        for name in self.input_names:
            value = inputs[name]
            shape, dtype, dims = self.input_specs[name]
            if not isinstance(value, torch.Tensor):
                raise InputError(f"input {name!r} must be a tensor, got {type(value).__name__}")
            if value.dtype != dtype:
                raise InputError(f"input {name!r} has dtype {value.dtype}, the artifact was exported with {dtype}")
            if value.dim() != len(shape):
                raise InputError(f"input {name!r} has rank {value.dim()}, the artifact was exported with rank {len(shape)}")
            for d, size in enumerate(value.shape):
                spec = dims.get(d)
                if spec is None:
                    if size != shape[d]:
                        raise InputError(
                            f"input {name!r} dim {d} is static in this artifact (exported as {shape[d]}), got {size}"
                            + ("; export with dynamic=True to vary it" if not self.dynamic_dims else "")
                        )
                elif size < spec["min"] or (spec["max"] is not None and size > spec["max"]):
                    raise InputError(
                        f"input {name!r} dim {d} ({spec['symbol']}) is {size}, outside the exported bounds "
                        f"[{spec['min']}, {spec['max']}]"
                    )
            ordered.append(value)
        self._check_shared_symbols(inputs)
        self._check_guards(ordered)
        return ordered

    def _check_guards(self, ordered: list[torch.Tensor]) -> None:
        """The conditions torch.export recorded on input shapes (``s0 // 16 != 1``, ``s1 == s2``...),
        checked for every backend: an ONNX or ExecuTorch artifact would otherwise compute garbage."""
        if self.guards is None:
            return
        try:
            self.guards(*ordered)
        except (AssertionError, ZeroDivisionError) as exc:
            # a condition that divides by a size expression that is 0 here (``s1 % (s0 // 16)`` at
            # s0 < 16: Gemma 4's vision patches) cannot hold either: a refusal, not a crash
            condition = (f"torch.export recorded the condition {str(exc).replace('Guard failed: ', '')}"
                         if isinstance(exc, AssertionError)
                         else "a condition torch.export recorded divides by zero at these sizes")
            shapes = ", ".join(f"{n}{tuple(t.shape)}" for n, t in zip(self.input_names, ordered))
            raise InputError(
                f"these input shapes are outside what the {self.backend} artifact was exported for: "
                f"{condition} (inputs: {shapes})"
            ) from None

    def _check_shared_symbols(self, inputs: Mapping[str, Any]) -> None:
        seen: dict[str, tuple[str, int, int]] = {}
        for name in self.input_names:
            for d, spec in self.input_specs[name][2].items():
                size = inputs[name].shape[d]
                prev = seen.setdefault(spec["symbol"], (name, d, size))
                if prev[2] != size:
                    raise InputError(
                        f"input {name!r} dim {d} and input {prev[0]!r} dim {prev[1]} share the dynamic dim "
                        f"{spec['symbol']} in this artifact, but got {size} and {prev[2]}"
                    )

    def __call__(self, **inputs: Any) -> dict[str, torch.Tensor]:
        ordered = self.check_inputs(inputs)
        outputs = self._run(ordered)
        if len(outputs) != len(self.output_names):
            raise RuntimeError(f"{self.backend} runtime returned {len(outputs)} outputs, expected {len(self.output_names)}")
        return dict(zip(self.output_names, outputs))

    def _run(self, ordered: list[torch.Tensor]) -> list[torch.Tensor]:
        raise NotImplementedError

    # saving
    def save(self, directory: str | os.PathLike) -> str:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, self.file_name)
        self._save_model(path)
        with open(os.path.join(directory, "metadata.json"), "w") as f:
            json.dump(self.metadata, f, indent=2, default=str)
        return path

    def _save_model(self, path: str) -> None:
        raise NotImplementedError


class Exporter:
    backend = ""
    config_class: type[ExportConfig] = ExportConfig

    def _quantize(self, model: torch.nn.Module, inputs: Mapping[str, Any], config: ExportConfig,
                  trace_program: Callable | None = None, fired: Any = None, patches: Any = ()):
        """Stage 0: the model as the backend exports it, and the quantization (None without a recipe).
        PT2E prepares the program ``trace_program`` makes: the backend's own trace, its torch-level
        workarounds installed, under the export's shapes (``exporters.tracing.quantization_trace``);
        ``patches``: the stage-0 workarounds (exporters/workarounds/quantization/), installed around it."""
        if getattr(config, "quantization", None) is None:
            return model, None
        from exporters.quantization import quantize

        quantized = run_stage("quantize", self.backend,
                              lambda: quantize(model, inputs, config.quantization, self.backend, trace_program,
                                                       patches, fired), fired)
        return quantized.module, quantized

    @staticmethod
    def _with_reference(artifact: Artifact, quantized) -> Artifact:
        """Keep the quantized reference: ``artifact.reference(**inputs)`` runs the converted module in
        PyTorch and returns its outputs named as the artifact's."""
        if quantized is not None:
            module = quantized.module

            def reference(**inputs: Any) -> dict[str, torch.Tensor]:
                from exporters.pytrees import flatten_outputs

                with torch.no_grad():
                    return flatten_outputs(module(**inputs))

            def reference_spread(outputs: dict[str, torch.Tensor] | None = None, seeds: tuple[int, ...] | None = None,
                                 /, **inputs: Any) -> dict[str, float]:
                """``outputs``: the reference's own at ``inputs``, where the caller has them (one run fewer);
                ``seeds``: the perturbation seeds (default: rounding.SEEDS)."""
                from exporters.quantization.rounding import SEEDS, rounding_spread

                return rounding_spread(module, inputs, seeds=SEEDS if seeds is None else seeds, reference=outputs)

            def reference_given(indices: Any, **inputs: Any) -> dict[str, torch.Tensor]:
                """The reference with each exposed selection returning the given indices (the artifact's,
                ``selection.<i>.indices``, in order): exporters/quantization/selections.py."""
                from exporters.pytrees import flatten_outputs

                with torch.no_grad():
                    return flatten_outputs(module.given(indices, **inputs))

            def reference_scales(**inputs: Any) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
                """The reference's outputs, and the grid of each that leaves a quantize (one run)."""
                from exporters.quantization.grid import reference_and_scales

                return reference_and_scales(module, inputs)

            artifact.reference = reference
            artifact.reference_spread = reference_spread
            artifact.reference_scales = reference_scales
            artifact.reference_given = reference_given
            artifact.extra_metadata["quantization"] = quantized.metadata
        return artifact

    def __init__(self, registry: Registry | None = None):
        self.registry = registry if registry is not None else DEFAULT_REGISTRY

    def export(self, model: torch.nn.Module, inputs: Mapping[str, Any], config: ExportConfig | None = None) -> Artifact:
        raise NotImplementedError


def run_stage(stage: str, backend: str, fn: Callable[[], Any], fired: Any = None) -> Any:
    """Run ``fn``; an exception leaves tagged with the stage so reports can say where it failed,
    and with the names in ``fired`` (a ``FiredLog``) that had fired by then."""
    try:
        return fn()
    except ExportStageError as exc:
        _with_fired(exc, fired)  # the same error, with the names that had fired
        raise
    except Exception as exc:  # noqa: BLE001 - re-raised with the stage attached
        raise _with_fired(ExportStageError(stage, backend, exc), fired) from exc
    except BaseException as exc:  # a pytest timeout or interrupt passes through as itself, marked
        if not hasattr(exc, "export_stage"):  # with the innermost stage it stopped
            exc.export_stage = stage
        raise


def _with_fired(error: ExportStageError, fired: Any) -> ExportStageError:
    if fired is not None:
        error.workarounds_fired = fired.names()
    return error
