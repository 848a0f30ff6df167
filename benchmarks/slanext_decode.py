"""SLANeXt's table-structure decode at its default length: ONNX export time, scanned vs unrolled.

    python benchmarks/slanext_decode.py [--max-text-length 500] [--variant static] [--unrolled] [--class SLANeXtForTableRecognition]

Builds the sweep's tiny model, sets ``config.max_text_length`` (the zoo shrinks it to 16; the class
default is 500), exports it with OnnxExporter and prints the export time and the largest difference
from eager. ``--unrolled`` switches the ONNX scan patch off (exporters/workarounds/models/slanet.py),
leaving the dynamo patch's ``max_text_length + 1`` unrolled steps (555 s at 500 on the issue's machine).
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-text-length", type=int, default=500)
    parser.add_argument("--variant", default="static", choices=("static", "dynamic"))
    parser.add_argument("--unrolled", action="store_true", help="switch the ONNX scan patch off")
    parser.add_argument("--class", dest="cls", default="SLANeXtForTableRecognition")
    args = parser.parse_args(argv)

    import torch

    from exporters import get_exporter
    from exporters.utils import DEFAULT_REGISTRY
    from sweeps.runner import reference

    torch.set_num_threads(1)
    tiny = reference(args.cls).tiny
    tiny.model.config.max_text_length = args.max_text_length
    module = "slanet.modeling_slanet.SLANetSLAHead" if args.cls.startswith("SLANet") else "slanext.modeling_slanext.SLANeXtSLAHead"
    scan_patch = f"patch:onnx:transformers.models.{module}.forward"
    exporter = get_exporter("onnx", registry=DEFAULT_REGISTRY.without(scan_patch) if args.unrolled else None)
    with torch.no_grad():
        expected = tiny.model(**tiny.inputs).last_hidden_state
    start = time.perf_counter()
    artifact = exporter.export(tiny.model, tiny.inputs, exporter.config_class(dynamic=args.variant == "dynamic"))
    seconds = time.perf_counter() - start
    got = artifact(**tiny.inputs)["last_hidden_state"]
    diff = (got - expected).abs().max().item() if got.shape == expected.shape else f"shape {tuple(got.shape)} vs {tuple(expected.shape)}"
    nodes = len(artifact.model_proto.graph.node)
    print(f"{args.cls} onnx {args.variant} max_text_length={args.max_text_length} "
          f"{'unrolled' if args.unrolled else 'scan'}: export {seconds:.1f} s, {nodes} top-level ONNX nodes, "
          f"max abs diff vs eager {diff}", flush=True)


if __name__ == "__main__":
    main()
