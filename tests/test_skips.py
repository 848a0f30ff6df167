"""Tests for skips/: matching, each validation rule, and the real lists against transformers."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import textwrap

import pytest

from skips import (
    EXPORT_SKIPS,
    ONNX_DISABLE_OPTIMIZE,
    ExportSkip,
    OnnxDisableOptimize,
    SkipListError,
    find_export_skip,
    find_onnx_disable_optimize,
    installed_names,
    marker_reason,
    validate_lists,
    xfail_marker,
)

CLASSES = {"NllbMoeForConditionalGeneration", "NllbMoeModel", "LlamaForCausalLM",
           "LlamaModel", "BertModel", "DetrForObjectDetection"}
FAMILIES = {"nllb-moe": {"NllbMoeForConditionalGeneration", "NllbMoeModel"},
            "llama": {"LlamaForCausalLM", "LlamaModel"}, "bert": {"BertModel"},
            "detr": {"DetrForObjectDetection"}}
REASON = "router loops over experts with a data-dependent count; vectorize the dispatch"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = "https://github.com/microsoft/onnxscript/issues/1234"


def skip(**kw):
    kw.setdefault("reason", REASON)
    return ExportSkip(**kw)


def disable(**kw):
    kw.setdefault("reason", "constant folding crashes on SplitToSequence in the neck")
    kw.setdefault("upstream", LINK)
    return OnnxDisableOptimize(**kw)


def check(export_skips=(), onnx_disable=(), families=FAMILIES):
    validate_lists(CLASSES, families, export_skips=export_skips, onnx_disable=onnx_disable)


# ── records ──


def test_reason_is_required_and_keyword_only():
    with pytest.raises(TypeError):
        ExportSkip(classes=("BertModel",))
    with pytest.raises(TypeError):
        ExportSkip(("BertModel",), REASON)  # positional arguments are refused on purpose
    with pytest.raises(TypeError):
        OnnxDisableOptimize(classes=("BertModel",), reason=REASON)  # upstream required


def test_records_are_frozen_and_normalised():
    entry = skip(classes="BertModel", backends="onnx")
    assert entry.classes == ("BertModel",) and entry.backends == ("onnx",)
    assert entry.variants == ("static", "dynamic")
    assert skip(classes="BertModel", backends="all").backends == ("dynamo", "onnx", "executorch")
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.reason = "x"


# ── matching ──


def test_match_by_class_name_and_scope():
    entries = (skip(classes=("LlamaModel",), backends=("onnx",), variants=("dynamic",)),)
    assert find_export_skip("LlamaModel", "llama", "onnx", "dynamic", entries=entries) is entries[0]
    assert find_export_skip("LlamaModel", "llama", "onnx", "static", entries=entries) is None
    assert find_export_skip("LlamaModel", "llama", "dynamo", "dynamic", entries=entries) is None
    assert find_export_skip("LlamaForCausalLM", "llama", "onnx", "dynamic", entries=entries) is None


def test_match_by_model_type_covers_every_class_of_the_family():
    entries = (skip(model_types=("nllb-moe",), backends=("executorch", "dynamo")),)
    for cls in ("NllbMoeModel", "NllbMoeForConditionalGeneration"):
        for variant in ("static", "dynamic"):
            assert find_export_skip(cls, "nllb-moe", "dynamo", variant, entries=entries)
    # the module spelling of the family matches too
    assert find_export_skip("NllbMoeModel", "nllb_moe", "executorch", "static", entries=entries)
    assert find_export_skip("NllbMoeModel", "nllb-moe", "onnx", "static", entries=entries) is None
    assert find_export_skip("LlamaModel", "llama", "dynamo", "static", entries=entries) is None


def test_first_of_several_entries_is_returned_for_its_own_scope():
    a = skip(classes=("BertModel",), backends=("onnx",))
    b = skip(classes=("BertModel",), backends=("dynamo",), reason="a different cause entirely, dynamo only")
    assert find_export_skip("BertModel", "bert", "dynamo", "static", entries=(a, b)) is b
    assert find_export_skip("BertModel", "bert", "onnx", "static", entries=(a, b)) is a


def test_default_lists_are_used_when_not_injected():
    assert find_export_skip("NoSuchModel", "nope", "onnx", "static") is None
    assert find_onnx_disable_optimize("NoSuchModel", "nope") is None


def test_find_onnx_disable_optimize():
    entries = (disable(classes=("DetrForObjectDetection",), variants=("static",)),)
    assert find_onnx_disable_optimize("DetrForObjectDetection", "detr", entries=entries)
    assert find_onnx_disable_optimize("DetrForObjectDetection", "detr", "static", entries=entries)
    assert find_onnx_disable_optimize("DetrForObjectDetection", "detr", "dynamic", entries=entries) is None
    assert find_onnx_disable_optimize("BertModel", "bert", entries=entries) is None


def test_xfail_marker_is_strict_and_carries_reason_and_link():
    plain = xfail_marker(skip(classes=("BertModel",)))
    assert plain.mark.name == "xfail"
    assert plain.mark.kwargs == {"reason": REASON, "strict": True}
    linked = xfail_marker(skip(classes=("BertModel",), upstream=LINK))
    assert REASON in linked.mark.kwargs["reason"] and LINK in linked.mark.kwargs["reason"]
    assert LINK in marker_reason(disable(classes=("BertModel",)))
    staged = marker_reason(skip(classes=("BertModel",), stage="export", upstream=LINK))
    assert staged == f"{REASON} (expected to fail at stage export; upstream: {LINK})"


def test_xfail_marker_reaches_the_pytest_report(tmp_path):
    (tmp_path / "test_marked.py").write_text(textwrap.dedent(f"""
        import pytest
        from skips import ExportSkip, xfail_marker
        ENTRY = ExportSkip(classes=("BertModel",), reason={REASON!r}, upstream={LINK!r})

        @xfail_marker(ENTRY)
        def test_still_broken():
            raise RuntimeError("boom")

        @xfail_marker(ENTRY)
        def test_now_fixed():
            pass
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-rxX", "-p", "no:cacheprovider",
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True)
    out = proc.stdout
    assert proc.returncode == 1, out
    assert "1 failed, 1 xfailed" in out
    assert "[XPASS(strict)] router loops" in out, out
    assert re.search(r"XFAIL .*test_still_broken.*router loops.*issues/1234", out), out


