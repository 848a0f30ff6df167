"""The stage layout the spec documents, checked against the exporter sources, and the stage tables.

SPEC.md's "Stage reference" is parsed for the stage names, so the spec and the sources stay in step.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

import exporters.exporter_executorch as et
import exporters.exporter_onnx as onx
from exporters.utils import DEFAULT_REGISTRY, resolve_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = os.environ.get("EXPORTERS_SPEC", "/work/shared/SPEC.md")
FILES = {
    "DynamoExporter": "exporters/exporter_dynamo.py",
    "OnnxExporter": "exporters/exporter_onnx.py",
    "ExecutorchExporter": "exporters/exporter_executorch.py",
}
_STOP = {"a", "an", "the", "and", "of", "for", "to", "in", "fx"}


def _spec_stages() -> dict[str, list[str]]:
    if not os.path.exists(SPEC):
        pytest.skip(f"spec not found at {SPEC}")
    text = open(SPEC, encoding="utf-8").read()
    section = text.split("**Stage reference.**", 1)[1].split("**Known upstream workarounds.**", 1)[0]
    stages: dict[str, list[str]] = {}
    current = None
    for line in section.splitlines():
        header = re.match(r"^(\w+Exporter) \(`(exporters/[\w.]+)`\)", line)
        if header:
            current = header.group(2)
            stages[current] = []
            continue
        item = re.match(r"^(\d)\. ([^:]+):", line)
        if item and current:
            assert int(item.group(1)) == len(stages[current]) + 1, f"spec numbering in {current}"
            stages[current].append(item.group(2).strip())
    return stages


def _source_stages(path: str) -> list[tuple[int, str]]:
    text = open(os.path.join(ROOT, path), encoding="utf-8").read()
    return [(int(n), name.strip()) for n, name in re.findall(r"^# ── Stage (\d+): (.+?) ─+\s*$", text, re.M)]


def _keywords(name: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", name.lower()) if w not in _STOP}


def test_spec_names_five_stages_for_each_exporter():
    stages = _spec_stages()
    assert set(stages) == set(FILES.values())
    for path, names in stages.items():
        assert len(names) == 5, (path, names)


@pytest.mark.parametrize("path", sorted(FILES.values()))
def test_stage_blocks_numbered_in_order_with_spec_names(path):
    spec_names = _spec_stages()[path]
    found = _source_stages(path)
    assert [n for n, _ in found] == [1, 2, 3, 4, 5], f"{path}: stage blocks {found}"
    for (n, name), expected in zip(found, spec_names):
        assert _keywords(expected) <= _keywords(name) or _keywords(name) <= _keywords(expected), (
            f"{path} stage {n} is {name!r}, the spec calls it {expected!r}"
        )


ONNX_WORKAROUNDS = "exporters/workarounds/onnx"  # the ONNX workarounds' home (they were in exporters/exporter_onnx.py)


def _grep_onnx_workarounds() -> set[str]:
    out = subprocess.run(
        ["grep", "-rnE", "^def (_patch_|_fix_|_aten_)", ONNX_WORKAROUNDS],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout
    return {m.group(1) for m in re.finditer(r"^[^:]+:\d+:def (\w+)\(", out, re.M)}


def test_onnx_grep_lists_every_registered_onnx_workaround():
    listed = _grep_onnx_workarounds()
    registered = set()
    for entry in DEFAULT_REGISTRY.patches("onnx"):
        registered.add(entry.factory)
    for kind in ("node", "program"):
        registered.update(e.fn for e in DEFAULT_REGISTRY.fixes("onnx", kind))
    registered.update(onx._IR_FIXES)
    registered.update(onx._ONNX_TRANSLATION_TABLE.values())
    package = ONNX_WORKAROUNDS.replace("/", ".") + "."
    in_this_file = {f.__name__ for f in registered if (getattr(f, "__module__", None) or "").startswith(package)}
    assert in_this_file, f"no ONNX workaround registered from {ONNX_WORKAROUNDS}/"
    assert in_this_file <= listed, f"not found by the spec's grep: {sorted(in_this_file - listed)}"


def test_onnx_stage_tables_exist():
    assert isinstance(onx._ONNX_TRANSLATION_TABLE, dict)
    for key, fn in onx._ONNX_TRANSLATION_TABLE.items():
        assert fn.__name__.startswith("_aten_"), key
    assert isinstance(onx._IR_FIXES, tuple) and onx._IR_FIXES
    for fix in onx._IR_FIXES:
        assert fix.__name__.startswith("_fix_ir_")


def test_every_default_onnx_and_executorch_patch_resolves():
    for entry in DEFAULT_REGISTRY.patches(*("dynamo", "onnx", "executorch")):
        if not entry.optional:
            resolve_path(entry.path)


def test_executorch_backend_prepare_table():
    assert {"xnnpack", "cuda"} <= set(et._BACKEND_PREPARE)
    for name, fn in et._BACKEND_PREPARE.items():
        assert fn.__name__ == f"prepare_for_{name}"
