"""sweeps.plugin and sweeps/conftest.py end to end: ids, selection options, shards, usage errors, markers, patch guard.

Every end-to-end check is a real ``python -m pytest`` in a subprocess (the repository root, or a
throw-away project that loads the plugin), with a small probe plugin (``-p _sweep_probe``) that
writes what was collected and how each phase ended to a JSON file. The subprocesses are
collection-only (no model is built, nothing exported) and run a few at a time from one pool, so
the whole file costs about the slowest few collections.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sweeps import plugin

ROOT = Path(__file__).resolve().parents[1]
SWEEP_ID = re.compile(r"^sweeps/test_export\.py::test_export\[(dynamo|onnx|executorch)-(static|dynamic)-(\w+)\]$")
GENERATE_ID = re.compile(r"^sweeps/test_generate\.py::test_generate\[(dynamo|onnx|executorch)-(static|dynamic)-(\w+)\]$")
RUNNER_ID = re.compile(r"^sweeps/test_runner\.py::test_runner\[(executorch-llm|ort-genai)-(\w+)\]$")
QUANTIZED_ID = re.compile(r"^sweeps/test_quantized\.py::test_quantized\[(onnx|executorch)-(int8)-(\w+)\]$")
ALL_IDS = (SWEEP_ID, GENERATE_ID, RUNNER_ID, QUANTIZED_ID)
USAGE_ERROR = 4

PROBE = '''
"""Writes what the session collected (with markers) and every phase report to $SWEEP_PROBE_OUT."""
import json, os, sys

import pytest

_STATE = {"deselected": [], "reports": [], "modules_built": 0}


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    """After every plugin configured: how xdist will distribute (in a side file: usage errors write none)."""
    with open(os.environ["SWEEP_PROBE_OUT"] + ".configure", "w") as f:
        json.dump({"dist": config.getoption("dist", None)}, f)


def pytest_collection(session):
    import torch

    init = torch.nn.Module.__init__

    def counting(self, *args, **kwargs):
        _STATE["modules_built"] += 1
        return init(self, *args, **kwargs)

    torch.nn.Module.__init__ = counting


def pytest_deselected(items):
    _STATE["deselected"].extend(item.nodeid for item in items)


def pytest_collection_finish(session):
    _STATE["items"] = [
        {"nodeid": item.nodeid,
         "marks": sorted({m.name for m in item.iter_markers()}),
         "xfail": [{"reason": m.kwargs.get("reason"), "strict": m.kwargs.get("strict")}
                   for m in item.iter_markers("xfail")]}
        for item in session.items
    ]
    _STATE["modules"] = {
        "onnxruntime": "onnxruntime" in sys.modules,
        "executorch": any(m == "executorch" or m.startswith("executorch.") for m in sys.modules),
        "modeling": sorted(m for m in sys.modules
                           if m.startswith("transformers.models.") and ".modeling_" in m
                           and not m.startswith("transformers.models.auto.")),
    }
    _STATE["modules_built_at_collection"] = _STATE["modules_built"]


def pytest_runtest_logreport(report):
    _STATE["reports"].append({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                              "text": report.longreprtext})


def pytest_sessionfinish(session, exitstatus):
    with open(os.environ["SWEEP_PROBE_OUT"], "w") as f:
        json.dump(_STATE, f)
'''


@dataclasses.dataclass
class Run:
    args: tuple[str, ...]
    rc: int
    output: str
    probe: dict | None  # None when the session never started (usage error before collection)
    configured: dict | None = None  # what the probe saw once every plugin was configured

    @property
    def items(self) -> list[str]:
        return [i["nodeid"] for i in self.probe["items"]]

    def sweep_ids(self) -> list[tuple[str, str, str]]:
        return [SWEEP_ID.match(n).groups() for n in self.items if SWEEP_ID.match(n)]

    def generate_ids(self) -> list[tuple[str, str, str]]:
        return [GENERATE_ID.match(n).groups() for n in self.items if GENERATE_ID.match(n)]

    def runner_ids(self) -> list[tuple[str, str]]:
        return [RUNNER_ID.match(n).groups() for n in self.items if RUNNER_ID.match(n)]

    def quantized_ids(self) -> list[tuple[str, str, str]]:
        return [QUANTIZED_ID.match(n).groups() for n in self.items if QUANTIZED_ID.match(n)]

    def outcome(self, nodeid_part: str, when: str) -> dict:
        (report,) = [r for r in self.probe["reports"] if nodeid_part in r["nodeid"] and r["when"] == when]
        return report


def _pytest(args, *, cwd, probe_dir, out_name, extra_path=()):
    out = probe_dir / f"{out_name}.json"
    env = dict(os.environ, SWEEP_PROBE_OUT=str(out), HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(probe_dir), str(ROOT), *map(str, extra_path)]))
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "_sweep_probe", "-p", "no:cacheprovider", "-q", *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    probe = json.loads(out.read_text()) if out.exists() else None
    configured = Path(f"{out}.configure")
    configured = json.loads(configured.read_text()) if configured.exists() else None
    return Run(tuple(args), proc.returncode, proc.stdout + proc.stderr, probe, configured)


# ── a throw-away project whose tests use the sweep fixtures (for the patch guard) ─────────────

LEAK_CONFTEST = '''
pytest_plugins = ["sweeps.plugin", "sweeps.conftest"]

from exporters.utils import register_patch


@register_patch("dynamo", "leak_targets.Child.method")
def _patch_inherited(original):
    return lambda self: "patched"
'''

LEAK_TARGETS = '''
class Base:
    def method(self):
        return "base"


class Child(Base):  # inherits method: the registered target is not in Child.__dict__
    pass
'''

LEAK_TESTS = '''
import leak_targets
from exporters.utils import DEFAULT_REGISTRY, resolve_path

NLLB = "transformers.models.nllb_moe.modeling_nllb_moe.NllbMoeTop2Router._cast_classifier"
OWNER, NAME = resolve_path(NLLB)
ORIGINAL = OWNER.__dict__[NAME]
ONNX = {}


def test_a_leak(sweep_case, export_patches, record_property):
    record_property("backend", sweep_case.backend)
    record_property("variant", sweep_case.variant)
    if sweep_case.backend == "dynamo":
        setattr(OWNER, NAME, lambda self, *args, **kwargs: None)
    else:  # the first onnx item of the process: run_case imports the onnx exporter lazily, like this
        import exporters.exporter_onnx  # noqa: F401 - registers the onnx patches
        path = DEFAULT_REGISTRY.patches("onnx")[0].path
        owner, name = resolve_path(path)
        ONNX.update(path=path, owner=owner, name=name, original=getattr(owner, name))
        print("ONNX TARGET", path)
        setattr(owner, name, lambda *args, **kwargs: None)


def test_b_leak_inherited(sweep_case, export_patches, record_property):
    record_property("backend", sweep_case.backend)
    record_property("variant", sweep_case.variant)
    if sweep_case.backend == "dynamo":
        leak_targets.Child.method = lambda self: "leaked"


def test_c_clean(sweep_case, export_patches):
    pass


def test_d_restored(sweep_case):
    if sweep_case.backend == "dynamo":
        assert OWNER.__dict__[NAME] is ORIGINAL
    else:
        assert getattr(ONNX["owner"], ONNX["name"]) is ONNX["original"], ONNX["path"]


def test_e_inherited_restored(sweep_case):
    if sweep_case.backend == "dynamo":
        assert "method" not in vars(leak_targets.Child), vars(leak_targets.Child).get("method")
        assert leak_targets.Child().method() == "base"
'''


def _leak_project(base: Path) -> Path:
    project = base / "leakproj"
    project.mkdir()
    (project / "conftest.py").write_text(LEAK_CONFTEST)
    (project / "leak_targets.py").write_text(LEAK_TARGETS)
    (project / "test_leak.py").write_text(LEAK_TESTS)
    return project


# ── all subprocess runs, started together on first use ───────────────────────────────────────

SHARDS = 2
# comma-separated and repeated --model, --backend and --variant: together, every backend and variant
SHARD_MODELS = ("--model", "llama,bert", "--model", "nllb_moe", "--backend", "dynamo,onnx", "--backend", "executorch",
                "--variant", "static", "--variant", "dynamic")

RUNS = {
    "full": ["sweeps", "--collect-only"],
    "nllb_executorch": ["--collect-only", "--backend=executorch", "--model=nllb_moe"],
    "plain": ["--collect-only"],
    "combo": ["sweeps/test_export.py", "--collect-only", "--model", "BertModel,GPT2Model", "--backend", "onnx",
              "--variant", "dynamic"],
    **{f"shard_{i}": ["sweeps/test_export.py", "--collect-only", *SHARD_MODELS, f"--shard={i}/{SHARDS}"]
       for i in range(1, SHARDS + 1)},
    "markers": ["-n", "2", "--markers"],  # -n: how xdist would distribute; --markers starts no worker
    "bad_backend": ["sweeps/test_export.py", "--collect-only", "--backend", "dynamo,onx"],
    "bad_variant": ["sweeps/test_export.py", "--collect-only", "--variant", "dynamc"],
    "bad_model": ["sweeps/test_export.py", "--collect-only", "--model", "lama_x"],
    **{f"bad_shard_{k}": ["sweeps/test_export.py", "--collect-only", f"--shard={v}"]
       for k, v in enumerate(("0/3", "two/3"))},
    "leak": ["test_leak.py", "-rA", "-s", "--model", "BertModel", "--backend", "dynamo,onnx", "--variant", "static"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, request):
    base = tmp_path_factory.mktemp("sweep_plugin")
    probe_dir = base / "probe"
    probe_dir.mkdir()
    (probe_dir / "_sweep_probe.py").write_text(PROBE)
    leak_project = _leak_project(base)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=3)
    futures = {}

    def start(name):
        if name not in futures:
            if name == "leak":
                futures[name] = pool.submit(_pytest, RUNS[name], cwd=leak_project, probe_dir=probe_dir,
                                            out_name=name, extra_path=(leak_project,))
            else:
                futures[name] = pool.submit(_pytest, RUNS[name], cwd=ROOT, probe_dir=probe_dir, out_name=name)
        return futures[name]

    # The whole module in one process: start every run now, the slowest first, so the pool's tail is
    # short. Under xdist (tests spread over workers) or for a few selected tests: only the runs read.
    selected = sum(1 for item in request.session.items if getattr(item, "module", None) is request.module)
    if not os.environ.get("PYTEST_XDIST_WORKER") and selected >= 20:
        for name in sorted(RUNS, key=lambda n: (n not in ("plain", "nllb_executorch", "full"), n)):
            start(name)

    class Results:
        def __getitem__(self, name) -> Run:
            return start(name).result()

    yield Results()
    pool.shutdown(wait=True)


# ── ids and selection ──────────────────────────────────────────────────────────────────────────


def test_full_sweep_collects_every_catalog_class_on_every_backend_and_variant(runs):
    from sweeps.zoo import catalog

    run = runs["full"]
    assert run.rc == 0, run.output[-3000:]
    classes = {e.class_name for e in catalog()}
    assert 1500 <= len(classes) <= 1600
    bad = [n for n in run.items if not any(p.match(n) for p in ALL_IDS)]
    assert not bad, bad[:5]
    ids = run.sweep_ids()
    assert len(ids) == len(set(ids)) == 6 * len(classes)
    assert {c for _, _, c in ids} == classes
    # test_generate: every generative class, on each backend, in both cache variants
    from sweeps.plugin import generative

    generating = {e.class_name for e in catalog() if generative(e)}
    gen = run.generate_ids()
    assert 300 <= len(generating) <= 400
    assert len(gen) == len(set(gen)) == 6 * len(generating) and {c for _, _, c in gen} == generating
    # test_runner: every class of the causal-LM mapping, on both runners
    decoders = {e.class_name for e in catalog() if "causal_lm" in e.tasks}
    runners = run.runner_ids()
    assert 150 <= len(decoders) <= len(generating)
    assert len(runners) == len(set(runners)) == 2 * len(decoders) and {c for _, c in runners} == decoders
    # test_quantized: every class, on onnx and executorch, with each recipe (static shapes)
    from sweeps.runner import QUANTIZED_BACKENDS, RECIPES

    quantized = run.quantized_ids()
    assert sorted({b for b, _, _ in quantized}) == sorted(QUANTIZED_BACKENDS) and {r for _, r, _ in quantized} == set(RECIPES)
    assert len(quantized) == len(set(quantized)) == len(QUANTIZED_BACKENDS) * len(RECIPES) * len(classes)
    assert {c for _, _, c in quantized} == classes
    total = 6 * len(classes) + 6 * len(generating) + 2 * len(decoders) + len(quantized)
    assert f"{total} tests collected" in run.output


def test_full_sweep_collection_imports_no_runtime_and_builds_no_model(runs):
    run = runs["full"]
    modules = run.probe["modules"]
    assert modules["onnxruntime"] is False
    assert modules["executorch"] is False
    assert modules["modeling"] == []  # no modeling module imported: no model class even looked at
    assert run.probe["modules_built_at_collection"] == 0


def _expected_xfail(class_name: str, backend: str, variant: str, test: str, blocked: dict[str, str]) -> list[dict]:
    """The strict xfail an item should carry: its skip entry's (which wins) or its blocked build's, or none."""
    from skips import find_export_skip, marker_reason

    entry = find_export_skip(class_name, None, backend, variant, test=test)
    if entry is not None:
        return [{"reason": marker_reason(entry), "strict": True}]
    if class_name in blocked:
        return [{"reason": f"build: {blocked[class_name]}", "strict": True}]
    return []


def test_sweep_items_carry_backend_group_and_slow_markers(runs):
    from sweeps.zoo import catalog

    blocked = {e.class_name: e.blocked_by for e in catalog() if e.blocked_by}
    for item in runs["full"].probe["items"]:
        if QUANTIZED_ID.match(item["nodeid"]):
            backend, _, class_name = QUANTIZED_ID.match(item["nodeid"]).groups()
            assert "quantized" in item["marks"] and backend in item["marks"], item
            assert ("slow" in item["marks"]) == (backend == "executorch"), item
            assert item["xfail"] == _expected_xfail(class_name, backend, "static", "quantized", blocked), item
            continue
        if RUNNER_ID.match(item["nodeid"]):
            runtime, class_name = RUNNER_ID.match(item["nodeid"]).groups()
            backend = {"executorch-llm": "executorch", "ort-genai": "onnx"}[runtime]
            assert "runner" in item["marks"] and backend in item["marks"], item
            assert ("slow" in item["marks"]) == (backend == "executorch"), item
            continue
        if GENERATE_ID.match(item["nodeid"]):
            backend, variant, class_name = GENERATE_ID.match(item["nodeid"]).groups()
            assert "generate" in item["marks"] and backend in item["marks"], item
            assert ("slow" in item["marks"]) == (backend == "executorch"), item
            assert item["xfail"] == _expected_xfail(class_name, backend, variant, "generate", blocked), item
            continue
        backend, variant, class_name = SWEEP_ID.match(item["nodeid"]).groups()
        marks = set(item["marks"])
        assert backend in marks and not ({"dynamo", "onnx", "executorch"} - {backend}) & marks, item
        assert "xdist_group" in marks
        assert ("slow" in marks) == (backend == "executorch"), item
        assert ("smoke" in marks) == (class_name in plugin.SMOKE_CLASSES), item
        assert item["xfail"] == _expected_xfail(class_name, backend, variant, "export", blocked), item


def test_items_are_ordered_class_by_class(runs):
    """Six items per class, adjacent (items of a class share the class's tiny model in a process)."""
    classes = [c for _, _, c in runs["full"].sweep_ids()]
    seen, previous = set(), None
    for c in classes:
        if c != previous:
            assert c not in seen, f"{c} items are not adjacent"
            seen.add(c)
            previous = c


def test_id_format_example(runs):
    assert "sweeps/test_export.py::test_export[onnx-dynamic-NllbMoeForConditionalGeneration]" in runs["full"].items


def test_backend_and_model_select_exactly_those_items_and_deselect_the_unit_tests(runs):
    from sweeps.zoo import resolve_models

    run = runs["nllb_executorch"]
    assert run.rc == 0, run.output[-3000:]
    nllb = {e.class_name for e in resolve_models(["nllb_moe"])}
    assert "NllbMoeForConditionalGeneration" in nllb
    assert sorted(run.sweep_ids()) == sorted(("executorch", v, c) for c in nllb for v in ("static", "dynamic"))
    assert sorted(run.generate_ids()) == [("executorch", v, "NllbMoeForConditionalGeneration")  # the one that generates
                                          for v in ("dynamic", "static")]
    assert sorted(run.quantized_ids()) == sorted(("executorch", "int8", c) for c in nllb)
    assert len(run.items) == 2 * len(nllb) + 2 + len(nllb)  # nothing but the sweep items
    deselected = run.probe["deselected"]
    assert deselected, "the unit tests should be collected, then deselected"
    # and test_runner's "empty parameter set" item (nllb_moe has no decoder LM)
    stray = [d for d in deselected if not d.startswith("tests/") and d != "sweeps/test_runner.py::test_runner[NOTSET]"]
    assert not stray, stray
    assert f"({len(deselected)} deselected)" in run.output


def test_one_backend_one_variant_and_comma_separated_models(runs):
    run = runs["combo"]
    assert run.rc == 0, run.output[-3000:]
    assert sorted(run.sweep_ids()) == [("onnx", "dynamic", "BertModel"), ("onnx", "dynamic", "GPT2Model")]
    assert len(run.items) == 2


# ── shards ────────────────────────────────────────────────────────────────────────────────────


def test_shards_are_disjoint_cover_the_selection_and_keep_classes_together(runs):
    """Also checks comma-separated and repeated --model/--backend/--variant (the shard runs use both)."""
    from sweeps.zoo import resolve_models

    classes = {e.class_name for e in resolve_models(["llama", "bert", "nllb_moe"])}
    assert len(classes) >= 10
    everything = {f"sweeps/test_export.py::test_export[{b}-{v}-{c}]"
                  for c in classes for b in plugin.BACKENDS for v in plugin.VARIANTS}
    shards = []
    for i in range(1, SHARDS + 1):
        run = runs[f"shard_{i}"]
        assert run.rc == 0, run.output[-3000:]
        assert run.items, f"shard {i}/{SHARDS} is empty"
        shards.append(set(run.items))
    assert set().union(*shards) == everything
    assert sum(len(s) for s in shards) == len(everything)  # disjoint
    owner = {}
    for i, shard in enumerate(shards):
        for nodeid in shard:
            class_name = SWEEP_ID.match(nodeid).group(3)
            assert owner.setdefault(class_name, i) == i, f"{class_name} is split across shards"
    assert max(len(s) for s in shards) - min(len(s) for s in shards) <= 6  # balanced by class


@pytest.mark.parametrize("k", range(2))
def test_bad_shard_is_a_usage_error(runs, k):
    run = runs[f"bad_shard_{k}"]
    assert run.rc == USAGE_ERROR, run.output[-2000:]
    assert "--shard" in run.output
    assert run.probe is None and run.configured is None  # configure failed: nothing collected, nothing ran


# ── usage errors ──────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("name, unknown, close", [
    ("bad_backend", "--backend 'onx'", "did you mean onnx"),
    ("bad_variant", "--variant 'dynamc'", "did you mean dynamic"),
])
def test_unknown_backend_or_variant_is_a_usage_error_with_close_matches(runs, name, unknown, close):
    run = runs[name]
    assert run.rc == USAGE_ERROR, run.output[-2000:]
    assert f"unknown {unknown}" in run.output
    assert close in run.output
    assert run.probe is None
    assert "collected" not in run.output and "passed" not in run.output


