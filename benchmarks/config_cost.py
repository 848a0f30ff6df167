"""Export time of a zoo tiny model with config values raised to the class's defaults (issue 35: costs the
zoo's small configs hide, e.g. a workaround that unrolls a loop over a config value).

    python benchmarks/config_cost.py --class LongcatFlashModel [--set n_routed_experts=512]
        [--attr max_text_length=500] [--backend dynamo] [--variant static]

Builds the sweep's tiny model (``sweeps.runner.reference``), then, with ``--set``, rebuilds the same
class from a copy of its tiny config with the dotted key(s) changed (same seed, same attention
implementation, the zoo's own ``_instantiate``; layers and widths stay tiny), reusing the zoo's
inputs. Exports once with the sweep's exporter and default registry, single thread, and prints the
export time, the number of call_function nodes in the exported program (dynamo) or top-level ONNX
nodes, the workarounds that fired, and the largest difference from eager.
Modelled on benchmarks/slanext_decode.py.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")


def _set(config, path: str, value):
    *parents, last = path.split(".")
    for p in parents:
        config = getattr(config, p)
    setattr(config, last, value)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--class", dest="cls", required=True)
    parser.add_argument("--set", action="append", default=[], help="dotted.key=int (rebuilds the model)")
    parser.add_argument("--attr", action="append", default=[], help="dotted.key=int set on the built model's config "
                        "(for values read at forward time, e.g. max_text_length)")
    parser.add_argument("--backend", default="dynamo", choices=("dynamo", "onnx", "executorch"))
    parser.add_argument("--variant", default="static", choices=("static", "dynamic"))
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    import transformers

    from exporters import get_exporter
    from exporters.utils import flatten_outputs
    from sweeps.runner import reference
    from sweeps.zoo.build import _instantiate

    t0 = time.perf_counter()
    tiny = reference(args.cls).tiny
    model, inputs = tiny.model, tiny.inputs
    if args.set:
        config = copy.deepcopy(model.config)
        for item in args.set:
            key, value = item.split("=", 1)
            _set(config, key, int(value))
        torch.manual_seed(0)
        model = _instantiate(getattr(transformers, args.cls), config, tiny.attn_implementation).float().eval()
    for item in args.attr:
        key, value = item.split("=", 1)
        _set(model.config, key, int(value))
    build_s = time.perf_counter() - t0
    with torch.no_grad():
        expected = flatten_outputs(model(**inputs))
    exporter = get_exporter(args.backend)
    start = time.perf_counter()
    artifact = exporter.export(model, inputs, exporter.config_class(dynamic=args.variant == "dynamic"))
    seconds = time.perf_counter() - start
    if args.backend == "dynamo":
        nodes = sum(1 for n in artifact.program.graph.nodes if n.op == "call_function")
        what = "call_function nodes"
    elif args.backend == "onnx":
        nodes, what = len(artifact.model_proto.graph.node), "top-level ONNX nodes"
    else:
        nodes, what = "?", "nodes"
    try:
        got = artifact(**inputs)
        got = got if isinstance(got, dict) else flatten_outputs(got)
        diffs = [(got[k] - v).abs().max().item() for k, v in expected.items()
                 if k in got and v.is_floating_point() and got[k].shape == v.shape]
        diff = max(diffs) if diffs else "n/a"
    except Exception as exc:  # noqa: BLE001 - report only
        diff = f"run failed: {type(exc).__name__}: {str(exc)[:120]}"
    fired = [f for f in artifact.workarounds_fired if ":transformers.models." in f]  # the model patches
    print(f"{args.cls} {args.backend} {args.variant} set={args.set + args.attr}: export {seconds:.1f} s "
          f"(build {build_s:.1f} s), {nodes} {what}, max abs diff vs eager {diff}; fired: {fired}", flush=True)


if __name__ == "__main__":
    main()
