"""The workaround inventory lists every name an exporter can record as fired, so the report never
calls a real workaround "not in the registered list"."""

import re
from pathlib import Path

from exporters import exporter_executorch
from exporters.inventory import list_workarounds

SOURCE = Path(exporter_executorch.__file__).read_text(encoding="utf-8")


def test_every_retry_the_export_loop_records_is_listed():
    literals = set(re.findall(r'"(fix:executorch:[a-z_]+)"', SOURCE))
    listed = {row["name"]: row for row in list_workarounds()}
    missing = sorted(name for name in literals if name not in listed)
    assert not missing, f"recorded as fired but not in the inventory: {missing}"
    for name in exporter_executorch.LOWERING_RETRIES:
        assert listed[name]["stage"] == "export loop: retries" and listed[name]["doc"]


def test_no_stale_retry_names():
    for name in exporter_executorch.LOWERING_RETRIES:
        # once as the key, at least once where the export loop records it
        assert SOURCE.count(f'"{name}"') > 1, f"{name} is listed in LOWERING_RETRIES but the export loop never records it"
