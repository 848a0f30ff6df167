"""Dynamic-shape checks: draw new sizes within an artifact's declared bounds and compare to eager.

Dims are grouped by their traced size: the zoo gives distinct dims distinct sizes (batch 2,
sequence 7, ...), so dims traced at the same size are the same dim (batch of every input) and
are drawn together. New inputs are the traced ones resized along those dims by wrapping
indices (``arange(new) % old``), so token ids stay in the vocabulary, masks stay masks and
pixel values stay plausible. A drawn shape that eager PyTorch itself rejects is not a shape
the model accepts; Hypothesis discards it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

# Draws stay near the traced size: enough to move every dynamic dim, small enough to stay fast.
_GROWTH = 2
_SLACK = 6


class ShapeMismatch(AssertionError):
    """The artifact does not match eager at a drawn shape (message carries the one-line repro)."""


def size_groups(artifact) -> dict[int, tuple[int, int]]:
    """``{traced size: (low, high)}`` over all dynamic dims, intersecting their bounds."""
    groups: dict[int, tuple[int, int]] = {}
    for name, dims in artifact.dynamic_dims.items():
        shape = artifact.input_specs[name][0]
        for d, spec in dims.items():
            traced = shape[d]
            low = max(spec["min"] or 0, 1)  # size 1 is checked for every dim by check_size_one, bounds or not
            high_bound = spec["max"] if spec["max"] is not None else traced * _GROWTH + _SLACK
            high = min(high_bound, traced * _GROWTH + _SLACK)
            prev = groups.get(traced, (low, high))
            groups[traced] = (max(prev[0], low), min(prev[1], high))
    return {k: v for k, v in groups.items() if v[0] <= v[1] and (v[0], v[1]) != (k, k)}


def resized_shape(artifact, name: str, sizes: Mapping[int, int]) -> list[int]:
    """Input ``name``'s traced shape with every dynamic dim of traced size ``k`` set to ``sizes[k]``."""
    dims = artifact.dynamic_dims.get(name, {})
    return [sizes.get(size, size) if d in dims else size for d, size in enumerate(artifact.input_specs[name][0])]


def resize_inputs(inputs: Mapping[str, Any], artifact, sizes: Mapping[int, int]) -> dict[str, Any]:
    """The traced inputs resized to ``resized_shape`` by wrapping indices (see the module docstring)."""
    out = dict(inputs)
    for name, dims in artifact.dynamic_dims.items():
        tensor = inputs[name]
        target = resized_shape(artifact, name, sizes)
        for d in dims:
            old, new = tensor.shape[d], target[d]
            if new != old:
                index = torch.arange(new) % old
                tensor = tensor.index_select(d, index)
        out[name] = tensor
    return out


