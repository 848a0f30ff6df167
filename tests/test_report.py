"""Tests for sweeps/report: real pytest logs from a throwaway sweep, merged and rendered."""

from __future__ import annotations

import html.parser
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sweeps.report import main
from sweeps.report.diff import compare, to_markdown
from sweeps.report.load import Result, load_any, load_junit, load_reportlog, merge, normalize_error, parse_test_id
from sweeps.report.render import Report
from sweeps.report.summary import cell_text, failure_signatures, summary_rows, workaround_rows

REPO = str(Path(__file__).resolve().parents[1])

# (backend, variant, class, family, behaviour) — a miniature sweep with every outcome.
FAKE_SWEEP = '''
import json, os, pytest

ITEMS = [
    ("onnx", "dynamic", "BertModel", "bert", "pass"),
    ("onnx", "static", "BertModel", "bert", "pass"),
    ("dynamo", "static", "BertModel", "bert", "fail_export"),
    ("onnx", "dynamic", "NllbMoeForConditionalGeneration", "nllb-moe", "xfail"),
    ("dynamo", "dynamic", "NllbMoeForConditionalGeneration", "nllb-moe", "xpass"),
    ("onnx", "static", "LlamaModel", "llama", "fail_lower"),
    ("onnx", "dynamic", "LlamaModel", "llama", "fail_lower"),
    ("executorch", "static", "LlamaModel", "llama", "crash"),
    ("executorch", "static", "BertModel", "bert", "skip"),
    ("dynamo", "static", "DetrForObjectDetection", "detr", "fail_build"),
    ("onnx", "static", "DetrForObjectDetection", "detr", "pass_noopt"),
]
XFAIL = pytest.mark.xfail(reason="router loops over experts; vectorize the dispatch", strict=True)


def _param(b, v, cls, fam, kind):
    marks = [XFAIL] if kind in ("xfail", "xpass") else []
    return pytest.param(b, v, cls, fam, kind, id=f"{b}-{v}-{cls}", marks=marks)


@pytest.mark.parametrize("backend, variant, cls, family, kind", [_param(*i) for i in ITEMS])
def test_export(record_property, backend, variant, cls, family, kind):
    if os.environ.get("FAKE_FIXED") and kind == "fail_export":
        kind = "pass"
    for key, value in (("model_class", cls), ("model_type", family),
                       ("backend", backend), ("variant", variant)):
        record_property(key, value)
    if backend == "onnx":
        record_property("onnx_optimize", kind != "pass_noopt")
    if kind == "pass_noopt":
        record_property("onnx_optimize_upstream", "https://github.com/microsoft/onnxscript/issues/42")
    record_property("stage", "build")
    if kind == "crash":
        os._exit(3)
    if kind == "skip":
        pytest.skip("BlockedByPackage: needs detectron2")
    failures = {"fail_export": ("export", "Unsupported: data-dependent branch in forward"),
                "fail_lower": ("lower", "DispatchError: aten.index_put"),
                "fail_build": ("build", "ImportError: timm"),
                "xfail": ("export", "GuardOnDataDependentSymNode: u0 > 0")}
    fired = ["fix:onnx:_fix_alias"] if kind == "fail_lower" else []
    if kind.startswith("pass") or kind == "xpass":
        fired = [f"patch:{backend}:torch.where"]
    # the real sweep records a list (JUnit then holds its repr); JSON strings are accepted too
    record_property("workarounds_fired", fired if kind.startswith("pass") else json.dumps(fired))
    record_property("repro", f"pytest sweeps --backend={backend} --model={cls}")
    if kind in failures:
        stage, error = failures[kind]
        record_property("stage", stage)
        record_property("error", error)
        raise RuntimeError(error + " at 0x7f00deadbeef")
    record_property("shapes_checked", 3)
    record_property("stage", "done")
'''


