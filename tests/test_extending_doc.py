"""docs/extending.md stays true: its examples run, its stage reference matches the sources, every
registry, table, workaround, file and folder it names exists, and it names every workaround module.

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

import exporters.executorch.lowering as lowering
import exporters.exporter_dynamo as dyn
import exporters.exporter_executorch as et
import exporters.exporter_onnx as onx
import exporters.model_state as model_state
import exporters.pytrees as pytrees
import exporters.tracing as tracing
import exporters.utils as utils
from exporters.inventory import list_workarounds

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
    "WORKAROUND_PACKAGES": (utils, tuple),
    "LOWERING_RETRIES": (lowering, tuple),
    "LoweringRetry": (lowering, None),
}


@pytest.mark.parametrize("name", sorted(NAMED))
def test_named_registry_exists_in_code_and_guide(name):
    module, kind = NAMED[name]
    assert f"`{name}" in _guide(), f"the guide does not name {name}"
    assert hasattr(module, name), f"{module.__name__} has no {name} (renamed? update docs/extending.md)"
    value = getattr(module, name)
    assert isinstance(value, kind) if kind else callable(value)


def _defined_in_guide(text: str) -> set[str]:
    """Functions the guide's own code blocks define (its examples), which exist only there."""
    return set(re.findall(r"^\s*def (\w+)", "\n".join(re.findall(r"^```py(?:thon)?\n(.*?)^```", text, re.M | re.S)), re.M))


def _library_namespace() -> set[str]:
    """Every name defined by a workaround module, a helper module of the workaround folders, the three
    spines and the core modules whose entries the guide names."""
    import importlib
    import pkgutil

    modules = [dyn, onx, et, utils, pytrees, model_state, tracing, lowering]
    for package in utils.WORKAROUND_PACKAGES:  # helpers (``_*.py``) too: the guide may name theirs
        folder = importlib.import_module(package)
        modules += [importlib.import_module(f"{package}.{m.name}") for m in pkgutil.iter_modules(folder.__path__)]
    return {name for module in modules for name in vars(module)}


def test_every_backticked_private_name_in_guide_exists():
    """``_patch_*``, ``_fix_*``, ``_aten_*`` names the guide gives in backticks are shipped, unless the
    guide's own examples define them."""
    text = _guide()
    named = set(re.findall(r"`(_(?:patch|fix|aten)_\w+)`", text))
    named |= {"_fix_ir_topk_sorted", "_patch_classifier_cast", "_patch_experts_batched_mm"}
    missing = named - _defined_in_guide(text) - _library_namespace()
    assert not missing, f"docs/extending.md names workarounds that no module defines: {sorted(missing)}"


# workaround names the guide gives in prose for an example's fresh Registry(), not the default one
EXAMPLE_WORKAROUND_NAMES: set[str] = set()


def test_every_workaround_name_in_guide_is_registered():
    """``patch:…``, ``fix:…``, ``translation:…`` names in backticks (``*`` patterns aside) are in the
    inventory: a registered patch or fix, a table entry or an export-loop retry."""
    names = set(re.findall(r"`((?:patch|fix|translation):(?:dynamo|onnx|executorch):[^`*\s]+)`", _guide()))
    registered = {w["name"] for w in list_workarounds()}
    missing = names - registered - EXAMPLE_WORKAROUND_NAMES
    assert not missing, f"docs/extending.md names workarounds that are not registered: {sorted(missing)}"


# folders the guide announces before they exist (generation- and quantization-only workarounds)
PLANNED_FOLDERS = {"exporters/generation/", "exporters/quantization/"}


def test_every_path_in_guide_exists():
    """Every ``exporters/…/`` folder and every backticked ``….py`` file the guide names exists (a bare
    file name somewhere in the repository); placeholders such as ``<family>.py`` aside."""
    text = _guide()
    folders = set(re.findall(r"(?<![\w/])(exporters/(?:[\w]+/)+)", text))
    missing = sorted(f for f in folders - PLANNED_FOLDERS if not os.path.isdir(os.path.join(ROOT, f)))
    files = {f for f in re.findall(r"`([\w./]+\.py)`", text)}
    basenames = {name for top in ("exporters", "skips", "sweeps", "tests", "benchmarks")
                 for _, _, names in os.walk(os.path.join(ROOT, top)) for name in names}
    for f in sorted(files):
        found = os.path.isfile(os.path.join(ROOT, f)) if "/" in f else f in basenames
        if not found:
            missing.append(f)
    assert not missing, f"docs/extending.md names paths that do not exist: {missing}"
    for folder in PLANNED_FOLDERS:
        assert folder in text, f"the guide no longer announces {folder}: drop it from PLANNED_FOLDERS"


def test_guide_names_every_workaround_folder_and_module():
    """The four folders the default registry loads are named, and so is every workaround module in them
    (by file name): a new module needs its line in the guide's stage reference."""
    text = _guide()
    for package in utils.WORKAROUND_PACKAGES:
        folder = package.replace(".", "/") + "/"
        assert f"`{folder}" in text, f"docs/extending.md does not name the workaround folder {folder}"
    unnamed = [m for m in utils.workaround_modules() if not re.search(rf"[`/]{m.rsplit('.', 1)[1]}\.py`", text)]
    assert not unnamed, f"docs/extending.md does not name these workaround modules: {unnamed}"


def test_guide_grep_for_onnx_workarounds_is_the_documented_one():
    assert 'grep -rnE "^def (_patch_|_fix_|_aten_)" exporters/workarounds/onnx/' in _guide()


@pytest.mark.parametrize("package", ["exporters.workarounds.models", "exporters.workarounds.torch_internals"])
def test_every_model_and_torch_patch_module_says_when_to_remove_it(package):
    """Each module docstring names the change (in transformers' model code, or in torch) that makes its
    patches unnecessary, in a paragraph starting "Remove when:", as the guide says."""
    import importlib

    lacking = [m for m in utils.workaround_modules((package,))
               if "\nRemove when: " not in "\n" + (importlib.import_module(m).__doc__ or "")]
    assert not lacking, f"no 'Remove when:' paragraph in the module docstring of {lacking}"


def test_prepare_functions_named_in_guide_are_registered():
    for name in re.findall(r"`(prepare_for_\w+)`", _guide()):
        if name != "prepare_for_vulkan":  # the guide's example of a new backend
            assert name in {fn.__name__ for fn in et._BACKEND_PREPARE.values()}, name