def format_sizes(sizes: Mapping[int, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(sizes.items()))


def parse_sizes(text: str) -> dict[int, int]:
    """``"2=3,7=11"`` -> {2: 3, 7: 11} (traced size = new size)."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            old, new = part.split("=")
            out[int(old)] = int(new)
        except ValueError:
            raise ValueError(f"--sizes takes TRACED=NEW pairs like '2=3,7=11', got {part!r}") from None
    return out


EAGER_REJECTS, ARTIFACT_REJECTS, COMPARED = "eager rejects", "artifact rejects", "compared"


def guard_refusal(artifact, sizes: Mapping[int, int]) -> str:
    """Why the artifact's input checks (bounds, shared dims, recorded guards) refuse the traced inputs
    resized to ``sizes``, or "" when they take them. Runs on meta tensors: shapes only."""
    from exporters import InputError

    check = getattr(artifact, "check_inputs", None)
    if check is None:
        return ""
    metas = {name: torch.empty(resized_shape(artifact, name, sizes), dtype=artifact.input_specs[name][1], device="meta")
             for name in artifact.input_names}
    try:
        check(metas)
    except InputError as exc:
        return str(exc)
    return ""


def check_at(artifact, model, inputs, sizes, backend: str) -> tuple[str, str]:
    """Compare artifact and eager at ``sizes``. Returns ``(verdict, detail)``: COMPARED, or
    EAGER_REJECTS when the model itself does not take the shape, or ARTIFACT_REJECTS when the
    artifact's recorded guards refuse it (detail: the InputError naming the condition).
    Raises ShapeMismatch when the outputs differ."""
    from exporters import InputError
    from exporters.parity import compare
    from exporters.utils import flatten_outputs

    new_inputs = resize_inputs(inputs, artifact, sizes)
    try:
        with torch.no_grad():
            expected = flatten_outputs(model(**new_inputs))
    except Exception:  # noqa: BLE001 - the model itself does not accept this shape
        return EAGER_REJECTS, ""
    if not all(torch.isfinite(t).all() for t in expected.values() if t.is_floating_point()):
        return EAGER_REJECTS, ""
    try:
        actual = artifact(**new_inputs)
    except InputError as exc:
        return ARTIFACT_REJECTS, str(exc)
    problems = compare(expected, actual, backend)
    if problems:
        raise ShapeMismatch("; ".join(problems))
    return COMPARED, ""


def check_dynamic_shapes(artifact, model, inputs, backend: str, repro: str) -> int:
    """Hypothesis draws sizes for every dynamic group; returns how many shapes were compared.

    A mismatch is shrunk by Hypothesis and re-raised with a one-line repro.
    """
    from hypothesis import HealthCheck, given, reject, settings
    from hypothesis import strategies as st

    groups = size_groups(artifact)
    if not groups:
        return 0
    checked = []
    refused: list[tuple[dict, str]] = []  # drawn shapes the artifact's recorded guards refuse

    refusals: dict[tuple, str] = {}  # guard_refusal per set of sizes: draws repeat, the scan below overlaps them

    def refusal(sizes) -> str:
        key = tuple(sorted((k, v) for k, v in sizes.items() if v != k))
        if key not in refusals:
            refusals[key] = guard_refusal(artifact, sizes)
        return refusals[key]

    def admitted(sizes) -> bool:
        """Whether the artifact's recorded guards take these sizes (checked on meta tensors, no compute).
        A guard such as ``s3 == 8 * (s3 // 8)`` (a patch grid) admits one size in eight: drawing past
        it finds the shapes the artifact was exported for; the refusals are kept for the report."""
        detail = refusal(sizes)
        if detail:
            refused.append((sizes, detail))
        return not detail

    # the sizes each group takes alone, the others at their traced sizes: a guard can pin a group to a
    # few values (1 + (frames - 1) // 2 == 64: 127 or 128), which uniform draws over [2, 1024] never hit
    moves = {k: [v for v in range(lo, hi + 1) if v != k and not refusal({k: v})] for k, (lo, hi) in groups.items()}

    def sizes_strategy():
        # each group keeps its traced size or moves: guards often tie a group to the others' traced
        # sizes (Idefics2: (h // 8) * (w // 8) == 16 image tokens), and moving one group at a time
        # reaches the shapes such an artifact takes, where moving all at once almost never does
        parts = {k: st.one_of(st.just(k), st.sampled_from(moves[k]) if moves[k] else st.integers(lo, hi))
                 for k, (lo, hi) in groups.items()}
        return st.fixed_dictionaries(parts).filter(lambda s: any(s[k] != k for k in s)).filter(admitted)

    from sweeps.plugin import hypothesis_profile

    @settings(parent=hypothesis_profile(), deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(sizes=sizes_strategy())
    def draw(sizes):
        try:
            accepted, detail = check_at(artifact, model, inputs, sizes, backend)
        except Exception as exc:  # noqa: BLE001 - re-raised with the repro
            raise ShapeMismatch(
                f"at sizes {format_sizes(sizes)} (traced=new): {type(exc).__name__}: {exc}\n"
                f"repro: {repro} --sizes {format_sizes(sizes)}"
            ) from exc
        if accepted == ARTIFACT_REJECTS:
            refused.append((sizes, detail))
        if accepted != COMPARED:
            reject()
        checked.append(sizes)

    try:
        draw()
    except Exception as exc:
        from hypothesis.errors import Unsatisfiable

        if not isinstance(exc, Unsatisfiable):
            raise _unwrap_replay(exc) from exc
    if not checked and refused:
        _raise_if_eager_takes_a_refused_shape(model, inputs, artifact, refused, repro)
    return len(checked)


def check_size_one(artifact, model, inputs, backend: str, repro: str) -> str:
    """Every dynamic dim at size 1 (a batch of one, a one-token step): all groups at 1 together, else
    each group alone. Returns a summary for the report: "all" when the artifact matched eager with
    every group at 1; otherwise "TRACED:VERDICT" per group, where a refusal names the artifact's
    reason; "" when the artifact has no dynamic dim. Raises ShapeMismatch when the artifact runs at
    size 1 and differs from eager."""
    groups = sorted({artifact.input_specs[name][0][d] for name, dims in artifact.dynamic_dims.items() for d in dims} - {1})
    if not groups:
        return ""

    def at(sizes):
        try:
            return check_at(artifact, model, inputs, sizes, backend)
        except Exception as exc:  # noqa: BLE001 - re-raised with the repro
            raise ShapeMismatch(
                f"at size 1, sizes {format_sizes(sizes)} (traced=new): {type(exc).__name__}: {exc}\n"
                f"repro: {repro} --sizes {format_sizes(sizes)}"
            ) from exc

    if at({k: 1 for k in groups})[0] == COMPARED:
        return "all"
    verdicts = []
    for k in groups:
        verdict, detail = at({k: 1})
        verdicts.append(f"{k}:{verdict}" + (f" ({detail})" if detail else ""))
    return "; ".join(verdicts)


def _raise_if_eager_takes_a_refused_shape(model, inputs, artifact, refused, repro, tries: int = 5) -> None:
    """No drawn shape was compared and the guards refused some: a failure only if eager PyTorch runs
    at one of them (the export is narrower than the model); when eager refuses them all, the model
    itself takes no other shape and there is nothing to compare."""
    from exporters.utils import flatten_outputs

    distinct = list({format_sizes(s): (s, why) for s, why in refused}.values())
    for sizes, why in distinct[:tries]:
        try:
            with torch.no_grad():
                out = flatten_outputs(model(**resize_inputs(inputs, artifact, sizes)))
        except Exception:  # noqa: BLE001 - eager refuses this shape too
            continue
        if not all(torch.isfinite(t).all() for t in out.values() if t.is_floating_point()):
            continue
        raise ShapeMismatch(
            f"the artifact's guards refuse every drawn shape ({len(refused)} drawn), and eager runs at sizes "
            f"{format_sizes(sizes)}, which they refuse: {why}\nrepro: {repro} --sizes {format_sizes(sizes)}"
        )


def _leaves(exc: BaseException):
    """The exceptions an error group holds, each with its chain of causes (Hypothesis wraps a
    BaseException raised in a draw in a ``_WrappedBaseException`` caused by it)."""
    subs = getattr(exc, "exceptions", None)
    for sub in subs or ():
        yield from _leaves(sub)
    if not subs:
        while exc is not None:
            yield exc
            exc = exc.__cause__


def _unwrap_replay(exc: Exception) -> BaseException:
    """What a Hypothesis error group stands for. A pytest outcome raised inside a draw (pytest-timeout's
    ``Failed: Timeout`` lands mid-forward) is re-raised as itself: Hypothesis reads it as a failing
    example, replays it, sees a different result and reports ``FlakyFailure``, which hid four timeouts.
    A mismatch that does not recur on replay is reported as that mismatch, marked as such."""
    from hypothesis.errors import FlakyFailure

    from sweeps.runner import is_pytest_outcome

    leaves = list(_leaves(exc))
    for leaf in leaves:
        if is_pytest_outcome(leaf):
            return leaf
    if isinstance(exc, FlakyFailure):
        for leaf in leaves:
            if isinstance(leaf, ShapeMismatch):
                return ShapeMismatch(f"{leaf} (did not recur when Hypothesis replayed the same sizes: "
                                     "the model or the artifact is not deterministic at them)")
    return exc
