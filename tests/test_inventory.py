"""The workaround inventory lists every name an exporter can record as fired, so the report never
calls a real workaround "not in the registered list"."""

import re
from pathlib import Path

from exporters import exporter_executorch
from exporters.executorch import lowering
from exporters.inventory import list_workarounds

# the ExecuTorch spine and its backend package: where the export loop and its retries record names
SOURCES = [Path(exporter_executorch.__file__), *sorted(Path(lowering.__file__).parent.glob("*.py"))]
SOURCE = "\n".join(path.read_text(encoding="utf-8") for path in SOURCES)


def test_every_retry_the_export_loop_records_is_listed():
    literals = set(re.findall(r'"(fix:executorch:[a-z_]+)"', SOURCE))
    listed = {row["name"]: row for row in list_workarounds()}
    missing = sorted(name for name in literals if name not in listed)
    assert not missing, f"recorded as fired but not in the inventory: {missing}"
    for name in lowering.retry_fixes():
        assert listed[name]["stage"] == "export loop: retries" and listed[name]["doc"]


def test_no_stale_retry_names():
    for name in lowering.retry_fixes():
        # once in its LoweringRetry record, at least once where the export loop records it
        assert SOURCE.count(f'"{name}"') > 1, f"{name} is listed in LOWERING_RETRIES but the export loop never records it"


def test_every_error_retry_names_what_starts_it():
    """A retry started by a lowering error says which (type and message) and what it changes."""
    for retry in exporter_executorch.LOWERING_RETRIES:
        assert retry.fixes and retry.trigger
        if retry.error is not None:
            assert retry.message and retry.change is not None
            assert retry.starts_on(retry.error(f"... {retry.message} ...")) and not retry.starts_on(retry.error("other"))