def test_unknown_model_is_a_usage_error_listing_close_names(runs):
    run = runs["bad_model"]
    assert run.rc == USAGE_ERROR, run.output[-2000:]
    assert "'lama_x'" in run.output
    assert "llama" in run.output.split("'lama_x'", 1)[1]
    assert run.probe is None
    assert "collected" not in run.output and "passed" not in run.output


# ── plain pytest: unit tests plus the smoke set; markers ────────────────────────────────────────


def test_plain_pytest_collects_unit_tests_and_the_smoke_set_only(runs):
    run = runs["plain"]
    assert run.rc == 0, run.output[-3000:]
    sweep = [i for i in run.probe["items"] if SWEEP_ID.match(i["nodeid"])]
    generate = [i for i in run.probe["items"] if GENERATE_ID.match(i["nodeid"])]
    runner = [i for i in run.probe["items"] if RUNNER_ID.match(i["nodeid"])]
    quantized = [i for i in run.probe["items"] if QUANTIZED_ID.match(i["nodeid"])]
    others = [i for i in run.probe["items"] if not any(p.match(i["nodeid"]) for p in ALL_IDS)]
    assert {SWEEP_ID.match(i["nodeid"]).group(3) for i in sweep} == set(plugin.SMOKE_CLASSES)
    assert len(sweep) == 6 * len(plugin.SMOKE_CLASSES)
    assert {GENERATE_ID.match(i["nodeid"]).group(3) for i in generate} == set(plugin.SMOKE_GENERATE)
    assert len(generate) == 6 * len(plugin.SMOKE_GENERATE)
    assert {RUNNER_ID.match(i["nodeid"]).group(2) for i in runner} == set(plugin.SMOKE_RUNNER)
    assert len(runner) == 2 * len(plugin.SMOKE_RUNNER)
    assert {QUANTIZED_ID.match(i["nodeid"]).group(3) for i in quantized} == set(plugin.SMOKE_QUANTIZED)
    assert len(quantized) == 2 * len(plugin.SMOKE_QUANTIZED)  # onnx and executorch, int8
    assert all("smoke" in i["marks"] for i in sweep + generate + runner + quantized)
    assert others and all(i["nodeid"].startswith("tests/") for i in others)
    assert not any("smoke" in i["marks"] for i in others)
    assert "tests/test_sweep_plugin.py::test_parse_shard_accepts_i_of_n" in run.items
    assert run.probe["deselected"] == []


