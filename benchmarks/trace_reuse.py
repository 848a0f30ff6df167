"""One torch.export trace shared by a class's exports on dynamo, onnx and executorch (exporters.shared_traces):
what it saves, and that every program is the same.

    python benchmarks/trace_reuse.py [--models smoke | llama,bert,...] [--variants static,dynamic] [--repeat 2]
        [--json out.json]

For each model x variant and each repeat it exports the model on the three backends in sweep order
(dynamo, onnx, executorch), once with every export tracing itself ("alone") and once inside
``shared_traces()`` ("shared"), alternating which goes first. It prints per row the summed export seconds
of the three backends (median over repeats), shared/alone, how many of the three exports took the kept
trace (one at most: only the dynamo export keeps its trace, and the first lowering export takes it
away; see exporters/trace_reuse.py), and whether every program is byte-identical between the two (the .pte, the serialized ONNX
model, the dynamo graph's code); where bytes differ, whether the outputs at the traced inputs are
bit-equal. One warm-up round (imports, first-call caches) is not timed. Two more columns say what one
reuse saves at most, without the noise of whole exports: ``trace s``, the dynamo trace alone
(``exporters.tracing.trace``), and ``copy s``, one deep copy of its program (each export that shares a
trace makes one).
"""

from __future__ import annotations

import argparse
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

from benchmarks.export_overhead import MODELS  # noqa: E402
from benchmarks.lowering_speed import _outputs_equal  # noqa: E402

BACKENDS = ("dynamo", "onnx", "executorch")


def program_bytes(artifact) -> bytes:
    if artifact.backend == "executorch":
        return bytes(artifact.buffer)
    if artifact.backend == "onnx":
        return artifact.model_proto.SerializeToString()
    return artifact.program.graph_module.code.encode()


def export_all(tiny, variant: str, shared: bool) -> dict:
    """The three exports, in sweep order; per backend: seconds, artifact, whether it took a kept trace."""
    from exporters import get_exporter, shared_traces

    out = {}
    with shared_traces() if shared else contextlib.nullcontext() as store:
        for backend in BACKENDS:
            exporter = get_exporter(backend)
            config = exporter.config_class(dynamic=variant == "dynamic")
            hits = store.hits if store is not None else 0
            start = time.perf_counter()
            artifact = exporter.export(tiny.model, tiny.inputs, config)
            seconds = time.perf_counter() - start
            out[backend] = (seconds, artifact, (store.hits - hits) if store is not None else 0)
    return out


def trace_and_copy_seconds(tiny, variant: str) -> tuple[float, float]:
    import copy

    from exporters import DynamoConfig
    from exporters.tracing import trace
    from exporters.utils import DEFAULT_REGISTRY, FiredLog, split_quantization_patches

    patches, _ = split_quantization_patches(DEFAULT_REGISTRY.patches("dynamo"))
    start = time.perf_counter()
    traced = trace(tiny.model, tiny.inputs, DynamoConfig(dynamic=variant == "dynamic"), patches, FiredLog(),
                   build_module=False)
    middle = time.perf_counter()
    copy.deepcopy(traced.program)
    return middle - start, time.perf_counter() - middle


def ab_arguments(doc: str, models: str, variants: str, smoke: str) -> tuple[argparse.Namespace, list[str]]:
    """The options of an alone-vs-shared benchmark (this one, generate_trace_reuse.py) and its models:
    ``--models smoke`` names sweeps.plugin's list ``smoke``. Runs torch on one thread, as the timings assume."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--models", default=models)
    parser.add_argument("--variants", default=variants)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import torch

    from sweeps import plugin

    torch.set_num_threads(1)
    names = args.models.split(",")
    return args, list(getattr(plugin, smoke)) if names == ["smoke"] else names


def interleaved(run, repeat: int):
    """``run(shared)`` once to warm up, then ``repeat`` rounds of both, alternating which goes first;
    yields each round's ``{"alone": result, "shared": result}``."""
    run(False)
    for i in range(repeat):
        order = ("alone", "shared") if i % 2 == 0 else ("shared", "alone")
        yield {mode: run(mode == "shared") for mode in order}


def _same(a, b, inputs) -> str:
    if program_bytes(a) == program_bytes(b):
        return "identical"
    outputs = _outputs_equal(a, b, inputs)
    return "bytes differ, outputs exact" if outputs.startswith("exact") else f"bytes differ, OUTPUTS DIFFER ({outputs})"


def main() -> int:
    args, keys = ab_arguments(__doc__, "llama,bert,vit", "static,dynamic", "SMOKE_CLASSES")

    from sweeps.runner import reference

    rows = []
    print(f"{'model':42s} {'variant':8s} {'alone s':>8s} {'shared s':>9s} {'ratio':>6s} {'reused':>6s} {'trace s':>8s} "
          f"{'copy s':>7s}  programs")
    for key in keys:
        name = MODELS.get(key, key)
        tiny = reference(name).tiny
        for variant in args.variants.split(","):
            times = {"alone": [], "shared": [], "trace": [], "copy": []}
            verdicts, reused, error = [], 0, None
            try:
                for runs in interleaved(lambda shared: export_all(tiny, variant, shared), args.repeat):
                    for mode in runs:
                        times[mode].append(sum(s for s, _, _ in runs[mode].values()))
                    reused = sum(r for _, _, r in runs["shared"].values())
                    trace_s, copy_s = trace_and_copy_seconds(tiny, variant)
                    times["trace"].append(trace_s)
                    times["copy"].append(copy_s)
                    verdicts += [f"{b}: {_same(runs['alone'][b][1], runs['shared'][b][1], tiny.inputs)}" for b in BACKENDS]
            except Exception as exc:  # noqa: BLE001 - reported in the row
                error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            row = {"model": name, "variant": variant, "error": error}
            if error is None:
                alone, shared = statistics.median(times["alone"]), statistics.median(times["shared"])
                bad = sorted({v for v in verdicts if not v.endswith("identical")})
                trace_s, copy_s = statistics.median(times["trace"]), statistics.median(times["copy"])
                row.update(alone_s=round(alone, 3), shared_s=round(shared, 3), ratio=round(shared / alone, 3),
                           reused=reused, trace_s=round(trace_s, 3), copy_s=round(copy_s, 4),
                           programs="identical" if not bad else "; ".join(bad))
                print(f"{name:42s} {variant:8s} {alone:8.2f} {shared:9.2f} {shared / alone:6.3f} {reused:6d} "
                      f"{trace_s:8.3f} {copy_s:7.3f}  {row['programs']}", flush=True)
            else:
                print(f"{name:42s} {variant:8s} {error}", flush=True)
            rows.append(row)
    done = [r for r in rows if r["error"] is None]
    if done:
        alone, shared = sum(r["alone_s"] for r in done), sum(r["shared_s"] for r in done)
        avoided = sum(r["reused"] * r["trace_s"] - (r["reused"] + 1) * r["copy_s"] for r in done)
        print(f"\n{len(done)} rows: summed alone {alone:.1f} s, shared {shared:.1f} s, saved {alone - shared:.1f} s "
              f"({1 - shared / alone:.1%}); median ratio {statistics.median(r['ratio'] for r in done):.3f}; "
              f"programs identical in {sum(r['programs'] == 'identical' for r in done)} of {len(done)} rows; "
              f"traces avoided less copies made: {avoided:.1f} s ({avoided / alone:.1%} of alone)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["error"] is None and "OUTPUTS DIFFER" not in r["programs"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
