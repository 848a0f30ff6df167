"""Generate items sharing their components' traces (exporters/trace_reuse.py): what onnx's
``export_for_generation`` saves by taking dynamo's prefill, decode and encoder traces, and that its
components are the same.

    python benchmarks/generate_trace_reuse.py [--models smoke | Class,Class] [--variants dynamic,static]
        [--repeat 2] [--json out.json]

For each class x variant and each repeat it runs the two exports a class's generate items make in sweep
order (dynamo's ``export_for_generation``, then onnx's) on the model, inputs and export config the sweep's
item uses (``sweeps.generate.build_for_generate``, the first init range), once with every component tracing
itself ("alone") and once inside ``shared_traces()`` ("shared"), alternating which goes first. It prints the
onnx export's seconds (median over repeats; dynamo's own export does not change), how many of onnx's
components took a kept trace, and whether every onnx component is byte-identical between the two (the
serialized ONNX model) and the two generators' greedy tokens are equal. One warm-up round is not timed.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

from benchmarks.trace_reuse import ab_arguments, interleaved, program_bytes  # noqa: E402


def export_pair(entry, variant: str, shared: bool) -> tuple[float, int, object, dict]:
    """dynamo's then onnx's export_for_generation as the sweep's items call them: onnx's seconds, its
    components' reused traces, its generator, and the inputs."""
    from exporters import get_exporter, shared_traces
    from sweeps.generate import GENERATE_INIT_RANGES, _loop_takes, _static_length, build_for_generate
    from sweeps.runner import Case, export_config

    result = None
    with shared_traces() if shared else contextlib.nullcontext() as store:
        for backend in ("dynamo", "onnx"):
            case = Case(backend, variant, entry, "generate")
            model, inputs, _ = build_for_generate(case, GENERATE_INIT_RANGES[0])
            exporter = get_exporter(backend)
            config, _ = export_config(case, exporter)
            prompt = inputs["input_ids"].shape[-1] if "input_ids" in inputs else 0
            kwargs = {"cache": "static", "max_cache_len": _static_length(prompt + 8)} if variant == "static" else {}
            hits = store.hits if store is not None else 0
            start = time.perf_counter()
            generator = exporter.export_for_generation(model, inputs, config, **kwargs)
            seconds = time.perf_counter() - start
            takes = {k: v for k, v in inputs.items() if k in _loop_takes(generator)}  # as the sweep's item calls it
            result = (seconds, (store.hits - hits) if store is not None else 0, generator, takes)
    return result


def main() -> int:
    args, names = ab_arguments(__doc__, "smoke", "dynamic", "SMOKE_GENERATE")

    import torch

    from sweeps.zoo import resolve_models

    rows = []
    print(f"{'model':42s} {'variant':8s} {'alone s':>8s} {'shared s':>9s} {'ratio':>6s} {'reused':>6s}  components, tokens")
    for name in names:
        (entry,) = [e for e in resolve_models([name]) if e.class_name == name]
        for variant in args.variants.split(","):
            times = {"alone": [], "shared": []}
            verdicts, reused, error = set(), 0, None
            try:
                for runs in interleaved(lambda shared: export_pair(entry, variant, shared), args.repeat):
                    for mode in runs:
                        times[mode].append(runs[mode][0])
                    reused = runs["shared"][1]
                    alone, shared = runs["alone"][2], runs["shared"][2]
                    for label, artifact in alone.components.items():
                        same = program_bytes(artifact) == program_bytes(shared.components[label])
                        verdicts.add(f"{label}: {'identical' if same else 'BYTES DIFFER'}")
                    inputs = runs["alone"][3]
                    tokens = [g.generate(**inputs, max_new_tokens=8) for g in (alone, shared)]
                    verdicts.add("tokens equal" if torch.equal(*tokens) else "TOKENS DIFFER")
            except Exception as exc:  # noqa: BLE001 - reported in the row
                error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            row = {"model": name, "variant": variant, "error": error}
            if error is None:
                alone, shared = statistics.median(times["alone"]), statistics.median(times["shared"])
                row.update(alone_s=round(alone, 3), shared_s=round(shared, 3), ratio=round(shared / alone, 3),
                           reused=reused, verdicts=sorted(verdicts))
                print(f"{name:42s} {variant:8s} {alone:8.2f} {shared:9.2f} {shared / alone:6.3f} {reused:6d}  "
                      f"{', '.join(sorted(verdicts))}", flush=True)
            else:
                print(f"{name:42s} {variant:8s} {error}", flush=True)
            rows.append(row)
    done = [r for r in rows if r["error"] is None]
    if done:
        alone, shared = sum(r["alone_s"] for r in done), sum(r["shared_s"] for r in done)
        same = sum(not any("DIFFER" in v for v in r["verdicts"]) for r in done)
        print(f"\n{len(done)} rows: onnx export_for_generation summed alone {alone:.1f} s, shared {shared:.1f} s "
              f"({1 - shared / alone:.1%} saved); median ratio {statistics.median(r['ratio'] for r in done):.3f}; "
              f"components identical and tokens equal in {same} of {len(done)} rows")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["error"] is None and not any("DIFFER" in v for v in r["verdicts"]) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