def test_markers_are_registered_with_help_text(runs):
    run = runs["markers"]
    assert run.rc == 0, run.output[-2000:]
    for name in ("dynamo", "onnx", "executorch", "smoke", "slow"):
        (line,) = [ln for ln in run.output.splitlines() if ln.startswith(f"@pytest.mark.{name}:")]
        assert len(line.split(":", 1)[1].strip()) > 10, line


def test_xdist_keeps_the_dist_mode_under_n_and_schedules_by_class_itself(runs):
    run = runs["markers"]
    assert run.configured is not None, run.output[-2000:]
    assert run.configured["dist"] == "load"  # the scheduler is the plugin's (pytest_xdist_make_scheduler)


GROUP_TESTS = '''
import os

import pytest

IDS = [f"{b}-{v}-{c}" for c in ("Alpha", "Beta", "Gamma", "Delta") for b in ("dynamo", "onnx") for v in ("static", "dynamic")]


@pytest.mark.parametrize("case", IDS, ids=IDS)
def test_item(case):
    with open(os.environ["GROUP_OUT"], "a") as f:
        f.write(f"{case} {os.environ['PYTEST_XDIST_WORKER']}\\n")
'''


def test_under_n_every_item_of_a_class_runs_on_one_worker(tmp_path):
    """The items of a class share its tiny model and traces only on one worker (sweeps/plugin.py,
    _group_by_class_under_xdist): run 16 items of 4 classes under -n 2 and read where each ran."""
    from sweeps.plugin import model_class_scope

    assert model_class_scope("sweeps/test_export.py::test_export[onnx-dynamic-LlamaForCausalLM]") == "LlamaForCausalLM"
    assert model_class_scope("sweeps/test_runner.py::test_runner[ort-genai-Qwen2ForCausalLM]") == "Qwen2ForCausalLM"
    assert model_class_scope("tests/test_a.py::test_b[x]") == "tests/test_a.py::test_b[x]"
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["sweeps.plugin"]\n')
    (tmp_path / "test_group.py").write_text(GROUP_TESTS)
    out = tmp_path / "where.txt"
    env = dict(os.environ, GROUP_OUT=str(out), HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q", "test_group.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    workers: dict[str, set[str]] = {}
    for line in out.read_text().splitlines():
        case, worker = line.split()
        workers.setdefault(case.rsplit("-", 1)[1], set()).add(worker)
    assert sorted(workers) == ["Alpha", "Beta", "Delta", "Gamma"]
    assert all(len(w) == 1 for w in workers.values()), workers
    assert len(set().union(*workers.values())) == 2  # and the classes spread over both workers


# ── the patch-leak guard (sweeps/conftest.py::export_patches) ─────────────────────────────────


NLLB_TARGET = "transformers.models.nllb_moe.modeling_nllb_moe.NllbMoeTop2Router._cast_classifier"


def test_leaked_patch_fails_the_item_naming_the_target(runs):
    run = runs["leak"]
    assert run.probe is not None, run.output[-3000:]
    report = run.outcome("test_a_leak[dynamo-static-BertModel]", "teardown")
    assert report["outcome"] == "failed", run.output[-3000:]
    assert f"patches not restored after dynamo-static-BertModel: {NLLB_TARGET}" in report["text"]
    assert run.outcome("test_a_leak[dynamo-static-BertModel]", "call")["outcome"] == "passed"


def test_leaked_patch_is_restored_for_the_next_item(runs):
    run = runs["leak"]
    report = run.outcome("test_d_restored[dynamo-static-BertModel]", "call")
    assert report["outcome"] == "passed", report["text"]


def test_guard_passes_an_item_that_leaks_nothing(runs):
    run = runs["leak"]
    for backend in ("dynamo", "onnx"):
        for when in ("setup", "call", "teardown"):
            report = run.outcome(f"test_c_clean[{backend}-static-BertModel]", when)
            assert report["outcome"] == "passed", report["text"]


def test_guard_covers_the_first_onnx_item_of_a_process(runs):
    run = runs["leak"]
    report = run.outcome("test_a_leak[onnx-static-BertModel]", "teardown")
    assert report["outcome"] == "failed" and "patches not restored" in report["text"]


def test_sweep_summary_counts_leak_guard_errors(runs):
    run = runs["leak"]
    section = run.output.split("export sweep", 1)[1]
    (line,) = [ln for ln in section.splitlines() if "dynamo static" in ln]
    assert "error" in line, line


def test_leaked_inherited_target_is_restored_by_deleting_it(runs):
    run = runs["leak"]
    leak = run.outcome("test_b_leak_inherited[dynamo-static-BertModel]", "teardown")
    assert leak["outcome"] == "failed" and "leak_targets.Child.method" in leak["text"]
    report = run.outcome("test_e_inherited_restored[dynamo-static-BertModel]", "call")
    assert report["outcome"] == "passed", report["text"]
