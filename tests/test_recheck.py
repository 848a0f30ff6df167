"""sweeps.recheck: workarounds re-run without themselves, ONNX_DISABLE_OPTIMIZE, EXPORT_SKIPS ages.

Synthetic results and a fresh Registry: a tiny hand-built model with one method torch.export cannot
trace (a data-dependent branch) and one it can; a patch on each. Dynamo backend only.
"""

from __future__ import annotations

import datetime
import json
import types

import pytest
import torch

from exporters import exporter_executorch, exporter_onnx  # noqa: F401 - their workarounds register on import
from exporters.utils import DEFAULT_REGISTRY, Registry, WorkaroundError, flatten_outputs, register_patch
from skips.records import ExportSkip, OnnxDisableOptimize
from sweeps import recheck
from sweeps.recheck import Item, Rerun, recheck_workarounds, run_item, switched_off
from sweeps.report.load import Result
from sweeps.runner import Reference


class Gated(torch.nn.Module):
    """``scale`` branches on a tensor value (untraceable); ``shift`` is plain (traceable)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 4)

    def scale(self, y):
        if y.abs().sum() >= 0:  # always true, but torch.export cannot know
            return y * 2
        return y

    def shift(self, y):
        return y + 1

    def forward(self, x):
        y = self.lin(x)
        return {"out": self.shift(self.scale(y))}


SCALE = f"patch:dynamo:{__name__}.Gated.scale"
SHIFT = f"patch:dynamo:{__name__}.Gated.shift"


@pytest.fixture
def reg():
    registry = Registry()

    @register_patch("dynamo", f"{__name__}.Gated.scale", registry=registry)
    def _patch_scale(_original):
        return lambda self, y: y * 2  # the branch is always taken: no branch at all

    @register_patch("dynamo", f"{__name__}.Gated.shift", registry=registry)
    def _patch_shift(original):
        return lambda self, y: original(self, y)  # fires, changes nothing

    return registry


@pytest.fixture(autouse=True)
def _default_registry_untouched():
    before = [e.name for e in DEFAULT_REGISTRY.all_workarounds()]
    table, fixes = dict(exporter_onnx._ONNX_TRANSLATION_TABLE), exporter_onnx._IR_FIXES
    yield
    assert [e.name for e in DEFAULT_REGISTRY.all_workarounds()] == before
    assert exporter_onnx._ONNX_TRANSLATION_TABLE == table and exporter_onnx._IR_FIXES is fixes


def _reference(class_name):
    assert class_name == "Gated"
    model = Gated().eval()
    inputs = {"x": torch.randn(2, 4)}
    with torch.no_grad():
        expected = flatten_outputs(model(**inputs))
    return Reference(types.SimpleNamespace(model=model, inputs=inputs), expected)


def _run(item, registry):
    return run_item(item, registry, reference=_reference)


def _result(outcome="pass", fired=(SCALE, SHIFT), variant="static", cls="Gated"):
    return Result(nodeid=f"sweeps/test_export.py::test_export[dynamo-{variant}-{cls}]", outcome=outcome,
                  model_class=cls, backend="dynamo", variant=variant, workarounds_fired=list(fired))


# ── one item with a registry ──────────────────────────────────────────────────


def test_run_item_passes_with_every_patch_and_records_them(reg):
    rerun = _run(Item("dynamo", "static", "Gated"), reg)
    assert rerun.passed and rerun.stage == "done"
    assert set(rerun.fired) == {SCALE, SHIFT}


def test_run_item_reports_export_failure_without_raising():
    rerun = _run(Item("dynamo", "static", "Gated"), Registry())
    assert not rerun.passed and rerun.stage == "export"
    assert rerun.error


# ── workarounds ───────────────────────────────────────────────────────────────


def test_patch_not_needed_is_removable_and_needed_one_is_not(reg):
    checks = recheck_workarounds([_result()], only=[SHIFT, SCALE], registry=reg, run=_run)
    by_name = {c.name: c for c in checks}
    shift, scale = by_name[SHIFT], by_name[SCALE]
    assert shift.removable and shift.pass_without == ["Gated"] and shift.needed_by == []
    assert "candidate for removal" in shift.verdict
    assert not scale.removable and scale.needed_by == ["Gated"] and scale.pass_without == []
    assert scale.reruns[0].stage == "export" and scale.reruns[0].recorded == "pass"
    assert scale.stage == "2: Model patches"
    text = recheck.workarounds_markdown(checks, "results.json")
    assert f"Candidates for removal: `{SHIFT}`." in text
    assert "| dynamo-static-Gated | pass | fail | export |" in text
    data = json.loads(json.dumps([c.to_dict() for c in checks]))
    assert [d["removable"] for d in data] == [True, False]


def test_switched_off_patch_is_not_installed_and_registry_is_untouched(reg):
    with switched_off(SCALE, reg) as without:
        assert [e.name for e in without.all_workarounds()] == [SHIFT]
    assert {e.name for e in reg.all_workarounds()} == {SCALE, SHIFT}


def test_failing_items_not_rerun_unless_asked(reg):
    calls = []

    def run(item, registry):
        calls.append(item.id)
        return Rerun(item, True, "done")

    results = [_result(), _result("fail", variant="dynamic")]
    (check,) = recheck_workarounds(results, only=[SHIFT], registry=reg, run=run)
    assert calls == ["dynamo-static-Gated"]
    assert [(i.id, why) for i, why in check.skipped] == [("dynamo-dynamic-Gated", "recorded fail with it")]
    calls.clear()
    recheck_workarounds(results, only=[SHIFT], registry=reg, run=run, include_failing=True)
    assert sorted(calls) == ["dynamo-dynamic-Gated", "dynamo-static-Gated"]


def test_limit_caps_reruns_per_workaround(reg):
    results = [_result(cls=c) for c in ("A", "B", "C")]
    run = lambda item, registry: Rerun(item, True, "done")  # noqa: E731
    (check,) = recheck_workarounds(results, only=[SHIFT], registry=reg, run=run, limit=2)
    assert [r.item.model_class for r in check.reruns] == ["A", "B"]
    assert [(i.model_class, why) for i, why in check.skipped] == [("C", "--limit 2")]
    assert check.removable and "re-run the others" in check.verdict  # two of three say nothing of the third
    text = recheck.workarounds_markdown([check])
    assert "Candidates for removal: none." in text and f"some items not re-run): `{SHIFT}`" in text


def test_workaround_that_fired_nowhere_has_nothing_to_rerun(reg):
    (check,) = recheck_workarounds([_result(fired=[SCALE])], only=[SHIFT], registry=reg, run=_run)
    assert check.fired_for == [] and not check.removable
    assert "fired for no item" in check.verdict


def test_unknown_workaround_name_raises_with_close_matches(reg):
    with pytest.raises(WorkaroundError, match="close matches"):
        recheck_workarounds([], only=[SHIFT + "x"], registry=reg, run=_run)


def test_rerun_where_switched_off_workaround_fires_is_an_error(reg):
    run = lambda item, registry: Rerun(item, True, "done", fired=[SHIFT])  # noqa: E731
    with pytest.raises(WorkaroundError, match="switched off"):
        recheck_workarounds([_result()], only=[SHIFT], registry=reg, run=run)


def test_onnx_translation_and_ir_fix_switched_off_then_restored():
    translation = next(iter(exporter_onnx._ONNX_TRANSLATION_TABLE.values()))
    name = f"translation:onnx:{translation.__name__}"
    with switched_off(name) as reg:
        assert reg is DEFAULT_REGISTRY
        assert translation not in exporter_onnx._ONNX_TRANSLATION_TABLE.values()
    assert translation in exporter_onnx._ONNX_TRANSLATION_TABLE.values()
    fix = exporter_onnx._IR_FIXES[0]
    with switched_off(f"fix:onnx:{fix.__name__}"):
        assert fix not in exporter_onnx._IR_FIXES
    assert fix in exporter_onnx._IR_FIXES
    with pytest.raises(RuntimeError, match="boom"), switched_off(name):
        raise RuntimeError("boom")
    assert translation in exporter_onnx._ONNX_TRANSLATION_TABLE.values()


def test_unknown_kind_raises():
    with pytest.raises(WorkaroundError, match="no registered workaround"):
        recheck.workaround_kind("translation:onnx:_aten_nothing_like_this")


def test_cli_workarounds_with_no_fired_items_runs_nothing(tmp_path, capsys):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"results": [_result(fired=[]).to_dict()]}))
    assert recheck.main(["workarounds", "--results", str(path), "--only",
                         "fix:onnx:_fix_dead_assertions"]) == 0
    assert "fired for no item in these results" in capsys.readouterr().out
    assert recheck.main(["workarounds", "--results", str(path), "--only", "patch:dynamo:nope.x"]) == 2
    assert recheck.main(["workarounds", "--results", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert all(w["fired_for"] == [] for w in data["workarounds"]) and data["workarounds"]


# ── ONNX_DISABLE_OPTIMIZE ─────────────────────────────────────────────────────


def test_onnx_optimize_empty_list_says_so(capsys):
    assert recheck.recheck_onnx_optimize([]) == []
    assert "ONNX_DISABLE_OPTIMIZE is empty" in recheck.onnx_optimize_markdown([])
    assert recheck.main(["onnx-optimize"]) == 0  # the real list is empty today
    assert "ONNX_DISABLE_OPTIMIZE is empty" in capsys.readouterr().out


def test_onnx_optimize_entry_that_passes_is_reported_for_removal():
    entries = [
        OnnxDisableOptimize(classes=("BertModel",), reason="constant folding crashes on SplitToSequence",
                            upstream="https://github.com/microsoft/onnxscript/issues/1"),
        OnnxDisableOptimize(classes=("GPT2Model",), variants=("dynamic",), reason="FPN initializers dropped",
                            upstream="https://github.com/microsoft/onnxscript/issues/2"),
    ]
    seen = []

    def run(item, registry):
        seen.append(item.id)
        return Rerun(item, item.model_class == "BertModel", "done" if item.model_class == "BertModel" else "lower")

    rows = recheck.recheck_onnx_optimize(entries, run=run)
    assert seen == ["onnx-static-BertModel", "onnx-dynamic-BertModel", "onnx-dynamic-GPT2Model"]
    assert [r["still_needed"] for r in rows] == [False, True]
    text = recheck.onnx_optimize_markdown(rows)
    assert "no longer reproduces: remove the entry" in text and "1 of 2 entries can be removed" in text


# ── EXPORT_SKIPS ──────────────────────────────────────────────────────────────


def test_skips_grouped_by_the_change_that_removes_them_with_age():
    change = "Remove when the router vectorizes the dispatch with a one-hot mask"
    entries = [
        ExportSkip(classes=("BertModel",), reason="router loops over experts with a data-dependent count. " + change),
        ExportSkip(classes=("GPT2Model",), backends=("onnx",), reason="module passed as a forward argument; "
                   "pass its output instead"),
        ExportSkip(classes=("T5Model",), reason="the top-2 router loops over its experts in Python; " + change + "  "),
    ]
    dates = {"BertModel": "2026-11-01", "GPT2Model": "2026-10-01", "T5Model": None}
    groups = recheck.skips_report(entries, today=datetime.date(2026, 11, 11), date_of=dates.get)
    assert [len(g["entries"]) for g in groups] == [1, 2]  # oldest group first
    assert groups[1]["change"] == change  # two causes, one change: one group
    assert [e["cause"] for e in groups[1]["entries"]] == [
        "router loops over experts with a data-dependent count", "the top-2 router loops over its experts in Python"]
    assert groups[0]["change"] == "(no removing change named in the reason)"
    assert groups[1]["entries"][0]["age_days"] == 10 and groups[1]["entries"][1]["since"] is None
    text = recheck.skips_markdown(groups)
    assert f"## {change}" in text and "2026-11-01 (10 days)" in text and "not committed yet" in text


@pytest.mark.parametrize("reason, change", [
    ("x fails. Remove when transformers fixes it", "Remove when transformers fixes it"),
    ("x fails; remove this entry once torch 2.14 lands", "remove this entry once torch 2.14 lands"),
    ("x fails, vectorize the dispatch in the model to remove this entry", None),
])
def test_split_reason_finds_the_removing_change(reason, change):
    cause, found = recheck.split_reason(reason)
    if change is None:
        assert found.startswith("to remove this entry") or found.startswith("(no removing")
    else:
        assert (cause, found) == ("x fails", change)


def test_skips_empty_list_says_so(capsys):
    assert "EXPORT_SKIPS is empty" in recheck.skips_markdown([])
    assert recheck.main(["skips", "--json"]) == 0
    assert "export_skips" in json.loads(capsys.readouterr().out)


def test_first_commit_date_reads_git_history():
    date = recheck.first_commit_date("EXPORT_SKIPS")
    if date is None:
        pytest.skip("no git history here")
    datetime.date.fromisoformat(date)
    assert recheck.first_commit_date("NoSuchModelClassEverWritten") is None
