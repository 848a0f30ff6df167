"""docs/extending.md stays true: its examples run, its stage reference matches the sources, and
every registry or table it names exists.

Each ```python block runs in a fresh module (registered in sys.modules, so ``f"{__name__}.Class.m"``
patch paths resolve); the blocks register into their own ``Registry()``, and this test checks that
the default registry and the ONNX tables are unchanged afterwards.
"""

from __future__ import annotations

import os
import re
import sys
import types

import pytest

import exporters.exporter_dynamo as dyn
import exporters.exporter_executorch as et
import exporters.exporter_onnx as onx
import exporters.utils as utils

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDE = os.path.join(ROOT, "docs", "extending.md")
SOURCES = {
    "DynamoExporter": "exporters/exporter_dynamo.py",
    "OnnxExporter": "exporters/exporter_onnx.py",
    "ExecutorchExporter": "exporters/exporter_executorch.py",
}


def _guide() -> str:
    with open(GUIDE, encoding="utf-8") as handle:
        return handle.read()


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(line number, code)`` of every ```python block (```py blocks are not run)."""
    blocks = []
    for match in re.finditer(r"^```python\n(.*?)^```\s*$", text, re.M | re.S):
        blocks.append((text.count("\n", 0, match.start()) + 2, match.group(1)))
    return blocks


def guide_stages(text: str) -> dict[str, list[tuple[int, str]]]:
    """``{source path: [(number, name)]}`` from the guide's stage reference."""
    section = text.split("## Stage reference", 1)[1].split("\n## ", 1)[0]
    stages: dict[str, list[tuple[int, str]]] = {}
    current = None
    for line in section.splitlines():
        header = re.match(r"^### (\w+Exporter) \(`(exporters/[\w.]+)`\)", line)
        if header:
            assert SOURCES[header.group(1)] == header.group(2), line
            current = header.group(2)
            stages[current] = []
            continue
        item = re.match(r"^(\d+)\. \*\*(.+?)\*\*:", line)
        if item and current:
            stages[current].append((int(item.group(1)), item.group(2).strip()))
    return stages


def source_stages(path: str) -> list[tuple[int, str]]:
    with open(os.path.join(ROOT, path), encoding="utf-8") as handle:
        text = handle.read()
    return [(int(n), name.strip()) for n, name in re.findall(r"^# ── Stage (\d+): (.+?) ─+\s*$", text, re.M)]


BLOCKS = python_blocks(_guide())


def test_guide_has_examples():
    assert len(BLOCKS) >= 6


@pytest.fixture
def untouched():
    before = [e.name for e in utils.DEFAULT_REGISTRY.all_workarounds()]
    table, fixes = dict(onx._ONNX_TRANSLATION_TABLE), onx._IR_FIXES
    yield
    assert [e.name for e in utils.DEFAULT_REGISTRY.all_workarounds()] == before, "an example leaked a workaround"
    assert onx._ONNX_TRANSLATION_TABLE == table and onx._IR_FIXES is fixes, "an example left an ONNX table changed"


@pytest.mark.parametrize("line,code", BLOCKS, ids=[f"line{line}" for line, _ in BLOCKS])
def test_example_runs(line, code, untouched):
    name = f"extending_doc_line{line}"
    module = types.ModuleType(name)
    module.__file__ = GUIDE
    sys.modules[name] = module
    try:
        exec(compile(code, f"{GUIDE}:{line}", "exec"), module.__dict__)
    finally:
        del sys.modules[name]


@pytest.mark.parametrize("exporter", sorted(SOURCES))
def test_stage_reference_matches_source_blocks(exporter):
    path = SOURCES[exporter]
    in_guide = guide_stages(_guide()).get(path)
    in_source = source_stages(path)
    assert in_source, f"no '# ── Stage N: … ──' blocks in {path}"
    assert in_guide == in_source, f"docs/extending.md stage reference for {path} differs from the source blocks"


def test_stage_reference_covers_three_exporters():
    assert set(guide_stages(_guide())) == set(SOURCES.values())


NAMED = {
    "_ONNX_TRANSLATION_TABLE": (onx, dict),
    "_IR_FIXES": (onx, tuple),
    "_BACKEND_PREPARE": (et, dict),
    "_STATEFUL_CACHE_ATTRS": (dyn, tuple),
    "_flatten_to_context": (dyn, None),
    "_unflatten_from_context": (dyn, None),
    "register_patch": (utils, None),
    "register_fx_node_fix": (utils, None),
    "register_fx_program_fix": (utils, None),
}


@pytest.mark.parametrize("name", sorted(NAMED))
def test_named_registry_exists_in_code_and_guide(name):
    module, kind = NAMED[name]
    assert f"`{name}" in _guide(), f"the guide does not name {name}"
    assert hasattr(module, name), f"{module.__name__} has no {name} (renamed? update docs/extending.md)"
    value = getattr(module, name)
    assert isinstance(value, kind) if kind else callable(value)


def test_every_backticked_private_name_in_guide_exists():
    """``_patch_*``, ``_fix_*``, ``_aten_*`` names the guide presents as shipped must exist."""
    text = _guide()
    shipped = set(re.findall(r"shipped[^.]*?`(_\w+)`", text, re.S | re.I))
    shipped |= {"_fix_ir_topk_sorted", "_patch_classifier_cast", "_patch_experts_batched_mm"}
    everywhere = set(vars(dyn)) | set(vars(onx)) | set(vars(et))
    assert shipped <= everywhere, sorted(shipped - everywhere)


def test_prepare_functions_named_in_guide_are_registered():
    for name in re.findall(r"`(prepare_for_\w+)`", _guide()):
        if name != "prepare_for_vulkan":  # the guide's example of a new backend
            assert name in {fn.__name__ for fn in et._BACKEND_PREPARE.values()}, name
