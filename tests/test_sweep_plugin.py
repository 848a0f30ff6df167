"""sweeps.plugin in process: --shard parsing and the catalog's shard partition, --resume, --backend/--variant choices,
markers; EXPORT_SKIPS entries as strict xfails (in a pytester project). The end-to-end sessions (ids, selection,
shards, usage errors, markers, the patch guard) are in test_sweep_sessions.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sweeps import plugin

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]


# ── shards ────────────────────────────────────────────────────────────────────────────────────


def test_sharding_the_whole_catalog_partitions_it(pytestconfig):
    """_sweep_entries with --shard I/N over the real catalog, for several N (no subprocess)."""
    from sweeps.zoo import catalog

    class Config:
        def __init__(self, shard):
            self._sweep = {"models": None, "shard": shard}
            self.option = type("Option", (), {"sweep": "full", "file_or_dir": ["sweeps"]})()

    names = sorted(e.class_name for e in catalog())
    for n in (1, 2, 5, 8):
        parts = [[e.class_name for e in plugin._sweep_entries(Config((i, n)))] for i in range(1, n + 1)]
        assert sorted(c for p in parts for c in p) == names, n
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


@pytest.mark.parametrize("text", ["0/3", "4/3", "two/3", "3", "1/0", "1/2/3", "", "-1/3", "1/ ", "1.5/3"])
def test_parse_shard_rejects_bad_values(text):
    with pytest.raises(pytest.UsageError, match="--shard"):
        plugin._parse_shard(text)


def test_parse_shard_accepts_i_of_n():
    assert plugin._parse_shard("2/8") == (2, 8)
    assert plugin._parse_shard("1/1") == (1, 1)
    assert plugin._parse_shard(None) is None


# ── usage errors ──────────────────────────────────────────────────────────────────────────────


def test_split_and_check_choices_in_process():
    assert plugin._split(["dynamo, onnx", "executorch", ",,"]) == ["dynamo", "onnx", "executorch"]
    assert plugin._check_choices("backend", [], plugin.BACKENDS) == list(plugin.BACKENDS)
    with pytest.raises(pytest.UsageError, match=r"unknown --backend 'exectorch'.*did you mean executorch"):
        plugin._check_choices("backend", plugin._split(["dynamo,exectorch"]), plugin.BACKENDS)
    with pytest.raises(pytest.UsageError, match=r"unknown --variant 'STATIC'"):
        plugin._check_choices("variant", ["STATIC"], plugin.VARIANTS)


# ── markers ───────────────────────────────────────────────────────────────────────────────────


def test_markers_registered_in_this_session(pytestconfig):
    lines = {ln.split(":", 1)[0]: ln.split(":", 1)[1] for ln in pytestconfig.getini("markers") if ":" in ln}
    for name in ("dynamo", "onnx", "executorch", "smoke", "slow"):
        assert lines.get(name, "").strip(), name


# ── EXPORT_SKIPS entries become strict xfails (a fake list, injected in a pytester conftest) ──


SKIP_CONFTEST = '''
pytest_plugins = ["sweeps.plugin"]

import skips
from skips import ExportSkip

ENTRIES = (
    ExportSkip(classes=("BertModel",), backends=("onnx",), variants=("dynamic",), stage="export",
               reason="attention mask built in a data-dependent Python loop; vectorize it in the model"),
    ExportSkip(classes=("BertModel",), backends=("dynamo",), variants=("static",),
               reason="stale entry for a model that exports fine now; remove it from the list",
               upstream="https://github.com/huggingface/transformers/issues/12345"),
)
_original = skips.find_export_skip


def _find(class_name, model_type, backend, variant, *, test="export", entries=ENTRIES):
    return _original(class_name, model_type, backend, variant, test=test, entries=entries)


skips.find_export_skip = _find
'''

SKIP_TEST = '''
def test_export(sweep_case, record_property):
    record_property("backend", sweep_case.backend)
    record_property("variant", sweep_case.variant)
    if sweep_case.id == "onnx-dynamic-BertModel":
        raise RuntimeError("fails exactly as the entry says")
'''


@pytest.fixture
def sweep_project(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    return pytester


def test_export_skip_entry_is_a_strict_xfail_carrying_its_reason(sweep_project):
    sweep_project.makeconftest(SKIP_CONFTEST)
    sweep_project.makepyfile(test_export=SKIP_TEST)
    result = sweep_project.runpytest_subprocess("--model", "BertModel", "-rxX", "-p", "no:cacheprovider")
    # 4 clean items pass; the failing one is an expected failure; the passing one is XPASS(strict)
    result.assert_outcomes(passed=4, xfailed=1, failed=1)
    result.stdout.fnmatch_lines([
        "XFAIL test_export.py::test_export[[]onnx-dynamic-BertModel[]] - attention mask built in a "
        "data-dependent Python loop; vectorize it in the model (expected to fail at stage export)",
    ])
    result.stdout.fnmatch_lines([
        "*_ test_export[[]dynamo-static-BertModel[]] _*",
        "[[]XPASS(strict)[]] stale entry for a model that exports fine now; remove it from the list "
        "(upstream: https://github.com/huggingface/transformers/issues/12345)",
    ])
    # the sweep summary counts outcomes per backend and variant
    result.stdout.fnmatch_lines([
        "*= export sweep =*",
        "    dynamo dynamic      1 items: 1 passed",
        "    dynamo static       1 items: 1 failed",
        "executorch dynamic      1 items: 1 passed",
        "executorch static       1 items: 1 passed",
        "      onnx dynamic      1 items: 1 xfailed",
        "      onnx static       1 items: 1 passed",
    ])


def test_bad_export_skip_entry_stops_collection_naming_the_entry(sweep_project):
    sweep_project.makeconftest('''
pytest_plugins = ["sweeps.plugin"]

import skips.export_skips
from skips import ExportSkip

skips.export_skips.EXPORT_SKIPS = (
    ExportSkip(classes=("BertModle",), reason="router loops over experts with a data-dependent count"),
)
''')
    sweep_project.makepyfile(test_export=SKIP_TEST)
    result = sweep_project.runpytest_subprocess("--model", "BertModel", "-p", "no:cacheprovider")
    assert result.ret in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.USAGE_ERROR), result.stdout.str()[-2000:]
    result.stdout.fnmatch_lines([
        "*skip list error: EXPORT_SKIPS[[]0[]] (BertModle): unknown model class 'BertModle'*BertModel*",
    ])
    outcomes = result.parseoutcomes()
    assert not outcomes.get("passed") and not outcomes.get("failed")


# ── --resume ──────────────────────────────────────────────────────────────────────────────────


def _resume_config(logs):
    deselected = []

    class Hook:
        def pytest_deselected(self, items):
            deselected.extend(items)

    config = type("Config", (), {"option": type("Option", (), {"resume": logs})(), "hook": Hook()})()
    return config, deselected


def test_resume_leaves_out_items_with_a_result_and_keeps_the_one_the_run_stopped_in(tmp_path):
    import json

    def report(nodeid, when, outcome):
        return json.dumps({"$report_type": "TestReport", "nodeid": nodeid, "when": when, "outcome": outcome,
                           "longrepr": None, "user_properties": [], "duration": 0.1})

    log = tmp_path / "stopped.jsonl"
    log.write_text("\n".join([
        report("t[a]", "setup", "passed"), report("t[a]", "call", "passed"), report("t[a]", "teardown", "passed"),
        report("t[b]", "setup", "passed"), report("t[b]", "call", "failed"), report("t[b]", "teardown", "passed"),
        report("t[c]", "setup", "passed"),   # stopped in c: no verdict, c runs again
    ]) + "\n")
    items = [type("Item", (), {"nodeid": n})() for n in ("t[a]", "t[b]", "t[c]", "t[d]")]
    config, deselected = _resume_config([str(log)])
    plugin._leave_out_resumed(config, items)
    assert [i.nodeid for i in items] == ["t[c]", "t[d]"]
    assert [i.nodeid for i in deselected] == ["t[a]", "t[b]"]


def test_resume_names_a_missing_log(tmp_path):
    config, _ = _resume_config([str(tmp_path / "nope.jsonl")])
    with pytest.raises(pytest.UsageError, match="--resume .*nope.jsonl"):
        plugin._leave_out_resumed(config, [])