# ── validation: each rule raises, naming the entry ──


def test_valid_lists_pass():
    check(export_skips=(skip(classes=("BertModel",)), skip(model_types=("llama",))),
          onnx_disable=(disable(classes=("DetrForObjectDetection",)),))


@pytest.mark.parametrize("kw, fragment", [
    (dict(classes=("LlamaForCausalLm",)), "close matches: LlamaForCausalLM"),
    (dict(classes=("Zzzzzzzz",)), "no close match"),
    (dict(model_types=("nllb-mo",)), "unknown model type 'nllb-mo'; close matches: nllb-moe"),
    (dict(), "names no model"),
    (dict(classes=("BertModel", "BertModel")), "lists a name twice"),
    (dict(classes=("BertModel",), backends=("tensorrt",)), "unknown backend 'tensorrt'"),
    (dict(classes=("BertModel",), variants=("symbolic",)), "unknown variant 'symbolic'"),
    (dict(classes=("BertModel",), backends=()), "backends is empty"),
    (dict(classes=("BertModel",), stage="tracing"), "unknown stage 'tracing'"),
    (dict(classes=("BertModel",), upstream="github.com/x/y/issues/1"), "not an http(s) URL"),
    (dict(classes=("BertModel",), upstream="https://github.com/pytorch/pytorch"), "does not name a GitHub issue"),
])
def test_export_skip_entry_errors(kw, fragment):
    with pytest.raises(SkipListError) as info:
        check(export_skips=(skip(classes=("LlamaModel",)), skip(**kw)))
    message = str(info.value)
    assert fragment in message
    assert message.startswith("EXPORT_SKIPS[1] (")


@pytest.mark.parametrize("reason", ["", "   ", "fails", "TODO", "flaky", "broken", "Fails on ONNX",
                                    "TODO: investigate why this model breaks", "short cause"])
def test_vague_or_missing_reasons_are_rejected(reason):
    with pytest.raises(SkipListError, match=r"EXPORT_SKIPS\[0\] \(BertModel\): reason"):
        check(export_skips=(skip(classes=("BertModel",), reason=reason),))


