"""Export overhead: each of our exporters against the bare torch call underneath, interleaved.

    python benchmarks/export_overhead.py [--repeat 5] [--models llama,bert,vit,t5,whisper]
        [--backends dynamo,onnx,executorch] [--variants static,dynamic] [--peer] [--json out.json]

For each model x backend x variant it times, round-robin (so machine noise hits all alike):
  ours   : exporters.<Backend>Exporter().export(model, inputs, config)  (trace + lower + load runtime)
  bare   : torch.export.export / torch.onnx.export(dynamo=True) / torch.export.export +
           to_edge_transform_and_lower(XnnpackPartitioner) + to_executorch, with the same
           dynamic shapes; plus creating the runtime session, which ours includes
  peer   : transformers.exporters (only with --peer)
and prints the median of each and the ratio ours/bare (and ours/peer). Models come from the zoo.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

MODELS = {
    "llama": "LlamaForCausalLM",
    "bert": "BertModel",
    "vit": "ViTForImageClassification",
    "t5": "T5ForConditionalGeneration",
    "whisper": "WhisperForConditionalGeneration",
}


def bare_export(backend, model, inputs, dynamic, max_dim):
    import torch

    from exporters.tracing import auto_dynamic_shapes

    tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    shapes = auto_dynamic_shapes(tensors, max_dim) if dynamic else None
    if backend == "dynamo":
        ep = torch.export.export(model, (), tensors, dynamic_shapes=shapes)
        ep.module()
        return ep
    if backend == "onnx":
        import onnxruntime as ort

        prog = torch.onnx.export(model, (), kwargs=tensors, dynamic_shapes=shapes, dynamo=True, verbose=False)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        ort.InferenceSession(prog.model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return prog
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
    from executorch.runtime import Runtime, Verification

    ep = torch.export.export(model, (), tensors, dynamic_shapes=shapes)
    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()],
                                       compile_config=EdgeCompileConfig(_check_ir_validity=False))
    buf = edge.to_executorch().buffer
    Runtime.get().load_program(buf, verification=Verification.Minimal).load_method("forward")
    return buf


def ours_export(backend, model, inputs, dynamic):
    from exporters import get_exporter

    exporter = get_exporter(backend)
    return exporter.export(model, inputs, exporter.config_class(dynamic=dynamic))


def peer_export(backend, model, inputs, dynamic):  # pragma: no cover - optional comparison
    """The peer's public API, as benchmarks/peer_compare.py drives it; ``.to("cpu")`` creates the
    runtime session (ORT) or loads the program (ExecuTorch), which ours includes too."""
    from transformers import exporters as peer

    config = getattr(peer, {"dynamo": "DynamoConfig", "onnx": "OnnxConfig",
                            "executorch": "ExecutorchConfig"}[backend])(dynamic=dynamic)
    exported = peer.AutoHfExporter.from_config(config).export(model, dict(inputs), config)
    if backend == "onnx":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        exported.to("cpu", session_options=options)
    elif backend == "executorch":
        exported.to("cpu")
    return exported


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--backends", default="dynamo,onnx,executorch")
    parser.add_argument("--variants", default="static,dynamic")
    parser.add_argument("--peer", action="store_true", help="also time transformers.exporters")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    import torch

    from exporters import get_exporter
    from sweeps.runner import reference

    torch.set_num_threads(1)
    rows = []
    for key in args.models.split(","):
        tiny = reference(MODELS.get(key, key)).tiny
        for backend in args.backends.split(","):
            for variant in args.variants.split(","):
                dynamic = variant == "dynamic"
                max_dim = get_exporter(backend).config_class().max_dim
                runners = {
                    "ours": lambda: ours_export(backend, tiny.model, tiny.inputs, dynamic),
                    "bare": lambda: bare_export(backend, tiny.model, tiny.inputs, dynamic, max_dim),
                }
                if args.peer:
                    runners["peer"] = lambda: peer_export(backend, tiny.model, tiny.inputs, dynamic)
                times = {k: [] for k in runners}
                errors = {}
                for k, fn in runners.items():  # warm-up (imports, first-call caches)
                    try:
                        fn()
                    except Exception as exc:  # noqa: BLE001 - reported in the table
                        errors[k] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
                for _ in range(args.repeat):
                    for k, fn in runners.items():
                        if k in errors:
                            continue
                        t = time.perf_counter()
                        fn()
                        times[k].append(time.perf_counter() - t)
                row = {"model": key, "backend": backend, "variant": variant,
                       **{k: (statistics.median(v) if v else None) for k, v in times.items()}, "errors": errors}
                if row.get("ours") and row.get("bare"):
                    row["ours/bare"] = row["ours"] / row["bare"]
                if row.get("ours") and row.get("peer"):
                    row["ours/peer"] = row["ours"] / row["peer"]
                rows.append(row)
                print(_fmt(row), flush=True)
    for backend in args.backends.split(","):
        ratios = [r["ours/bare"] for r in rows if r["backend"] == backend and "ours/bare" in r]
        if ratios:
            print(f"{backend}: median ours/bare over models and variants = {statistics.median(ratios):.3f}")
        peer = [r["ours/peer"] for r in rows if r["backend"] == backend and "ours/peer" in r]
        if peer:
            print(f"{backend}: median ours/peer = {statistics.median(peer):.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


def _fmt(row):
    cols = [f"{row['model']:>8} {row['backend']:>10} {row['variant']:>7}"]
    for k in ("ours", "bare", "peer"):
        if row.get(k) is not None:
            cols.append(f"{k} {row[k]:6.2f}s")
    for k in ("ours/bare", "ours/peer"):
        if k in row:
            cols.append(f"{k} {row[k]:.2f}")
    if row["errors"]:
        cols.append(f"errors: {row['errors']}")
    return "  ".join(cols)


if __name__ == "__main__":
    main()
