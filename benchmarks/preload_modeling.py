"""pytest plugin for the memory benchmark: import every selected class's modeling module up front.

    pytest sweeps ... -p benchmarks.preload_modeling

With the imports done before the first item, the RSS a worker gains from item 50 to item 500 is
what the items themselves leave behind, not the hundreds of modeling modules a sweep imports on
the way (``benchmarks/throughput.py --memory-run N --preload`` compares the two).
"""

from __future__ import annotations


def pytest_collection_finish(session):
    import transformers

    classes = sorted({item.callspec.params["sweep_case"].entry.class_name for item in session.items
                      if "sweep_case" in getattr(getattr(item, "callspec", None), "params", {})})
    failed = []
    for name in classes:
        try:
            getattr(transformers, name)
        except Exception:  # noqa: BLE001 - the item itself reports the import error
            failed.append(name)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"preload_modeling: imported the modules of {len(classes) - len(failed)} classes"
                            + (f" ({len(failed)} failed to import)" if failed else ""))