@pytest.mark.parametrize("kw, fragment", [
    (dict(upstream=""), "not an http(s) URL"),
    (dict(upstream="see onnxscript bug tracker"), "not an http(s) URL"),
    (dict(upstream="https://github.com/microsoft/onnxscript/issues"), "does not name a GitHub issue"),
    (dict(upstream="https://example.org/"), "not a specific issue"),
    (dict(upstream=None), "must be an http(s) URL"),
    (dict(backends=("dynamo",)), "ONNX-only"),
    (dict(backends="all"), "ONNX-only"),
    (dict(reason="flaky"), "vague"),
])
def test_onnx_disable_entry_errors(kw, fragment):
    with pytest.raises(SkipListError) as info:
        check(onnx_disable=(disable(classes=("DetrForObjectDetection",), **kw),))
    assert fragment in str(info.value)
    assert str(info.value).startswith("ONNX_DISABLE_OPTIMIZE[0] (DetrForObjectDetection)")


def test_non_github_issue_links_are_accepted():
    check(onnx_disable=(disable(classes=("BertModel",), upstream="https://bugs.example.org/show?id=7"),))


@pytest.mark.parametrize("first, second, overlap", [
    (dict(classes=("BertModel",)), dict(classes=("BertModel",)), True),
    (dict(classes=("BertModel",), backends=("onnx",)), dict(classes=("BertModel",), backends=("dynamo",)), False),
    (dict(classes=("BertModel",), variants=("static",)), dict(classes=("BertModel",), variants=("dynamic",)), False),
    (dict(classes=("BertModel",), variants=("static",)), dict(classes=("BertModel",), backends=("onnx",)), True),
    (dict(model_types=("nllb-moe",)), dict(model_types=("nllb_moe",)), True),
    (dict(model_types=("nllb-moe",)), dict(classes=("NllbMoeModel",)), True),   # class inside family
    (dict(model_types=("llama",)), dict(classes=("NllbMoeModel",)), False),
])
def test_overlapping_entries(first, second, overlap):
    entries = (skip(**first), skip(**second, ))
    if overlap:
        with pytest.raises(SkipListError, match=r"EXPORT_SKIPS\[1\] .*overlaps EXPORT_SKIPS\[0\]"):
            check(export_skips=entries)
    else:
        check(export_skips=entries)


def test_family_overlap_needs_the_family_mapping():
    entries = (skip(model_types=("nllb-moe",)), skip(classes=("NllbMoeModel",)))
    check(export_skips=entries, families=set(FAMILIES))   # plain set: cannot know membership
    with pytest.raises(SkipListError, match="overlaps"):
        check(export_skips=entries, families=FAMILIES)


def test_wrong_record_type_is_rejected():
    with pytest.raises(SkipListError, match=r"ONNX_DISABLE_OPTIMIZE\[0\]: expected a OnnxDisableOptimize"):
        check(onnx_disable=(skip(classes=("BertModel",)),))


# ── the real lists ──


@pytest.fixture(scope="module")
def transformers_names():
    classes, families = installed_names()
    return classes, families


def test_installed_catalog_is_sane(transformers_names):
    classes, families = transformers_names
    assert "NllbMoeForConditionalGeneration" in classes and "nllb-moe" in families
    assert "LlamaForCausalLM" in families["llama"]
    assert not any(name.endswith("Config") for name in classes)
    assert len(classes) > 500


def test_real_lists_validate(transformers_names):
    classes, families = transformers_names
    validate_lists(classes, families)
    validate_lists(classes, families, export_skips=EXPORT_SKIPS, onnx_disable=ONNX_DISABLE_OPTIMIZE)
    assert all(isinstance(e, ExportSkip) for e in EXPORT_SKIPS)
    assert all(isinstance(e, OnnxDisableOptimize) for e in ONNX_DISABLE_OPTIMIZE)


def test_real_catalog_rejects_a_typo(transformers_names):
    classes, families = transformers_names
    with pytest.raises(SkipListError, match="close matches: NllbMoeForConditionalGeneration"):
        validate_lists(classes, families,
                       export_skips=(skip(classes=("NllbMoeForConditionalGenerations",)),))
