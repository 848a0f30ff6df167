"""Where an int8 ONNX artifact leaves its quantized reference: every QuantizeLinear output after a Conv,
ConvTranspose, Gemm or MatMul, run by ONNX Runtime with its graph optimizations (which fuse node units
into integer kernels: QLinearConv, QGemm...) and without them (DequantizeLinear -> float op ->
QuantizeLinear, the reference's own arithmetic), compared as integers.

    python benchmarks/ort_int8_divergence.py PocketTTSAudioTokenizerDecoderModel [--level basic]

A first divergence of one step on a few elements, growing layer by layer, is the integer kernels'
rounding carried forward with the model's gain; a first divergence of many steps is a kernel defect.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

LEVELS = {"basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}
PRODUCERS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_class")
    parser.add_argument("--level", default="basic", choices=sorted(LEVELS))
    args = parser.parse_args(argv)

    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch

    from exporters import get_exporter
    from exporters.quantization import int8
    from sweeps.runner import reference

    torch.set_num_threads(1)
    tiny = reference(args.model_class).tiny
    exporter = get_exporter("onnx")
    artifact = exporter.export(tiny.model, tiny.inputs, exporter.config_class(quantization=int8(calibration=[tiny.inputs])))
    model = onnx.ModelProto()
    model.CopyFrom(artifact.model_proto)
    producer = {out: node for node in model.graph.node for out in node.output}
    watched = [(node.output[0], producer[node.input[0]].op_type) for node in model.graph.node
               if node.op_type == "QuantizeLinear" and node.input[0] in producer
               and producer[node.input[0]].op_type in PRODUCERS]
    for name, _ in watched:
        model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    data = model.SerializeToString()

    def run(level):
        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        feeds = {i.name: tiny.inputs[i.name].numpy() for i in session.get_inputs()}
        return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))

    plain, fused = run("ORT_DISABLE_ALL"), run(LEVELS[args.level])
    print(f"{args.model_class}: QuantizeLinear outputs, ORT {args.level} vs no optimization (integer steps)")
    for name, op in watched:
        diff = np.abs(plain[name].astype(np.int64) - fused[name].astype(np.int64))
        print(f"  {name:32s} after {op:13s} max {int(diff.max()):3d}  differing {int((diff > 0).sum())}/{diff.size}")


if __name__ == "__main__":
    main()
