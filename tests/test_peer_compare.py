"""Tests for benchmarks/peer_compare.py: the bucketing on synthetic data, and one real peer run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import peer_compare as pc  # noqa: E402

from sweeps.report.load import Result  # noqa: E402


def _result(cls, backend, variant, outcome, error=None, test="test_export", stage=None):
    return Result(nodeid=f"sweeps/test_export.py::{test}[{backend}-{variant}-{cls}]", outcome=outcome,
                  model_class=cls, backend=backend, variant=variant, error=error, stage=stage)


def _row(cls, ours, peer, backend="dynamo", variant="static", **extra):
    return {"class": cls, "backend": backend, "variant": variant, "ours": ours, "peer": peer, **extra}


def test_bucket_of():
    assert pc.bucket_of(True, True) == "both pass"
    assert pc.bucket_of(True, False) == "ours only"
    assert pc.bucket_of(False, True) == "peer only"
    assert pc.bucket_of(False, False) == "both fail"


@pytest.mark.parametrize("outcome,status", [("pass", "pass"), ("xpass", "pass"), ("fail", "fail"),
                                            ("xfail", "fail"), ("crash", "fail"), ("skipped", None)])
def test_ours_status(outcome, status):
    assert pc.ours_status(outcome) == status


def test_ours_row_leaves_pre_export_failures_out():
    assert pc.ours_row(_result("A", "onnx", "static", "fail", stage="eager"))["ours"] == "not compared"
    assert pc.ours_row(_result("A", "onnx", "static", "fail", stage="lower"))["ours"] == "fail"
    row = pc.ours_row(_result("A", "onnx", "static", "fail", error="ConversionError: x [96mstep N[0m", stage="lower"))
    assert row["ours_error"] == "ConversionError: x step N"  # terminal colour remains dropped


def test_tabulate_buckets_and_signatures():
    rows = [
        _row("BertModel", "pass", "pass"),
        _row("GPT2Model", "pass", "fail", peer_error="RuntimeError: boom N", peer_stage="export"),
        _row("T5Model", "fail", "pass", ours_error="ValueError: ours broke"),
        _row("DetrModel", "fail", "fail", peer_error="TypeError: X", ours_error="KeyError: 'X'"),
        _row("AlbertModel", "pass", "pass"),
        _row("BrokenModel", "fail", "not compared", peer_error="ValueError: eager outputs"),
        _row("BertModel", "pass", "fail", variant="dynamic", peer_error="AssertionError: at sizes N=N"),
    ]
    tables = pc.tabulate(rows)
    assert list(tables) == ["dynamo/dynamic", "dynamo/static"]
    static = tables["dynamo/static"]
    assert static["both pass"] == ["AlbertModel", "BertModel"]  # sorted
    assert static["ours only"] == ["GPT2Model"]
    assert static["peer only"] == ["T5Model"]
    assert static["both fail"] == ["DetrModel"]
    assert static["not compared"] == ["BrokenModel"]
    assert static["peer_errors"] == {"GPT2Model": "RuntimeError: boom N", "DetrModel": "TypeError: X"}
    assert static["ours_errors"] == {"T5Model": "ValueError: ours broke", "DetrModel": "KeyError: 'X'"}
    assert tables["dynamo/dynamic"]["ours only"] == ["BertModel"]

    text = pc.render_text(tables, rows)
    assert "== dynamo/static: 5 classes compared ==" in text
    assert "both pass      2  AlbertModel, BertModel" in text
    assert "ours only      1  GPT2Model" in text
    assert "GPT2Model: [export] RuntimeError: boom N" in text  # the peer's error for a peer failure
    assert "T5Model: ValueError: ours broke" in text  # our error for peer-only
    assert "BrokenModel [peer not compared" in text
    assert pc.ASYMMETRY_NOTE in text.split("== dynamo/static")[0]  # the dynamic table says so
    md = pc.render_markdown(tables, {"results": "r.jsonl", "transformers": "x"})
    assert "| ours only | 1 | GPT2Model |" in md and "| GPT2Model | peer | `RuntimeError: boom N` |" in md
    json.dumps(tables)  # serialisable as written by --json


def test_select_items_from_results():
    ours = {(r.model_class, r.backend, r.variant): r for r in [
        _result("BertModel", "dynamo", "static", "pass"),
        _result("GPT2Model", "dynamo", "static", "xfail"),
        _result("T5Model", "dynamo", "static", "skipped"),
        _result("BertModel", "onnx", "static", "fail"),
        _result("AlbertModel", "dynamo", "dynamic", "pass"),
        _result("AltCLIPModel", "dynamo", "static", "fail", stage="eager"),  # not an exporter failure
    ]}
    items, notes = pc.select_items(ours, backends=["dynamo"], variants=["static"])
    assert items == [("BertModel", "dynamo", "static"), ("GPT2Model", "dynamo", "static")]
    assert notes == ["dynamo/static AltCLIPModel: ours fail at eager, not compared",
                     "dynamo/static T5Model: ours skipped, not compared"]
    items, _ = pc.select_items(ours, limit=2, variants=["static"])
    assert items == [("BertModel", "dynamo", "static"), ("BertModel", "onnx", "static")]  # AltCLIP left out
    items, notes = pc.select_items(ours, models=["BertModel"], backends=["onnx", "dynamo"])
    assert ("BertModel", "onnx", "static") in items and ("BertModel", "dynamo", "static") in items
    assert "dynamo/dynamic BertModel: no result on our side, not compared" in notes


def test_load_ours_keeps_the_main_test_only(tmp_path):
    path = tmp_path / "results.json"
    records = [_result("BertModel", "dynamo", "static", "fail"),
               _result("BertModel", "dynamo", "static", "pass", test="test_shapes"),
               _result("BertModel", "dynamo", "static", "pass")]  # a later record wins
    path.write_text(json.dumps({"results": [r.to_dict() for r in records]}))
    ours = pc.load_ours(str(path))
    assert list(ours) == [("BertModel", "dynamo", "static")]
    assert ours[("BertModel", "dynamo", "static")].outcome == "pass"


def test_shape_candidates_stay_in_bounds():
    groups = {2: (2, 10), 7: (1, 7)}
    candidates = pc.shape_candidates(groups)
    assert candidates[0] == {2: 3, 7: 6}  # +1, or -1 where +1 is out of bounds
    for sizes in candidates:
        assert any(sizes[k] != k for k in sizes)
        assert all(groups[k][0] <= v <= groups[k][1] for k, v in sizes.items())
    assert len(candidates) == len({json.dumps(c, sort_keys=True) for c in candidates})


def test_flat_peer_outputs_map_onto_our_names():
    import torch

    expected = {"last_hidden_state": torch.zeros(1), "pooler_output": torch.ones(1)}
    actual = pc._flatten_actual([torch.zeros(1), torch.ones(1)], expected)
    assert list(actual) == ["last_hidden_state", "pooler_output"]


def test_dead_child_is_a_failure_of_that_item_only():
    row = pc._dead_row(("BertModel", "dynamo", "static", None), "timeout", "timed out after 5s", 0.0)
    assert row["peer"] == "fail" and row["peer_stage"] == "timeout"


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_real_run_bert_dynamo_static(tmp_path):
    """One real peer export (BertModel, dynamo, static) in a child process, end to end (~25 s; under a minute)."""
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"results": [_result("BertModel", "dynamo", "static", "pass").to_dict()]}))
    out = tmp_path / "out.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "peer_compare.py"), "--results", str(results),
         "--model", "BertModel", "--backend", "dynamo", "--variant", "static", "--timeout", "50",
         "--json", str(out), "--markdown", str(tmp_path / "out.md")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=58)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    (item,) = data["items"]
    assert item["peer"] == "pass", item
    assert data["tables"]["dynamo/static"]["both pass"] == ["BertModel"]
    assert "both pass      1  BertModel" in proc.stdout


def test_dynamic_dims_of_an_exported_program():
    """The peer's dynamic dims are read off its program: symbolic placeholder dims and their bounds."""
    import torch
    from torch.export import Dim

    class Tiny(torch.nn.Module):
        def forward(self, input_ids, attention_mask):
            return input_ids * attention_mask

    inputs = {"input_ids": torch.ones(2, 7, dtype=torch.long), "attention_mask": torch.ones(2, 7, dtype=torch.long)}
    shapes = {"input_ids": {1: Dim("seq", min=2, max=64)}, "attention_mask": {1: Dim("seq", min=2, max=64)}}
    ep = torch.export.export(Tiny(), (), inputs, dynamic_shapes=shapes)
    dims = pc.peer_dynamic_dims("dynamo", ep, inputs)
    assert dims == {"input_ids": {1: {"min": 2, "max": 64}}, "attention_mask": {1: {"min": 2, "max": 64}}}
    from sweeps.shapes import resize_inputs, size_groups

    view = pc._ShapeView(dims, inputs)
    assert size_groups(view) == {7: (2, 20)}  # our draw window: traced * 2 + 6
    (first, *_) = pc.shape_candidates(size_groups(view))
    assert resize_inputs(inputs, view, first)["input_ids"].shape == (2, 8)


