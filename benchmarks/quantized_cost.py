"""The cost of a quantized export against the fp32 one, in one process, each twice.

    python benchmarks/quantized_cost.py [--backend onnx] CLASS [CLASS ...]
    python benchmarks/quantized_cost.py --from-log results/ci/smoke.jsonl


For each class: the zoo's tiny model exported statically as fp32, int8 (the sweep's recipe, calibrated on
its inputs), fp32 again and int8 again, interleaved; prints the seconds of each and whether the stage-0
pattern-graph patch (exporters/workarounds/quantization/pattern_graphs.py) reused its graphs. The first
export of a process pays the imports; the second int8 export is what a sweep worker pays per item.

``--from-log``: the issue's measure instead, item against item in one run's report log: each class's
``test_quantized[<backend>-int8-C]`` call time over its ``test_export[<backend>-static-C]`` call time, and
the median per backend (the default ``pytest`` runs both for the quantized smoke set).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("classes", nargs="*")
    parser.add_argument("--from-log", help="a report log holding test_quantized and test_export static items")
    parser.add_argument("--backend", default="onnx", choices=("dynamo", "onnx", "executorch"))
    args = parser.parse_args()
    if args.from_log:
        return from_log(args.from_log)
    if not args.classes:
        parser.error("name classes, or --from-log")

    from exporters import get_exporter
    from exporters.quantization import int8
    from sweeps.runner import reference

    exporter = get_exporter(args.backend)
    for cls in args.classes:
        ref = reference(cls)
        model, inputs = ref.tiny.model, ref.tiny.inputs
        for label, extra in [("fp32", {}), ("int8", {"quantization": int8(calibration=[inputs])})] * 2:
            start = time.perf_counter()
            artifact = exporter.export(model, inputs, exporter.config_class(dynamic=False, **extra))
            reused = any("pattern" in n for n in artifact.workarounds_fired)
            print(f"{cls} {args.backend} {label} {time.perf_counter() - start:.2f}s"
                  + (f" pattern graphs reused: {reused}" if label == "int8" else ""), flush=True)


def from_log(path: str) -> None:
    import json
    import statistics

    calls = {}
    for line in open(path, encoding="utf-8"):
        report = json.loads(line)
        name = report.get("nodeid", "").split("::")[-1]
        if report.get("$report_type") == "TestReport" and report.get("when") == "call" and "[" in name:
            test, item = name.split("[", 1)
            calls[(test, item.rstrip("]"))] = report["duration"]
    for backend in ("onnx", "executorch"):
        ratios = []
        for (test, item), seconds in sorted(calls.items()):
            if test != "test_quantized" or not item.startswith(f"{backend}-int8-"):
                continue
            cls = item.split("-", 2)[2]
            fp32 = calls.get(("test_export", f"{backend}-static-{cls}"))
            if fp32:
                ratios.append(seconds / fp32)
                print(f"{backend} {cls}: int8 {seconds:.2f} s, fp32 {fp32:.2f} s, {seconds / fp32:.2f}x")
        if ratios:
            print(f"{backend}: median {statistics.median(ratios):.2f}x over {len(ratios)} classes (target 1.5x)")


if __name__ == "__main__":
    main()
