"""The cost of a quantized export against the fp32 one, in one process, each twice.

    python benchmarks/quantized_cost.py [--backend onnx] CLASS [CLASS ...]

For each class: the zoo's tiny model exported statically as fp32, int8 (the sweep's recipe, calibrated on
its inputs), fp32 again and int8 again, interleaved; prints the seconds of each and whether the stage-0
pattern-graph patch (exporters/workarounds/quantization/pattern_graphs.py) reused its graphs. The first
export of a process pays the imports; the second int8 export is what a sweep worker pays per item.
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
    parser.add_argument("classes", nargs="+")
    parser.add_argument("--backend", default="onnx", choices=("dynamo", "onnx", "executorch"))
    args = parser.parse_args()

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


if __name__ == "__main__":
    main()
