"""What ``torch.onnx.export`` spends building its registry of onnxscript functions, with and without
exporters/workarounds/onnx/torchlib_registry.py, in one warm process (after one whole ONNX export).

    python benchmarks/onnx_registry_cost.py [--repeat 5]

Each round times ``ONNXRegistry.from_torchlib()`` (what every ``torch.onnx.export`` calls) once as torch
ships it and once with the patch installed, alternately, and prints both, then the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from torch.onnx._internal.exporter import _registration

    from exporters import get_exporter
    from exporters.utils import DEFAULT_REGISTRY, apply_patches
    from sweeps.runner import reference

    ref = reference("BertForSequenceClassification")
    exporter = get_exporter("onnx")
    exporter.export(ref.tiny.model, ref.tiny.inputs, exporter.config_class(dynamic=False))  # warm: imports, caches
    (entry,) = [p for p in DEFAULT_REGISTRY.patches("onnx") if p.path.endswith("get_torchlib_ops")]
    plain, patched = [], []
    for i in range(args.repeat):
        start = time.perf_counter()
        _registration.ONNXRegistry.from_torchlib()
        plain.append(time.perf_counter() - start)
        with apply_patches([entry]):
            start = time.perf_counter()
            _registration.ONNXRegistry.from_torchlib()
            patched.append(time.perf_counter() - start)
        print(f"round {i}: torch's {plain[-1]:.3f} s, patched {patched[-1]:.3f} s")
    print(f"median: torch's {statistics.median(plain):.3f} s, patched {statistics.median(patched):.3f} s, "
          f"saved {statistics.median(plain) - statistics.median(patched):.3f} s per torch.onnx.export")


if __name__ == "__main__":
    main()