def test_dynamic_dims_of_an_onnx_graph():
    from types import SimpleNamespace

    graph = SimpleNamespace(inputs=[SimpleNamespace(name="input_ids", shape=[2, "s41"]),
                                    SimpleNamespace(name="pixel_values", shape=[2, 3, 30, 30])])
    dims = pc.peer_dynamic_dims("onnx", SimpleNamespace(graph=graph), {"input_ids": None, "pixel_values": None})
    assert dims == {"input_ids": {1: {"min": None, "max": None}}}


@pytest.mark.timeout(120)
def test_children_are_reused_and_a_crash_or_hang_loses_one_item(tmp_path):
    """Items run in reused children (max_items each); a crash and a hang cost their own item only,
    the child is replaced and the remaining items still run."""
    sys.path.insert(0, str(REPO / "tests"))
    from _peer_fake import fake_item

    items = [(c, "dynamo", "static", None) for c in ("A", "B", "C", "Crash", "D", "Hang", "E")]
    seen = []
    rows = pc.run_items(items, timeout=15, max_items=2, fn=fake_item, log_dir=str(tmp_path),
                        progress=lambda done, total, row: seen.append((done, total, row["class"])))
    by = {r["class"]: r for r in rows}
    assert sorted(by) == sorted(c for c, *_ in items) and len(seen) == len(items)
    assert (by["Crash"]["peer"], by["Crash"]["peer_stage"]) == ("fail", "crash")
    assert (by["Hang"]["peer"], by["Hang"]["peer_stage"]) == ("fail", "timeout")
    assert all(by[c]["peer"] == "pass" for c in "ABCDE")
    assert by["A"]["pid"] == by["B"]["pid"] != by["C"]["pid"]   # two items per child, then a new one
    assert by["D"]["pid"] != by["C"]["pid"] and by["E"]["pid"] != by["D"]["pid"]  # replaced after crash/hang


