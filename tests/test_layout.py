"""The library's layout stays what README's "Layout" section says: workarounds live in the folders named
by what they patch, the registry finds them itself in an order no import changes, and modules stay small.
(import-linter's contracts in pyproject.toml check the import graph; .ci/run runs them.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from exporters import utils

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 600
# modules allowed past MAX_LINES, each with why: data tables only
DATA_TABLES: dict[str, str] = {
    "skips/export_skips.py": "EXPORT_SKIPS: one ExportSkip entry per cause (classes, scope, reason), data only",
}


def _python_files():
    for top in ("exporters", "sweeps", "skips", "benchmarks", "tests"):
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                if name.endswith(".py"):
                    yield os.path.relpath(os.path.join(folder, name), ROOT)


def test_no_module_past_the_line_limit():
    long = {}
    for path in _python_files():
        with open(os.path.join(ROOT, path), encoding="utf-8") as handle:
            count = sum(1 for _ in handle)
        if count > MAX_LINES and path not in DATA_TABLES:
            long[path] = count
    assert not long, f"modules over {MAX_LINES} lines (split them by concern, or list a data table): {long}"


def test_every_registered_workaround_lives_in_a_workaround_folder():
    """A workaround registered from anywhere else (a spine, the core) would be found only by whoever
    imports that module; the folders are what the registry loads."""
    outside = []
    for entry in utils.DEFAULT_REGISTRY.all_workarounds():
        fn = entry.factory if isinstance(entry, utils.PatchEntry) else entry.fn
        if not fn.__module__.startswith(tuple(p + "." for p in utils.WORKAROUND_PACKAGES)):
            outside.append(f"{entry.name} ({fn.__module__})")
    assert not outside, outside


def test_every_workaround_module_registers_something():
    """A module in a workaround folder is a workaround; a helper module is named ``_*.py`` (and so not
    loaded as one). The ONNX tables' modules count: their entries are what the ONNX stages install."""
    from exporters.exporter_onnx import _IR_FIXES, _ONNX_COMPLEX_TRANSLATION_TABLE, _ONNX_TRANSLATION_TABLE

    owners = {(e.factory if isinstance(e, utils.PatchEntry) else e.fn).__module__
              for e in utils.DEFAULT_REGISTRY.all_workarounds()}
    owners |= {fn.__module__ for fn in (*_ONNX_TRANSLATION_TABLE.values(), *_ONNX_COMPLEX_TRANSLATION_TABLE.values(),
                                        *_IR_FIXES)}
    idle = [m for m in utils.workaround_modules() if m not in owners]
    assert not idle, f"modules in a workaround folder that register nothing (name helpers _*.py): {idle}"


def test_a_workaround_folder_file_is_found_without_any_import(tmp_path):
    """A registry with packages loads every non-underscore module in them on first read, and only then."""
    package = tmp_path / "probe_workarounds"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "_helper.py").write_text("raise AssertionError('a helper module is not loaded')\n")
    (package / "late.py").write_text(
        "from exporters.utils import register_patch\n"
        "from probe_workarounds import registry_under_test as reg\n"
        "@register_patch('onnx', 'torch.where', registry=reg)\n"
        "def _patch_b(original):\n    return original\n"
        "@register_patch('dynamo', 'torch.nn.functional.relu', registry=reg)\n"
        "def _patch_a(original):\n    return original\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import probe_workarounds

        registry = utils.Registry(("probe_workarounds",))
        probe_workarounds.registry_under_test = registry
        assert "probe_workarounds.late" not in sys.modules  # nothing loaded before the first read
        assert [e.name for e in registry.patches("dynamo", "onnx")] == [
            "patch:dynamo:torch.nn.functional.relu", "patch:onnx:torch.where"]
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("probe_workarounds")]:
            del sys.modules[name]


_ORDER = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
from exporters.utils import DEFAULT_REGISTRY, BACKENDS
print(json.dumps({b: [e.name for e in DEFAULT_REGISTRY.patches(b)] + [e.name for k in ("program", "node")
                      for e in (DEFAULT_REGISTRY.fixes(b, k) if b != "dynamo" else [])] for b in BACKENDS}))
"""


def _registry_order(*first_imports: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _ORDER, *first_imports], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_registry_order_does_not_depend_on_what_was_imported_first():
    """Node fixes run in registry order; that order must not follow import history (a test or a spine
    importing one workaround module before the registry loads the rest)."""
    plain = _registry_order()
    shuffled = _registry_order("exporters.workarounds.executorch.missing_kernels",
                               "exporters.exporter_onnx", "exporters.workarounds.torch_internals.value_range_memo",
                               "exporters.workarounds.models.reformer")
    assert plain == shuffled
    assert plain["executorch"] and plain["onnx"] and plain["dynamo"]
