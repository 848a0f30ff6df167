"""Wall time of each graph pass of one ExecuTorch export, without a profiler's overhead.

    python benchmarks/pass_times.py ViTForImageClassification [--dynamic]

Exports the class once to warm up, then once timed: every outermost ``PassBase.__call__`` (the edge
passes, XNNPACK's per-partition passes, ``to_executorch``'s) is timed by pass class, and every
``ExportedProgram.run_decompositions``. Prints the export's total and the passes by total seconds.
cProfile (benchmarks/lowering_profile.py) inflates code that makes many small calls; this does not.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--dynamic", action="store_true")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)

    import torch
    import torch.export.exported_program as exported_program
    from torch.fx.passes.infra.pass_base import PassBase

    from exporters import get_exporter
    from sweeps.runner import reference

    torch.set_num_threads(1)
    seconds, calls, depth = collections.Counter(), collections.Counter(), [0]

    def timed(original, label_of):
        def wrapper(self, *a, **k):
            depth[0] += 1
            start = time.perf_counter()
            try:
                return original(self, *a, **k)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    seconds[label_of(self)] += time.perf_counter() - start
                    calls[label_of(self)] += 1
        return wrapper

    PassBase.__call__ = timed(PassBase.__call__, lambda p: type(p).__name__)
    exported_program.ExportedProgram.run_decompositions = timed(
        exported_program.ExportedProgram.run_decompositions, lambda _: "run_decompositions")

    tiny = reference(args.model).tiny
    exporter = get_exporter("executorch")
    config = exporter.config_class(dynamic=args.dynamic)
    exporter.export(tiny.model, tiny.inputs, config)
    seconds.clear()
    calls.clear()
    start = time.perf_counter()
    exporter.export(tiny.model, tiny.inputs, config)
    print(f"{args.model} {'dynamic' if args.dynamic else 'static'}: export {time.perf_counter() - start:.2f} s")
    for label, s in seconds.most_common(args.top):
        print(f"{s:7.3f} s {calls[label]:4d} x {label}")


if __name__ == "__main__":
    main()