def run_fake_sweep(root: Path, name: str, *extra: str, fixed: bool = False) -> tuple[Path, Path]:
    """Run the fake sweep under xdist; return (reportlog, junit) paths."""
    test_dir = root / "fake_sweeps"
    test_dir.mkdir(exist_ok=True)
    (test_dir / "test_sweep.py").write_text(FAKE_SWEEP)
    log, xml = root / f"{name}.jsonl", root / f"{name}.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "FAKE_"))}
    if fixed:
        env["FAKE_FIXED"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "xdist", "-n", "2",
         f"--report-log={log}", f"--junitxml={xml}", "-q", "fake_sweeps", *extra],
        cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert log.exists() and xml.exists(), proc.stdout + proc.stderr
    return log, xml


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    full = run_fake_sweep(root, "full")
    rerun = run_fake_sweep(root, "rerun", "-k", "dynamo-static-BertModel", fixed=True)
    return {"root": root, "log": full[0], "xml": full[1], "rerun_log": rerun[0]}


def by_id(results):
    return {(r.model_class, r.backend, r.variant): r for r in results}


# ── loading ──


def test_reportlog_outcomes_and_properties(logs):
    results = by_id(load_reportlog(logs["log"]))
    assert len(results) == 11
    assert results["BertModel", "onnx", "dynamic"].outcome == "pass"
    assert results["BertModel", "onnx", "dynamic"].stage == "done"
    assert results["BertModel", "onnx", "dynamic"].workarounds_fired == ["patch:onnx:torch.where"]
    assert results["BertModel", "onnx", "dynamic"].onnx_optimize is True
    assert results["DetrForObjectDetection", "onnx", "static"].onnx_optimize is False
    failed = results["BertModel", "dynamo", "static"]
    assert (failed.outcome, failed.stage, failed.error) == (
        "fail", "export", "Unsupported: data-dependent branch in forward")
    xfail = results["NllbMoeForConditionalGeneration", "onnx", "dynamic"]
    assert (xfail.outcome, xfail.reason) == ("xfail", "router loops over experts; vectorize the dispatch")
    xpass = results["NllbMoeForConditionalGeneration", "dynamo", "dynamic"]
    assert (xpass.outcome, xpass.reason) == ("xpass", "router loops over experts; vectorize the dispatch")
    crash = results["LlamaModel", "executorch", "static"]
    assert (crash.outcome, crash.error, crash.model_type) == ("crash", "worker crashed", None)
    merged = by_id(merge([load_reportlog(logs["log"])])[0])
    assert merged["LlamaModel", "executorch", "static"].model_type == "llama"  # family filled in
    skipped = results["BertModel", "executorch", "static"]
    assert (skipped.outcome, skipped.reason) == ("skipped", "BlockedByPackage: needs detectron2")
    assert results["BertModel", "onnx", "static"].extra == {"shapes_checked": 3}
    assert results["LlamaModel", "onnx", "static"].extra == {}
    assert results["DetrForObjectDetection", "onnx", "static"].onnx_optimize_upstream.endswith("/issues/42")
    assert results["LlamaModel", "onnx", "static"].repro == "pytest sweeps --backend=onnx --model=LlamaModel"
    assert all(r.nodeid.startswith("fake_sweeps/test_sweep.py::test_export[") for r in results.values())


def test_junit_agrees_with_reportlog(logs):
    fields = lambda r: (r.nodeid, r.outcome, r.model_class, r.model_type, r.backend, r.variant,  # noqa: E731
                        r.stage, r.error, r.reason, r.onnx_optimize, r.onnx_optimize_upstream,
                        r.workarounds_fired)
    from_log = sorted(map(fields, load_reportlog(logs["log"])))
    from_xml = sorted(map(fields, load_junit(logs["xml"])))
    assert from_xml == from_log


def test_load_any_sniffs_each_format(logs, tmp_path):
    assert {r.nodeid for r in load_any(logs["xml"])} == {r.nodeid for r in load_any(logs["log"])}
    main(["merge", str(logs["log"]), "--out", str(tmp_path), "--date", "D"])
    again = load_any(tmp_path / "results.json")
    assert [r.to_dict() for r in again] == [r.to_dict() for r in merge([load_any(logs["log"])])[0]]


def test_merge_later_duplicate_wins(logs):
    results, duplicates = merge([load_reportlog(logs["log"]), load_reportlog(logs["rerun_log"])])
    assert len(results) == 11
    assert by_id(results)["BertModel", "dynamo", "static"].outcome == "pass"
    assert len(duplicates) == 1
    assert duplicates[0]["was"] == "fail" and duplicates[0]["now"] == "pass"
    assert duplicates[0]["by"] == str(logs["rerun_log"])
    results, _ = merge([load_reportlog(logs["rerun_log"]), load_reportlog(logs["log"])])
    assert by_id(results)["BertModel", "dynamo", "static"].outcome == "fail"


