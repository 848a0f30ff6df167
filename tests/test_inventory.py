"""The workaround inventory lists every name an exporter can record as fired, so the report never
calls a real workaround "not in the registered list"."""

import re
from pathlib import Path

from exporters import exporter_executorch
from exporters.inventory import list_workarounds

SOURCE = Path(exporter_executorch.__file__).read_text(encoding="utf-8")


def test_every_retry_the_export_loop_records_is_listed():
    literals = set(re.findall(r'"(fix:executorch:[a-z_]+)"', SOURCE))
    # bound_unbacked_sizes_by_trace returns its names from an f-string: by_source or by_trace
    assert 'f"fix:executorch:bound_unbacked_sizes_by_{' in SOURCE
    literals |= {"fix:executorch:bound_unbacked_sizes_by_source", "fix:executorch:bound_unbacked_sizes_by_trace"}
    listed = {row["name"]: row for row in list_workarounds()}
    missing = sorted(name for name in literals if name not in listed)
    assert not missing, f"recorded as fired but not in the inventory: {missing}"
    for name in exporter_executorch.LOWERING_RETRIES:
        assert listed[name]["stage"] == "export loop: retries" and listed[name]["doc"]


def test_no_stale_retry_names():
    for name in exporter_executorch.LOWERING_RETRIES:
        stem = name.rsplit("_by_", 1)[0] + "_by_{" if name.startswith("fix:executorch:bound_unbacked") else None
        used = SOURCE.count(f'"{name}"') > 1 or (stem is not None and f'f"{stem}' in SOURCE)
        assert used, f"{name} is listed in LOWERING_RETRIES but the export loop never records it"
