"""CPU time a lowering spends in ``ShapeEnv._check_frozen`` with torch's own method (the cost
exporters/workarounds/torch_internals/frozen_guards.py removes): the guards a frozen shape environment ignores, each
formatted for an INFO-only message.

CPU time (``time.process_time``), not wall time, so that a busy machine does not change the share.
``--seconds`` stops a long lowering and prints the share so far.

    python benchmarks/frozen_guard_cost.py Swinv2Model --backend executorch --seconds 300
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PATCH = "patch:dynamo:torch.fx.experimental.symbolic_shapes.ShapeEnv._check_frozen"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_class")
    parser.add_argument("--backend", choices=("onnx", "executorch"), default="executorch")
    parser.add_argument("--seconds", type=int, default=0, help="stop after this much wall time (0: run to the end)")
    args = parser.parse_args(argv)

    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    import exporters.exporter_executorch as et
    import exporters.exporter_onnx as onx
    from exporters.utils import DEFAULT_REGISTRY
    from sweeps.runner import reference

    original = ShapeEnv._check_frozen
    spent, calls = [0.0], [0]

    def timed(self, expr, concrete_val):
        start = time.process_time()
        try:
            return original(self, expr, concrete_val)
        finally:
            spent[0] += time.process_time() - start
            calls[0] += 1

    ShapeEnv._check_frozen = timed
    tiny = reference(args.model_class).tiny
    registry = DEFAULT_REGISTRY.without(PATCH)
    start = time.process_time()

    def report(label: str) -> None:
        total = time.process_time() - start
        print(f"{args.model_class} {args.backend} dynamic ({label}): CPU {total:.1f} s, in ShapeEnv._check_frozen "
              f"{spent[0]:.1f} s over {calls[0]} calls ({100 * spent[0] / max(total, 1e-9):.1f}%)", flush=True)

    if args.seconds:
        signal.signal(signal.SIGALRM, lambda *_: (report(f"stopped after {args.seconds} s"), os._exit(0)))
        signal.alarm(args.seconds)
    if args.backend == "onnx":
        onx.OnnxExporter(registry=registry).export(tiny.model, tiny.inputs, onx.OnnxConfig(dynamic=True))
    else:
        et.ExecutorchExporter(registry=registry).export(tiny.model, tiny.inputs, et.ExecutorchConfig(dynamic=True))
    report("finished")
    return 0


if __name__ == "__main__":
    sys.exit(main())