def test_merge_drops_items_named_by_nodeid_and_says_so(logs, tmp_path, capsys):
    """merge --drop leaves out an item no longer collected (a class since excluded from the test), lists it in the
    report and results.json; a nodeid that names no merged item is refused."""
    results = merge([load_any(logs["log"])])[0]
    gone = results[0].nodeid
    assert main(["merge", str(logs["log"]), "--out", str(tmp_path), "--date", "D", "--drop", gone]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert gone not in {r["nodeid"] for r in data["results"]} and len(data["results"]) == len(results) - 1
    assert data["dropped"] == [{"nodeid": gone, "outcome": results[0].outcome, "source": str(logs["log"])}]
    assert "left out as no longer collected" in (tmp_path / "conformance.md").read_text()
    assert main(["merge", str(logs["log"]), "--out", str(tmp_path), "--drop", "no::such[item]"]) == 2
    assert "--drop names no merged item" in capsys.readouterr().err


def test_merge_keeps_only_the_named_tests_and_records_it(logs, tmp_path, capsys):
    """merge --test keeps one sweep test's items (a log that ran generate and runner items feeds two catalogs),
    records the filter in results.json and the report, and refuses a test no merged item is of."""
    runner_log = tmp_path / "runner.jsonl"  # the same items as another test's: a log of two tests
    runner_log.write_text(Path(logs["log"]).read_text().replace("::test_export[", "::test_runner["))
    results = merge([load_any(logs["log"]), load_any(runner_log)])[0]
    assert {r.test for r in results} == {"test_export", "test_runner"}
    out = tmp_path / "out"
    assert main(["merge", str(logs["log"]), str(runner_log), "--out", str(out), "--date", "D", "--test", "test_export"]) == 0
    data = json.loads((out / "results.json").read_text())
    assert data["tests"] == ["test_export"]
    assert {r["nodeid"].split("::")[-1].split("[")[0] for r in data["results"]} == {"test_export"}
    assert len(data["results"]) == sum(r.test == "test_export" for r in results) > 0
    tmp_path = out
    assert "Only the items of `test_export` were kept" in (tmp_path / "conformance.md").read_text()
    assert main(["merge", str(logs["log"]), "--out", str(tmp_path), "--test", "test_generate"]) == 2
    assert "no merged item is of that test" in capsys.readouterr().err


def test_parse_test_id_and_normalize_error():
    assert parse_test_id("s/t.py::test_export[onnx-dynamic-NllbMoeModel]") == {
        "backend": "onnx", "variant": "dynamic", "model_class": "NllbMoeModel"}
    assert parse_test_id("s/t.py::test_export[tvm-dynamic-X]") == {}
    assert normalize_error("\nE   KeyError: at 0x7fabc123 in   foo\nmore") == "KeyError: at 0xN in foo"
    # masked like the sweep's recorded signatures, so both spellings of one failure group together
    from sweeps.signature import normalize_message

    timeout = "Failed: Timeout (>300.0s) from pytest-timeout."
    assert normalize_error(timeout) == normalize_message(timeout) == "Failed: Timeout (>N.0s) from pytest-timeout."
    assert normalize_error("worker 'gw3' crashed while running 'x'") == "worker crashed"
    assert len(normalize_error("x" * 500)) == 200


# ── aggregation and rendering ──


def test_summary_counts_and_pass_rate(logs):
    rows = {row.column: row for row in summary_rows(load_reportlog(logs["log"]))}
    assert list(rows) == ["dynamo/static", "dynamo/dynamic", "onnx/static", "onnx/dynamic",
                          "executorch/static", "all"]
    assert rows["onnx/static"].counts == {"pass": 2, "xfail": 0, "xpass": 0, "fail": 1, "crash": 0, "skipped": 0}
    assert rows["dynamo/static"].built == 1 and rows["dynamo/static"].pass_pct == 0.0
    assert rows["executorch/static"].counts["crash"] == 1 and rows["executorch/static"].built == 1
    total = rows["all"]
    assert total.counts == {"pass": 3, "xfail": 1, "xpass": 1, "fail": 4, "crash": 1, "skipped": 1}
    assert (total.total, total.built) == (11, 9)
    assert round(total.pass_pct, 1) == 33.3


def test_failure_signatures_rank_by_items(logs):
    sigs = failure_signatures(load_reportlog(logs["log"]))
    assert sigs[0].error == "DispatchError: aten.index_put"
    assert (sigs[0].count, sigs[0].classes, sigs[0].stages) == (2, ["LlamaModel"], [("lower", 2)])
    assert sigs[0].columns == ["onnx/dynamic", "onnx/static"]
    assert {s.error for s in sigs} == {"DispatchError: aten.index_put", "ImportError: timm",
                                       "Unsupported: data-dependent branch in forward", "worker crashed"}


def test_workaround_table_flags_unused(logs):
    rows = {w.name: w for w in workaround_rows(load_reportlog(logs["log"]),
                                               ["patch:onnx:torch.where", "fix:onnx:_fix_alias",
                                                "patch:dynamo:never_fires"])}
    assert rows["patch:onnx:torch.where"].classes == ["BertModel", "DetrForObjectDetection"]
    # it fired only in items that failed later: not dead, not proven needed either
    assert rows["fix:onnx:_fix_alias"].classes == [] and rows["fix:onnx:_fix_alias"].failing == ["LlamaModel"]
    assert rows["fix:onnx:_fix_alias"].status.startswith("unproven")
    assert rows["patch:dynamo:never_fires"].status.startswith("candidate for removal")
    assert rows["patch:dynamo:torch.where"].status == "not in the registered list"
    assert rows["patch:onnx:torch.where"].status == "in use"


def test_markdown_report(logs, tmp_path):
    registered = tmp_path / "registered.txt"
    registered.write_text("# every workaround\npatch:onnx:torch.where\npatch:dynamo:never_fires\n")
    out = tmp_path / "conformance"
    assert main(["merge", str(logs["log"]), str(logs["rerun_log"]), "--out", str(out),
                 "--command", "pytest sweeps -n 2", "--registered", str(registered),
                 "--date", "2026-01-02"]) == 0
    md = (out / "conformance.md").read_text()
    assert "Generated 2026-01-02 by `pytest sweeps -n 2`." in md
    assert "torch 2.13" in md and "transformers " in md and "executorch " in md
    assert "1 item(s) appeared in more than one file; the later file's result was kept" in md
    assert "| onnx/static | 2 | 0 | 0 | 1 | 0 | 0 | 3 | 66.7% |" in md
    assert "| dynamo/static | 1 | 0 | 0 | 1 | 0 | 0 | 2 | 100.0% |" in md    # rerun fixed Bert
    assert "| 1 | 2 | 1 | lower (2) | onnx/dynamic, onnx/static | `DispatchError: aten.index_put` | LlamaModel |" in md
    assert "| `patch:dynamo:never_fires` | 0 | 0 | candidate for removal (fired for no class) |" in md
    from skips import EXPORT_SKIPS
    if EXPORT_SKIPS:  # the current list, by the change that removes each entry, with its age
        assert "## EXPORT_SKIPS by the change that removes them" in md
        assert all(m in md for e in EXPORT_SKIPS for m in e.models)
    lines = {line.split(" | ")[0]: line for line in md.splitlines() if line.startswith("| ")}
    header = next(line for line in md.splitlines() if line.startswith("| model class |"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    llama = [c.strip() for c in lines["| LlamaModel"].strip("|").split("|")]
    cell = dict(zip(cols, llama))
    assert cell["family"] == "llama"
    assert cell["onnx/static"] == "fail (lower: DispatchError: aten.index_put)"
    assert cell["executorch/static"].startswith("crash (")
    assert cell["dynamo/static"] == "–"
    nllb = dict(zip(cols, [c.strip() for c in lines["| NllbMoeForConditionalGeneration"].strip("|").split("|")]))
    assert nllb["onnx/dynamic"] == "xfail (router loops over experts; vectorize the dispatch)"
    assert nllb["dynamo/dynamic"].startswith("XPASS (")
    detr = dict(zip(cols, [c.strip() for c in lines["| DetrForObjectDetection"].strip("|").split("|")]))
    assert detr["onnx/static"] == "pass (optimize off)"
    assert "| DetrForObjectDetection (onnx/static) | pass | https://github.com/microsoft/onnxscript/issues/42 |" in md
    assert detr["dynamo/static"] == "fail (build: ImportError: timm)"


class _Rows(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.items, self.options, self.external = [], [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tr" and "item" in (attrs.get("class") or "").split():
            self.items.append(attrs)
        if tag == "option":
            self.options.append(attrs)
        if (tag in ("script", "img", "iframe") and attrs.get("src")) or (tag == "link" and attrs.get("href")):
            self.external.append((tag, attrs))


def test_html_report_is_static_and_filterable(logs, tmp_path):
    main(["merge", str(logs["log"]), "--out", str(tmp_path), "--date", "D"])
    page = (tmp_path / "conformance.html").read_text()
    parser = _Rows()
    parser.feed(page)
    assert parser.external == []
    assert len(parser.items) == 11
    assert sum(r["data-outcome"] == "fail" for r in parser.items) == 4
    assert {r["data-family"] for r in parser.items} == {"bert", "nllb-moe", "llama", "detr"}
    for key in ("family", "backend", "variant", "outcome"):
        assert f'data-key="{key}"' in page
    assert "<script>" in page and "addEventListener" in page
    assert "DispatchError: aten.index_put" in page


def test_html_escapes_untrusted_text():
    bad = Result(nodeid="t.py::test_export[onnx-static-X]", outcome="fail", model_class="X",
                 backend="onnx", variant="static", stage="run", error="<script>alert(1)</script>")
    page = Report([bad], date="D", versions={}).html()
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)" in page


def test_results_json(logs, tmp_path):
    main(["merge", str(logs["log"]), "--out", str(tmp_path), "--command", "c", "--date", "D"])
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["schema_version"] == 1 and data["command"] == "c" and data["generated"] == "D"
    assert set(data["versions"]) == {"torch", "transformers", "onnx", "onnxscript", "onnxruntime", "executorch"}
    assert len(data["results"]) == 11
    assert data["summary"]["all"]["fail"] == 4
    assert [r["nodeid"] for r in data["results"]] == sorted(r["nodeid"] for r in data["results"])


def test_cell_text():
    r = Result(nodeid="n", outcome="fail", stage="run", error="x" * 100)
    assert cell_text(r, limit=10) == "fail (run: xxxxxxxxx…)"
    assert cell_text(None) == "–"
    assert cell_text(Result(nodeid="n", outcome="skipped")) == "skipped"


def test_missing_package_versions_are_marked():
    from sweeps.report.summary import package_versions
    assert package_versions(["torch", "surely-not-a-package-xyz"])["surely-not-a-package-xyz"] == "not installed"


# ── diff ──


def test_diff_between_runs(logs, tmp_path, capsys):
    main(["merge", str(logs["log"]), "--out", str(tmp_path), "--date", "D"])
    assert main(["diff", str(tmp_path / "results.json"), str(logs["rerun_log"])]) == 0
    text = capsys.readouterr().out
    assert "## New passes (1)" in text
    assert "| BertModel (dynamo/static) | fail (export: Unsupported: data-dependent branch in forward) | pass |" in text
    assert "## Items no longer in the run (10)" in text


def _r(nodeid, outcome, **kw):
    return Result(nodeid=nodeid, outcome=outcome, model_class=nodeid, backend="onnx", variant="static", **kw)


def test_diff_categories():
    old = [_r("A", "pass"), _r("B", "xfail", reason="r"), _r("C", "fail", stage="lower", error="e1"),
           _r("D", "fail", stage="lower", error="e1"), _r("E", "fail", error="e"), _r("F", "xfail")]
    new = [_r("A", "crash", error="worker crashed"), _r("B", "xpass", reason="r"),
           _r("C", "fail", stage="run", error="e1"), _r("D", "fail", stage="lower", error="e1"),
           _r("E", "pass"), _r("F", "pass"), _r("G", "fail", error="e")]
    d = compare(old, new)
    assert [(p and p.nodeid, c.nodeid) for p, c in d.new_failures] == [("A", "A"), (None, "G")]
    assert [c.nodeid for _, c in d.new_passes] == ["E"]
    assert [c.nodeid for _, c in d.xfail_now_pass] == ["B", "F"]
    assert [c.nodeid for _, c in d.changed_signatures] == ["C"]
    assert [r.nodeid for r in d.added] == ["G"]
    text = to_markdown(d)
    assert "## xfail entries that now pass (2)" in text and "Remove these EXPORT_SKIPS entries" in text
    assert "| C (onnx/static) | fail (lower: e1) | fail (run: e1) |" in text


def test_diff_fail_on_regression(tmp_path):
    for name, outcome in (("old", "pass"), ("new", "fail")):
        (tmp_path / f"{name}.json").write_text(json.dumps({"results": [_r("A", outcome).to_dict()]}))
    args = ["diff", str(tmp_path / "old.json"), str(tmp_path / "new.json")]
    assert main(args + ["--out", str(tmp_path / "d.md")]) == 0
    assert "## New failures (1)" in (tmp_path / "d.md").read_text()
    assert main(args + ["--out", str(tmp_path / "d.md"), "--fail-on-regression"]) == 1


def test_module_entry_point(logs, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "sweeps.report", "merge", str(logs["xml"]),
                           "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "11 items" in proc.stdout
    assert (tmp_path / "conformance.md").exists() and (tmp_path / "conformance.html").exists()


def test_other_sweep_tests_get_their_own_columns():
    export = Result(nodeid="s/test_export.py::test_export[onnx-dynamic-X]", outcome="pass",
                    model_class="X", backend="onnx", variant="dynamic")
    shapes = Result(nodeid="s/test_shapes.py::test_shapes[onnx-dynamic-X]", outcome="fail",
                    model_class="X", backend="onnx", variant="dynamic", stage="shapes", error="e")
    assert (export.column, shapes.column) == ("onnx/dynamic", "test_shapes onnx/dynamic")
    md = Report([export, shapes], date="D", versions={}).markdown()
    assert "| X |  | pass | fail (shapes: e) |" in md


NODE_FAKE_DOM = r"""
const fs = require("fs");
const page = fs.readFileSync(process.argv[2], "utf8");
const script = page.match(/<script>([\s\S]*?)<\/script>/)[1];
const rows = [...page.matchAll(/<tr class="item[^"]*"([^>]*)>/g)].map(m => {
  const ds = {};
  for (const a of m[1].matchAll(/data-(\w+)="([^"]*)"/g)) ds[a[1]] = a[2];
  return {dataset: ds, style: {display: ""}};
});
const listeners = [];
const mk = key => ({dataset: {key}, value: "", addEventListener: (e, f) => listeners.push(f)});
const selects = ["family", "backend", "variant", "outcome"].map(mk);
const text = {value: "", addEventListener: (e, f) => listeners.push(f)};
const shown = {textContent: ""};
global.document = {
  querySelectorAll: sel => sel.includes("select") ? selects : rows,
  getElementById: id => id === "text" ? text : shown,
};
eval(script);
const filters = JSON.parse(process.argv[3]);
selects.forEach(s => { s.value = filters[s.dataset.key] || ""; });
text.value = filters.text || "";
listeners[0]();
console.log(JSON.stringify({shown: shown.textContent,
  classes: rows.filter(r => r.style.display !== "none").map(r => r.dataset["class"])}));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is needed to run the page's script")
@pytest.mark.parametrize("filters, expected", [
    ({}, 11),
    ({"family": "llama"}, 3),
    ({"backend": "onnx", "outcome": "fail"}, 2),
    ({"backend": "onnx", "variant": "static", "outcome": "pass"}, 2),
    ({"text": "nllb"}, 2),
    ({"family": "bert", "outcome": "crash"}, 0),
])
def test_html_filters_run_in_node(logs, tmp_path, filters, expected):
    main(["merge", str(logs["log"]), "--out", str(tmp_path), "--date", "D"])
    (tmp_path / "dom.js").write_text(NODE_FAKE_DOM)
    proc = subprocess.run(["node", str(tmp_path / "dom.js"), str(tmp_path / "conformance.html"),
                           json.dumps(filters)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["shown"] == f"{expected} of 11 shown"
    assert len(result["classes"]) == expected


def test_unit_tests_in_the_same_log_are_not_matrix_rows(tmp_path):
    """A plain `pytest` run logs unit tests next to the smoke sweep; only sweep items are rows."""
    def line(nodeid):
        return json.dumps({"$report_type": "TestReport", "nodeid": nodeid, "when": "call", "outcome": "passed",
                           "user_properties": [], "longrepr": None, "duration": 0.1, "location": ["x", 1, "y"],
                           "keywords": {}, "sections": []})
    log = tmp_path / "mixed.jsonl"
    log.write_text("\n".join([line("tests/test_parity.py::test_a[onnx]"),
                              line("tests/test_repro.py::test_id[sweeps/test_export.py::test_export[onnx-static-X]]"),
                              line("sweeps/test_export.py::test_export[onnx-static-BertModel]")]) + "\n")
    assert [r.nodeid for r in load_any(log)] == ["sweeps/test_export.py::test_export[onnx-static-BertModel]"]


def _peer_json(tmp_path):
    """A peer comparison file as ``benchmarks/peer_compare.py --json`` writes it."""
    sys.path.insert(0, str(Path(REPO) / "benchmarks"))
    import peer_compare as pc

    rows = [
        {"class": "BertModel", "backend": "onnx", "variant": "static", "ours": "pass", "peer": "pass"},
        {"class": "LlamaModel", "backend": "onnx", "variant": "static", "ours": "fail", "peer": "pass",
         "ours_error": "DispatchError: aten.index_put"},
        {"class": "DetrForObjectDetection", "backend": "onnx", "variant": "static", "ours": "pass",
         "peer": "fail", "peer_error": "ParityError: logits"},
        {"class": "VitModel", "backend": "onnx", "variant": "static", "ours": "not compared", "peer": "pass"},
        # stale: our log said fail when the peer ran; the merged report (the fake sweep) says pass
        {"class": "BertModel", "backend": "onnx", "variant": "dynamic", "ours": "fail", "ours_error": "old",
         "peer": "fail", "peer_error": "ShapeMismatch"},
    ]
    path = tmp_path / "peer.json"
    path.write_text(json.dumps({"meta": {}, "tables": pc.tabulate(rows), "items": rows}))
    return path


def test_peer_section_in_the_report(logs, tmp_path):
    peer = _peer_json(tmp_path)
    out = tmp_path / "conformance"
    assert main(["merge", str(logs["log"]), "--out", str(out), "--date", "D", "--peer", str(peer)]) == 0
    md = (out / "conformance.md").read_text()
    assert "## Ours vs transformers.exporters" in md
    assert f"| onnx/static | 3 | 1 | 1 | 1 | 0 | 1 | {peer} |" in md
    assert f"| onnx/dynamic | 1 | 0 | 1 | 0 | 0 | 0 | {peer} |" in md   # our side re-judged: now a pass
    assert "- DetrForObjectDetection: `ParityError: logits`" in md   # why the peer fails where we pass
    assert "- LlamaModel: `DispatchError: aten.index_put`" in md     # why we fail where the peer passes
    assert md.index("## Ours vs transformers.exporters") < md.index("## Top failure signatures")
    data = json.loads((out / "results.json").read_text())
    assert data["peer"][0]["ours only"] == ["BertModel"] and data["peer"][0]["both fail"] == []
    assert data["peer"][1:] == [{"column": "onnx/static", "source": str(peer), "both pass": ["BertModel"],
                             "ours only": ["DetrForObjectDetection"], "peer only": ["LlamaModel"],
                             "both fail": [], "not compared": ["VitModel"]}]
    assert 'id="peer"' in (out / "conformance.html").read_text()
    # without --peer there is no section
    main(["merge", str(logs["log"]), "--out", str(tmp_path / "plain"), "--date", "D"])
    assert "Ours vs transformers.exporters" not in (tmp_path / "plain" / "conformance.md").read_text()


def test_peer_file_that_is_not_a_comparison_is_refused(logs, tmp_path):
    bad = tmp_path / "results.json"
    bad.write_text(json.dumps({"results": []}))
    with pytest.raises(SystemExit, match=r"--peer .*results.json: no 'tables' object; "
                                         r"pass the file written by benchmarks/peer_compare.py --json"):
        main(["merge", str(logs["log"]), "--out", str(tmp_path / "o"), "--peer", str(bad)])
    with pytest.raises(SystemExit, match=r"--peer .*missing.json: cannot read it as JSON"):
        main(["merge", str(logs["log"]), "--out", str(tmp_path / "o"), "--peer", str(tmp_path / "missing.json")])


def test_runner_and_quantized_sections():
    """The runner and quantized sweeps get their own tables (pass rate of built, top causes) and the
    quantized items' SQNR distribution, the classes below the floor and those with nothing quantized."""
    assert parse_test_id("s/test_quantized.py::test_quantized[onnx-int8-BertModel]") == {
        "backend": "onnx", "variant": "int8", "model_class": "BertModel"}
    q = "sweeps/test_quantized.py::test_quantized"
    results = [
        Result(nodeid=f"{q}[onnx-int8-A]", outcome="pass", model_class="A", backend="onnx", variant="int8",
               extra={"sqnr_db": 31.5, "steps_off": 2.0, "quantizable": True, "useless": False}),
        Result(nodeid=f"{q}[onnx-int8-B]", outcome="pass", model_class="B", backend="onnx", variant="int8",
               extra={"sqnr_db": 7.7, "steps_off": 0.0, "quantizable": True, "useless": True}),
        Result(nodeid=f"{q}[onnx-int8-C]", outcome="pass", model_class="C", backend="onnx", variant="int8",
               extra={"quantize_ops": 0, "quantizable": False}),
        Result(nodeid=f"{q}[onnx-int8-W]", outcome="pass", model_class="W", backend="onnx", variant="int8",
               extra={"steps_off": 13.5, "rounding_spread_steps": 86.04, "quantizable": True}),
        Result(nodeid=f"{q}[onnx-int8-D]", outcome="fail", model_class="D", backend="onnx", variant="int8",
               stage="compare", error="ParityError: y: 40 quantization steps"),
        Result(nodeid="s/test_runner.py::test_runner[ort-genai-E]", outcome="fail", model_class="E",
               backend="onnx", variant="genai", stage="export", error="GenerationError: no cache"),
        # xfails count among the rest, grouped by the cause that opens their entry's reason
        *(Result(nodeid=f"s/test_runner.py::test_runner[ort-genai-{c}]", outcome="xfail", model_class=c,
                 backend="onnx", variant="genai", reason=f"linear-attention layers in the cache: {c}'s evidence")
          for c in ("F", "G")),
        Result(nodeid="s/test_runner.py::test_runner[ort-genai-H]", outcome="xfail", model_class="H",
               backend="onnx", variant="genai", reason="no cache at all (forward returns none); more"),
    ]
    md = Report(results, date="D", versions={}).markdown()
    assert "| test_quantized onnx/int8 | 4 | 5 | 80.0% | 1x `ParityError: y: 40 quantization steps` |" in md
    # a pass past the fixed 8 steps is listed with the reference's own spread that allowed it
    assert ("test_quantized onnx/int8, passing past the fixed 8 steps within the reference's own rounding spread "
            "(steps off, of spread): W (13.5 of 86.0)") in md
    assert ("| test_runner onnx/genai | 0 | 4 | 0.0% | 1x `GenerationError: no cache`; "
            "2x xfail: linear-attention layers in the cache; 1x xfail: no cache at all |") in md
    # two SQNRs measured: min 7.7, max 31.5; one in the < 10 bin, one in 30-40; worst passing 13.5 steps
    assert "| test_quantized onnx/int8 | 2 | 7.7 |" in md and "| 1 | 0 | 0 | 1 | 0 | 13.5 | C |" in md
    assert "test_quantized onnx/int8, below 10 dB: B" in md


def test_an_item_the_run_stopped_in_has_no_result(tmp_path):
    """A sharded run stopped mid-item leaves that item's setup report and nothing after: no verdict, not a pass."""
    log = tmp_path / "stopped.jsonl"
    item = "sweeps/test_quantized.py::test_quantized[executorch-int8-A]"
    done = "sweeps/test_quantized.py::test_quantized[executorch-int8-B]"
    lines = [{"$report_type": "TestReport", "nodeid": done, "when": w, "outcome": "passed", "user_properties": []}
             for w in ("setup", "call", "teardown")]
    lines.append({"$report_type": "TestReport", "nodeid": item, "when": "setup", "outcome": "passed", "user_properties": []})
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    results = load_reportlog(log)
    assert [(r.model_class, r.outcome) for r in results] == [("B", "pass")]
