"""sweeps.signature: failures that share a cause share a signature; causes stay readable."""

from __future__ import annotations

import pytest

from sweeps.signature import error_signature, normalize_message, root_cause


def _chain(outer: BaseException, cause: BaseException) -> BaseException:
    outer.__cause__ = cause
    return outer


class ConversionError(RuntimeError):
    """Named like torch.onnx's generic wrapper (root_cause matches wrappers by class name)."""


class TorchExportError(RuntimeError):
    pass


class Wrapped(RuntimeError):
    """Not a known wrapper: its own message is the signature even when it has a cause."""


# ── normalization ─────────────────────────────────────────────────────────────


def test_docstring_examples():
    assert (error_signature(ValueError("Expected size 7 but got 12 for 'input_ids' at 0x7f3a"))
            == "ValueError: Expected size N but got N for 'X' at 0xN")
    assert (error_signature(RuntimeError("no lowering for 'aten.histc.default' (12 nodes)"))
            == "RuntimeError: no lowering for 'aten.histc.default' (N nodes)")


@pytest.mark.parametrize("a, b", [
    ("Expected size 7 but got 12", "Expected size 3 but got 1024"),
    ("tolerance 1.5e-3 exceeded by 0.25", "tolerance 2e-05 exceeded by 17.0"),
    ("object at 0x7f3a12 is gone", "object at 0xDEADBEEF is gone"),
    ("in /usr/lib/python3.12/site-packages/torch/fx/node.py:123", "in /opt/venv/lib/x/onnx_ir/_core.py:9"),
    ("input 'input_ids' has rank 2", "input 'pixel_values' has rank 4"),
    ('key "past_key_values.0.key" missing', 'key "logits" missing'),
    ("guard s0 + s12 <= u3", "guard s7 + s1 <= u44"),
])
def test_messages_differing_only_in_details_share_a_signature(a, b):
    assert normalize_message(a) == normalize_message(b)
    assert error_signature(RuntimeError(a)) == error_signature(RuntimeError(b))


def test_each_detail_is_replaced_by_its_placeholder():
    text = normalize_message("size 7 at 0x7f3a in /a/b/c.py:12 for 'input_ids' and \"y\" with s3, u5, 1.5e-3")
    assert text == "size N at 0xN in <path> for 'X' and \"X\" with sN, uN, N"


@pytest.mark.parametrize("op", [
    "aten.histc.default", "aten._grouped_mm.default", "prims.convert_element_type.default",
    "aten::upsample_bilinear2d", "transformers.grouped_mm_fallback",
])
def test_quoted_operator_names_are_kept(op):
    assert f"'{op}'" in normalize_message(f"no lowering for '{op}' in 3 nodes")


def test_different_operators_give_different_signatures():
    a = error_signature(RuntimeError("no lowering for 'aten.histc.default'"))
    b = error_signature(RuntimeError("no lowering for 'aten.bincount.default'"))
    assert a != b


@pytest.mark.parametrize("prefix", ["torch.ops.aten.", "executorch_prim::"])
def test_quoted_operator_names_with_namespace_prefixes_are_kept(prefix):
    a = error_signature(RuntimeError(f"no lowering for '{prefix}histc.default'"))
    b = error_signature(RuntimeError(f"no lowering for '{prefix}bincount.default'"))
    assert a != b


def test_colour_codes_are_stripped():
    plain = normalize_message("Error: unsupported op 'aten.histc.default' at 3")
    coloured = normalize_message("\x1b[1;31mError\x1b[0m: unsupported op \x1b[33m'aten.histc.default'\x1b[0m at 3")
    assert coloured == plain
    assert "\x1b" not in coloured


def test_only_the_first_non_empty_line_counts_and_whitespace_collapses():
    assert normalize_message("\n\n  first   line 3\n second line 4\n") == "first line N"
    assert normalize_message("") == ""


def test_long_messages_are_cut_with_an_ellipsis():
    text = normalize_message("word " * 100, limit=40)
    assert len(text) == 40 and text.endswith("…")
    assert normalize_message("short", limit=40) == "short"


# ── wrappers ──────────────────────────────────────────────────────────────────


def test_generic_wrapper_is_unwrapped_to_its_cause():
    real = RuntimeError("no lowering for 'aten.histc.default' (12 nodes)")
    wrapper = _chain(ConversionError("Failed to convert the exported program to an ONNX model"), real)
    assert root_cause(wrapper) is real
    assert error_signature(wrapper) == "RuntimeError: no lowering for 'aten.histc.default' (N nodes)"


def test_nested_wrappers_are_unwrapped_to_the_first_real_error():
    real = ValueError("shape 7")
    wrapper = _chain(ConversionError("generic"), _chain(TorchExportError("generic too"), real))
    assert root_cause(wrapper) is real
    assert error_signature(wrapper) == "ValueError: shape N"


def test_wrapper_without_cause_is_its_own_signature():
    exc = ConversionError("Failed to convert at step 3")
    assert root_cause(exc) is exc
    assert error_signature(exc) == "ConversionError: Failed to convert at step N"


def test_a_non_wrapper_keeps_its_own_message_even_with_a_cause():
    exc = _chain(Wrapped("specific outer 1"), ValueError("inner"))
    assert root_cause(exc) is exc
    assert error_signature(exc) == "Wrapped: specific outer N"


def test_wrapper_cycle_terminates():
    a, b = ConversionError("a"), TorchExportError("b")
    a.__cause__, b.__cause__ = b, a
    assert root_cause(a) in (a, b)


def test_unwrapping_stops_at_the_first_non_wrapper():
    real = ValueError("the real one")
    middle = _chain(Wrapped("specific"), real)
    assert root_cause(_chain(ConversionError("generic"), middle)) is middle


def test_apostrophes_do_not_defeat_quoted_name_normalization():
    a = error_signature(RuntimeError("ORT doesn't support input 'input_ids' of rank 2"))
    b = error_signature(RuntimeError("ORT doesn't support input 'pixel_values' of rank 4"))
    assert a == b == "RuntimeError: ORT doesn't support input 'X' of rank N"
