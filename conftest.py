"""Root conftest: load the export-sweep plugin (options, markers, parametrization, lists)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytest_plugins = ["sweeps.plugin"]
