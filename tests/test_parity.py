"""exporters/parity.py: per-backend tolerances, every element checked, precise messages."""

from __future__ import annotations

import re

import pytest
import torch

from exporters.parity import TOLERANCES, ParityError, assert_close, compare
from exporters.utils import BACKENDS


def test_every_backend_has_a_tolerance_within_bounds():
    assert set(TOLERANCES) == set(BACKENDS)
    atol, rtol = TOLERANCES["dynamo"]
    assert 0 < atol <= 1e-5 and 0 < rtol <= 1e-5
    for backend in ("onnx", "executorch"):
        atol, rtol = TOLERANCES[backend]
        assert 0 < atol <= 1e-4 and 0 < rtol <= 1e-4


@pytest.mark.parametrize("backend", BACKENDS)
def test_identical_outputs_pass(backend):
    g = torch.Generator().manual_seed(0)
    out = {"logits": torch.randn(2, 3, 5, generator=g), "ids": torch.arange(6).view(2, 3), "mask": torch.ones(3, dtype=torch.bool)}
    assert compare(out, {k: v.clone() for k, v in out.items()}, backend) == []
    assert_close(out, {k: v.clone() for k, v in out.items()}, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_error_just_inside_and_just_outside_tolerance(backend):
    atol, rtol = TOLERANCES[backend]
    expected = torch.zeros(4, dtype=torch.float64)
    inside = expected.clone()
    inside[2] = atol * 0.9
    outside = expected.clone()
    outside[2] = atol * 1.1
    assert compare({"x": expected}, {"x": inside}, backend) == []
    assert len(compare({"x": expected}, {"x": outside}, backend)) == 1
    # relative part: |e| = 1000 allows rtol * 1000 more
    big = torch.full((3,), 1000.0, dtype=torch.float64)
    assert compare({"x": big}, {"x": big + 0.9 * (atol + rtol * 1000)}, backend) == []
    assert compare({"x": big}, {"x": big + 1.1 * (atol + rtol * 1000)}, backend) != []


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_bad_element_in_a_million_fails_and_is_located(backend):
    g = torch.Generator().manual_seed(1)
    expected = torch.randn(100, 100, 100, generator=g)
    actual = expected.clone()
    actual[37, 5, 91] += 0.5
    with pytest.raises(ParityError) as info:
        assert_close({"last_hidden_state": expected}, {"last_hidden_state": actual}, backend)
    msg = str(info.value)
    assert "last_hidden_state" in msg
    assert "[37, 5, 91]" in msg
    assert "1/1000000" in msg
    err = re.search(r"abs err ([0-9.e+-]+)", msg)
    assert err is not None and float(err.group(1)) == pytest.approx(0.5, rel=1e-3)
    assert backend in msg


def test_worst_index_is_the_largest_violation():
    expected = torch.zeros(3, 4)
    actual = expected.clone()
    actual[0, 1] = 0.01
    actual[2, 3] = -0.3
    actual[1, 0] = 0.2
    (problem,) = compare({"out": expected}, {"out": actual}, "onnx")
    assert problem.startswith("out:")
    assert "3/12" in problem and "[2, 3]" in problem


def test_every_output_reported_by_name():
    expected = {"logits": torch.zeros(2), "past_key_values.0.key": torch.zeros(2), "ok": torch.zeros(2)}
    actual = {"logits": torch.ones(2), "past_key_values.0.key": torch.ones(2), "ok": torch.zeros(2)}
    problems = compare(expected, actual, "dynamo")
    assert len(problems) == 2
    assert any(p.startswith("logits:") for p in problems)
    assert any(p.startswith("past_key_values.0.key:") for p in problems)


def test_missing_and_extra_outputs():
    expected = {"logits": torch.zeros(2), "hidden": torch.zeros(2)}
    actual = {"logits": torch.zeros(2), "surprise": torch.zeros(2)}
    with pytest.raises(ParityError) as info:
        assert_close(expected, actual, "onnx")
    msg = str(info.value)
    assert "missing" in msg and "'hidden'" in msg
    assert "'surprise'" in msg
    assert len(compare(expected, actual, "onnx")) == 2


def test_shape_mismatch_named():
    (problem,) = compare({"logits": torch.zeros(2, 3)}, {"logits": torch.zeros(3, 2)}, "executorch")
    assert "logits" in problem and "(3, 2)" in problem and "(2, 3)" in problem


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_integer_and_bool_outputs_are_exact(dtype):
    expected = torch.tensor([0, 1, 1, 0]).to(dtype)
    actual = expected.clone()
    actual[1] = 0
    (problem,) = compare({"ids": expected}, {"ids": actual}, "onnx")
    assert problem.startswith("ids:") and "1/4" in problem
    if dtype != torch.bool:  # an off-by-one is far below any float tolerance scale but must fail
        big = torch.tensor([10**6], dtype=dtype)
        assert compare({"ids": big}, {"ids": big + 1}, "onnx") != []


def test_integer_output_not_truncated_before_comparison():
    expected = torch.tensor([1, 2], dtype=torch.int64)
    actual = torch.tensor([1.7, 2.0])
    assert compare({"ids": expected}, {"ids": actual}, "onnx") != []


def test_nan_handling():
    e = torch.tensor([1.0, float("nan"), 3.0])
    assert compare({"x": e}, {"x": e.clone()}, "dynamo") == []  # NaN where eager has NaN: fine
    a = torch.tensor([1.0, 2.0, 3.0])
    (problem,) = compare({"x": e}, {"x": a}, "dynamo")  # eager NaN, artifact a number
    assert "[1]" in problem
    (problem,) = compare({"x": a}, {"x": e}, "dynamo")  # artifact NaN where eager is finite
    assert "[1]" in problem and "1/3" in problem


def test_equal_infinities_match():
    e = torch.tensor([float("-inf"), 0.0, float("inf")])
    assert compare({"scores": e}, {"scores": e.clone()}, "onnx") == []


def test_opposite_infinities_differ():
    e = torch.tensor([float("inf")])
    assert compare({"x": e}, {"x": -e}, "onnx") != []


def test_scalar_outputs():
    assert compare({"loss": torch.tensor(1.0)}, {"loss": torch.tensor(1.0)}, "dynamo") == []
    (problem,) = compare({"loss": torch.tensor(1.0)}, {"loss": torch.tensor(1.5)}, "dynamo")
    assert problem.startswith("loss:")


def test_complex_outputs_compared_per_component():
    e = torch.tensor([1 + 1j, 2 - 1j], dtype=torch.complex64)
    a = e.clone()
    assert compare({"c": e}, {"c": a}, "onnx") == []
    a[1] = 2 - 0.5j
    assert compare({"c": e}, {"c": a}, "onnx") != []


def test_unknown_backend_rejected():
    with pytest.raises(KeyError):
        compare({"x": torch.zeros(1)}, {"x": torch.zeros(1)}, "tensorrt")
