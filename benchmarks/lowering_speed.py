"""ExecuTorch lowering speed: ours (speed-ups on) vs the bare upstream call, and the byte-identity check.

    python benchmarks/lowering_speed.py [--repeat 3] [--models llama,bert,vit | smoke] [--variants static,dynamic]
        [--no-off] [--json out.json]

For each model x variant it times, round-robin (so machine noise hits all alike):
  ours : ExecutorchExporter().export(model, inputs, config), the default registry (speed-ups on)
  off  : the same with every patch of SPEED_UPS switched off (``DEFAULT_REGISTRY.without``)
  bare : torch.export.export + to_edge_transform_and_lower(XnnpackPartitioner) + to_executorch +
         loading the program (benchmarks/export_overhead.py's bare_export)
and prints the medians, ours/bare and off/bare. ``--models smoke`` takes the sweep's SMOKE_CLASSES; a
class that one of the three cannot export (bare has none of our workarounds) is printed with the
error and left out of that ratio. The summary gives the median of the per-row ratios and the ratio of
the summed medians over the rows where both sides exported. Every ``ours`` and ``off`` export's ``.pte`` is kept
and compared: "identical" when every one of them has the same bytes. Where they differ the artifacts
are run on the traced inputs and their outputs compared exactly, and one more export each way with
every XNNPACK node's debug handle written as 0 says whether the handles are all that differs. A debug
handle is profiling metadata (ETDump's key back to the graph node, grouped by each node's oldest
``from_node`` ancestor); no kernel reads it. The speed patches that skip a re-trace change that
provenance chain, so a program may differ there and nowhere else.
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

from benchmarks.export_overhead import MODELS, bare_export  # noqa: E402

# the registered speed-only patches: each skips work that does not change the program (see its docstring)
SPEED_UPS = (
    "patch:executorch:torch.fx.traceback.NodeSource.__init__",
    "patch:executorch:executorch.backends.xnnpack._passes.XNNPACKPassManager.transform",
    "patch:executorch:executorch.exir.program._program._replace_aten_ops_with_transformed_ops",
    "patch:executorch:executorch.exir.passes.normalize_transpose_pass.NormalizeTransposePass.call",
    "patch:executorch:executorch.exir.passes.replace_broken_ops_with_function_ops_pass.ReplaceBrokenOpsWithFunctionalOpsPass.call",
    "patch:executorch:executorch.exir.passes.scalar_to_tensor_pass.ScalarToTensorPass.call",
    "patch:executorch:executorch.exir.passes.sym_to_tensor_pass.SymToTensorPass.call",
    "patch:executorch:executorch.exir.passes.legalize_portable_dim_order_pass.LegalizePortableDimOrderPass.call",
)


def _outputs_equal(a, b, inputs) -> str:
    """'exact' when both artifacts return bit-equal outputs on ``inputs``, else what differs."""
    import torch

    from exporters.utils import flatten_outputs

    out_a, out_b = flatten_outputs(a(**inputs)), flatten_outputs(b(**inputs))
    if list(out_a) != list(out_b):
        return f"outputs {list(out_a)} vs {list(out_b)}"
    for name, x in out_a.items():
        y = out_b[name]
        if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
            return f"output {name} differs"
    return f"exact ({len(out_a)} outputs)"


@contextlib.contextmanager
def xnnpack_debug_handles_zeroed():
    """XNNPACK delegate blobs serialized with every node's debug handle 0 (the benchmark's check only)."""
    import executorch.backends.xnnpack.serialization.xnnpack_graph_serialize as serialize

    original = serialize.convert_to_flatbuffer

    def convert(graph):
        for node in graph.xnodes:
            node.debug_handle = 0
        return original(graph)

    serialize.convert_to_flatbuffer = convert
    try:
        yield
    finally:
        serialize.convert_to_flatbuffer = original


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--models", default="llama,bert,vit")
    parser.add_argument("--variants", default="static,dynamic")
    parser.add_argument("--no-off", action="store_true", help="skip the speed-ups-off runs (no byte check)")
    parser.add_argument("--no-bare", action="store_true", help="skip the bare upstream runs")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    import torch

    from exporters import get_exporter
    from exporters.utils import DEFAULT_REGISTRY
    from sweeps.runner import reference

    torch.set_num_threads(1)
    on = get_exporter("executorch")
    off = get_exporter("executorch", registry=DEFAULT_REGISTRY.without(*SPEED_UPS))
    rows = []
    keys = args.models.split(",")
    if keys == ["smoke"]:
        from sweeps.plugin import SMOKE_CLASSES

        keys = list(SMOKE_CLASSES)
    for key in keys:
        tiny = reference(MODELS.get(key, key)).tiny
        for variant in args.variants.split(","):
            config = on.config_class(dynamic=variant == "dynamic")
            artifacts: dict[str, list] = {"ours": [], "off": []}

            def run(label, exporter):
                artifact = exporter.export(tiny.model, tiny.inputs, config)
                artifacts[label].append(artifact)

            runners = {"ours": lambda: run("ours", on)}
            if not args.no_off:
                runners["off"] = lambda: run("off", off)
            if not args.no_bare:
                runners["bare"] = lambda: bare_export("executorch", tiny.model, tiny.inputs, config.dynamic, config.max_dim)
            errors = {}
            for k, fn in list(runners.items()):  # warm-up (imports, first-call caches, XNNPACK's pattern graphs)
                try:
                    fn()
                except Exception as e:  # noqa: BLE001 - reported in the row, the rest still runs
                    errors[k] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
                    del runners[k]
            if "ours" not in runners:
                row = {"model": key, "variant": variant, "errors": errors}
                rows.append(row)
                print(_fmt(row), flush=True)
                continue
            times: dict[str, list[float]] = {k: [] for k in runners}
            for i in range(args.repeat):
                order = list(runners) if i % 2 == 0 else list(reversed(runners))
                for k in order:
                    t = time.perf_counter()
                    runners[k]()
                    times[k].append(time.perf_counter() - t)
            row = {"model": key, "variant": variant, **{k: statistics.median(v) for k, v in times.items()},
                   "times": times, "errors": errors}
            for k in ("ours", "off"):
                if k in row and "bare" in row:
                    row[f"{k}/bare"] = row[k] / row["bare"]
            fired = set(artifacts["ours"][0].workarounds_fired)
            row["speed-ups fired"] = sum(name in fired for name in SPEED_UPS)
            if artifacts["off"]:
                buffers = {bytes(a.buffer) for a in artifacts["ours"] + artifacts["off"]}
                row["pte"] = "identical" if len(buffers) == 1 else f"{len(buffers)} distinct"
                if len(buffers) > 1:
                    row["outputs"] = _outputs_equal(artifacts["ours"][0], artifacts["off"][0], tiny.inputs)
                    with xnnpack_debug_handles_zeroed():
                        zeroed = {bytes(e.export(tiny.model, tiny.inputs, config).buffer) for e in (on, off)}
                    row["pte"] += (", identical but for XNNPACK debug handles" if len(zeroed) == 1
                                   else ", still distinct with debug handles zeroed")
            rows.append(row)
            print(_fmt(row), flush=True)
    for k in ("ours/bare", "off/bare"):
        ratios = [r[k] for r in rows if k in r]
        if ratios:
            num, den = k.split("/")
            both = [r for r in rows if k in r]
            summed = sum(r[num] for r in both) / sum(r[den] for r in both)
            print(f"median {k} over {len(ratios)} rows = {statistics.median(ratios):.3f}; "
                  f"summed {num} / summed {den} = {summed:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


def _fmt(row):
    cols = [f"{row['model']:>6} {row['variant']:>7}"]
    if "ours" not in row:
        return "  ".join(cols + [f"{k} failed: {v}" for k, v in row["errors"].items()])
    for k in ("ours", "off", "bare"):
        if k in row:
            cols.append(f"{k} {row[k]:6.2f}s")
    for k in ("ours/bare", "off/bare"):
        if k in row:
            cols.append(f"{k} {row[k]:.2f}")
    cols.append(f"speed-ups fired {row['speed-ups fired']}/{len(SPEED_UPS)}")
    cols += [f"{k} failed: {v}" for k, v in row.get("errors", {}).items()]
    if "pte" in row:
        cols.append(f".pte on/off: {row['pte']}")
    if "outputs" in row:
        cols.append(f"outputs: {row['outputs']}")
    return "  ".join(cols)


if __name__ == "__main__":
    main()
