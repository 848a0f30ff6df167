"""Skip-list records: one frozen dataclass per entry, the reason carried as data.

An entry names the models it covers (by transformers class name in ``classes``, or by
config ``model_type`` in ``model_types``: either or both) and the scope it applies to
(``backends`` and ``variants``; the default ``"all"`` expands to every known value).
``reason`` is required and keyword-only, as in onnxscript's ``.xfail(reason=...)``: it is
what pytest prints for every matching sweep item.

Construction only normalises shapes (a single string becomes a 1-tuple, ``"all"`` expands).
Semantic checks (unknown names, vague reasons, overlapping entries) live in
:mod:`skips.validate`, which knows each entry's list and index and so can name it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

BACKENDS: tuple[str, ...] = ("dynamo", "onnx", "executorch")
VARIANTS: tuple[str, ...] = ("static", "dynamic")
# The sweep's tests: test_export (one forward), test_generate (prefill + decode steps) and test_runner
# (the runtimes' own LLM runners; its entries are scoped by cache form: static for ExecuTorch's runner,
# dynamic for onnxruntime-genai).
TESTS: tuple[str, ...] = ("export", "generate", "runner", "quantized")
# Where a sweep item can stop; "done" is not a failure stage and is not allowed here.
STAGES: tuple[str, ...] = ("build", "eager", "export", "lower", "run", "compare", "shapes")
ALL = "all"


class SkipListError(ValueError):
    """A skip or disable list entry is invalid. Raised at collection time."""


def _names(value: str | Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    return tuple(value)


def _scope(value: str | Iterable[str], known: tuple[str, ...]) -> tuple[str, ...]:
    names = _names(value)
    if names == (ALL,):
        return known
    return names


def normalize_model_type(model_type: str | None) -> str | None:
    """``nllb-moe`` and ``nllb_moe`` name the same family (config key vs module name)."""
    return None if model_type is None else model_type.replace("-", "_").lower()


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Entry:
    # transformers model class names this entry covers, e.g. ("NllbMoeForConditionalGeneration",).
    classes: tuple[str, ...] = ()
    # config model types (families) this entry covers, e.g. ("nllb-moe",); every class of the family.
    model_types: tuple[str, ...] = ()
    # static / dynamic shapes variants; "all" expands to VARIANTS.
    variants: tuple[str, ...] = VARIANTS
    # the sweep tests the entry applies to: ("export",) by default, ("generate",), or "all"
    tests: tuple[str, ...] = ("export",)
    # The real cause, in words a contributor can act on. Printed by pytest.
    reason: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "classes", _names(self.classes))
        object.__setattr__(self, "model_types", _names(self.model_types))
        object.__setattr__(self, "variants", _scope(self.variants, VARIANTS))
        object.__setattr__(self, "tests", _scope(self.tests, TESTS))

    @property
    def models(self) -> tuple[str, ...]:
        """Every model name the entry lists, classes first (for messages)."""
        return self.classes + self.model_types

    def matches_model(self, class_name: str | None, model_type: str | None) -> bool:
        if class_name is not None and class_name in self.classes:
            return True
        wanted = normalize_model_type(model_type)
        return wanted is not None and wanted in {normalize_model_type(t) for t in self.model_types}

    def matches(self, class_name: str | None, model_type: str | None,
                backend: str | None = None, variant: str | None = None, test: str | None = None) -> bool:
        """True when the entry covers this model; ``None`` for backend/variant/test matches any."""
        if test is not None and test not in self.tests:
            return False
        if backend is not None and backend not in self.backends:
            return False
        if variant is not None and variant not in self.variants:
            return False
        return self.matches_model(class_name, model_type)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExportSkip(_Entry):
    """A model that cannot be exported as it is; becomes a strict xfail on matching items."""

    # Backends the entry applies to; "all" expands to BACKENDS.
    backends: tuple[str, ...] = BACKENDS
    # Stage where the item is expected to fail (one of STAGES), or None if not pinned.
    stage: str | None = None
    # Optional http(s) link to the tracking issue.
    upstream: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "backends", _scope(self.backends, BACKENDS))


@dataclasses.dataclass(frozen=True, kw_only=True)
class OnnxDisableOptimize(_Entry):
    """A model whose ONNX export runs with ``optimize=False`` because of an upstream optimizer bug."""

    # Required: the specific upstream bug (http(s) link) this entry works around.
    upstream: str
    # ONNX-only by nature; present so that a wrong scope is reported, not silently ignored.
    backends: tuple[str, ...] = ("onnx",)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "backends", _scope(self.backends, BACKENDS))
