"""Quantized artifacts against PyTorch's quantized reference: how far apart, in quantization steps.

    python benchmarks/quantized_parity.py [--backends onnx,executorch] [--weights default|8bit]
        [--json out.jsonl] [CLASS ...]            (default: the sweep's 19 smoke classes)

For each class: the zoo's tiny model, int8 (static, calibrated on its traced inputs), exported statically.
Prints, per output, the artifact's largest distance from ``artifact.reference`` in quantization steps
(``exporters.parity.steps_off``) and the reference's SQNR against fp32 eager. ``--weights 8bit`` gives
ONNX full 8-bit weights instead of the recipe's 7-bit ones (``int8(reduce_range=False)``): on an x86 CPU
without VNNI, ONNX Runtime's saturating u8 x s8 kernel then shows (exporters/quantization/__init__.py).
The numbers behind ``exporters.parity.QUANT_STEPS`` came from this script.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")


def measure(class_name: str, backend: str, reduce_range: bool | None) -> dict:
    import torch

    from exporters import get_exporter
    from exporters.parity import sqnr_db, steps_off
    from exporters.quantization import int8
    from sweeps.runner import reference

    ref = reference(class_name)
    model, inputs = ref.tiny.model, ref.tiny.inputs
    exporter = get_exporter(backend)
    start = time.perf_counter()
    artifact = exporter.export(model, inputs, exporter.config_class(
        dynamic=False, quantization=int8(calibration=[inputs], reduce_range=reduce_range)))
    seconds = time.perf_counter() - start
    expected, actual = artifact.reference(**inputs), artifact(**inputs)
    outputs = {}
    for name, value in expected.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            fp32 = ref.expected.get(name)
            outputs[name] = {"steps": steps_off(value, actual[name]),
                             "sqnr_db": sqnr_db(fp32, value) if fp32 is not None and fp32.shape == value.shape else None}
    return {"class": class_name, "backend": backend, "export_s": round(seconds, 1),
            "quantize_ops": artifact.extra_metadata["quantization"]["quantize_ops"],
            "weight_range": artifact.extra_metadata["quantization"]["weight_range"], "outputs": outputs}


def main(argv: list[str] | None = None) -> None:
    from sweeps.plugin import SMOKE_CLASSES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("classes", nargs="*", default=list(SMOKE_CLASSES))
    parser.add_argument("--backends", default="onnx,executorch")
    parser.add_argument("--weights", choices=("default", "8bit"), default="default")
    parser.add_argument("--json", help="append one JSON line per class and backend")
    args = parser.parse_args(argv)
    reduce_range = False if args.weights == "8bit" else None
    print(f"{'class':36s} {'backend':10s} {'worst steps':>11s} {'sqnr dB':>8s} {'export s':>8s}")
    for class_name in args.classes:
        for backend in args.backends.split(","):
            try:
                row = measure(class_name, backend, reduce_range)
            except Exception as exc:  # noqa: BLE001 - a row saying why, the rest still measured
                print(f"{class_name:36s} {backend:10s} error: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
                continue
            worst = max((o["steps"] for o in row["outputs"].values()), default=0.0)
            first = next((o["sqnr_db"] for o in row["outputs"].values() if o["sqnr_db"] is not None), None)
            print(f"{class_name:36s} {backend:10s} {worst:11.3g} {first if first is None else round(first, 1)!s:>8s} "
                  f"{row['export_s']:8.1f}", flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
