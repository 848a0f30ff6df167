"""Export one sweep class with and without one named workaround, interleaved, and print the times.

For speed workarounds (a patch that changes how long torch takes, not whether it succeeds), e.g.:

    OMP_NUM_THREADS=1 python benchmarks/workaround_ab.py SwinModel \
        patch:dynamo:torch.fx.experimental.symbolic_shapes.ShapeEnv._maybe_evaluate_static --variant dynamic

Each round exports the class's tiny model (the sweep's, built from its config) once with the default
registry and once without the workaround, in alternating order; an export that fails prints its
error. The artifact is run on the traced inputs so a broken export shows, but parity is the sweep's job.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_class")
    parser.add_argument("workaround", help="registered name, e.g. patch:dynamo:sympy.simplify")
    parser.add_argument("--backend", default="dynamo", choices=("dynamo", "onnx", "executorch"))
    parser.add_argument("--variant", default="static", choices=("static", "dynamic"))
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)

    from exporters import get_exporter
    from exporters.utils import DEFAULT_REGISTRY
    from sweeps.runner import reference

    ref = reference(args.model_class)
    get_exporter(args.backend)  # imports the backend's module, which registers its workarounds
    registries = {"with": DEFAULT_REGISTRY, "without": DEFAULT_REGISTRY.without(args.workaround)}
    times: dict[str, list[float]] = {"with": [], "without": []}
    for round_ in range(args.repeat):
        for label in (("with", "without") if round_ % 2 == 0 else ("without", "with")):
            exporter = get_exporter(args.backend, registry=registries[label])
            start = time.perf_counter()
            try:
                artifact = exporter.export(ref.tiny.model, ref.tiny.inputs, exporter.config_class(dynamic=args.variant == "dynamic"))
                artifact(**ref.tiny.inputs)
            except Exception as exc:  # noqa: BLE001 - reported, the other side still runs
                print(f"{label}: {type(exc).__name__}: {str(exc)[:300]}")
                continue
            times[label].append(time.perf_counter() - start)
            fired = args.workaround in artifact.workarounds_fired
            print(f"{label}: {times[label][-1]:.1f} s (workaround fired: {fired})", flush=True)
    for label, values in times.items():
        if values:
            print(f"{args.model_class} {args.backend} {args.variant} {label}: median {statistics.median(values):.1f} s over {len(values)}")


if __name__ == "__main__":
    main()