def test_resume_reads_written_rows_and_drops_a_torn_line(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"class": "A", "backend": "onnx", "variant": "static", "peer": "pass"}) + "\n"
                    + json.dumps({"class": "Z", "backend": "onnx", "variant": "static", "peer": "fail"}) + "\n"
                    + json.dumps({"class": "A", "backend": "onnx", "variant": "static", "peer": "fail",
                                  "ours": "pass"}) + "\n"
                    + '{"class": "B", "backe')
    got = pc.read_rows(str(rows), [("A", "onnx", "static"), ("B", "onnx", "static")])
    assert got == [{"class": "A", "backend": "onnx", "variant": "static", "peer": "fail"}]  # later row wins
    assert pc.read_rows(str(tmp_path / "missing.jsonl"), [("A", "onnx", "static")]) == []


def test_library_code_never_imports_the_peer():
    """exporters/, sweeps/ and skips/ may name transformers.exporters (the report's peer section title)
    but never import it: only benchmarks/ may. Checked on the syntax tree, imports inside functions
    and importlib.import_module("...") strings included."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    offenders = []
    for folder in ("exporters", "sweeps", "skips"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
                elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
                      in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)):
                    names = [str(node.args[0].value)]
                if any(n == "transformers.exporters" or n.startswith("transformers.exporters.") for n in names):
                    offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not offenders, f"library code imports the peer: {offenders}"
