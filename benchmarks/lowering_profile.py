"""Where an ExecuTorch export's seconds go, by upstream function (cProfile), with the speed-ups on or off.

    python benchmarks/lowering_profile.py [--models LlamaForCausalLM,BertModel] [--variants static,dynamic] [--off]

Each model is exported once to warm up (imports, XNNPACK's pattern graphs), then once under cProfile;
the table gives the cumulative seconds of the upstream functions that make up the lowering. ``--off``
switches every patch of benchmarks/lowering_speed.py's SPEED_UPS off. cProfile inflates many-small-call
code (deepcopy), so read the shares, and compare on and off from the same machine state.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

from benchmarks.lowering_speed import SPEED_UPS  # noqa: E402

# (file suffix, function name, label): the parts of ExecutorchExporter.export, outermost first
PARTS = (
    ("exporters/tracing.py", "trace", "torch.export (our trace)"),
    ("exir/program/_program.py", "to_edge_transform_and_lower", "to_edge_transform_and_lower"),
    ("torch/export/exported_program.py", "run_decompositions", "  run_decompositions"),
    ("exir/program/_program.py", "_generate_edge_program", "  _generate_edge_program (edge passes)"),
    ("exir/program/_program.py", "to_backend", "  to_backend"),
    ("xnnpack/xnnpack_preprocess.py", "preprocess", "    XNNPACK preprocess (per partition)"),
    ("exir/pass_manager.py", "check", "    ExportedProgramPassManager.check"),
    ("exir/program/_program.py", "to_executorch", "to_executorch"),
    ("copy.py", "deepcopy", "copy.deepcopy (anywhere)"),
    ("torch/fx/traceback.py", "__init__", "NodeSource.__init__ (anywhere)"),
    ("torch/fx/graph_module.py", "recompile", "GraphModule.recompile (anywhere)"),
)


def summary(stats: pstats.Stats) -> list[tuple[str, float, int]]:
    rows = []
    for suffix, name, label in PARTS:
        found = [(v[3], v[1]) for (f, _, n), v in stats.stats.items() if n == name and f.endswith(suffix)]
        if found:
            seconds, calls = max(found)
            rows.append((label, seconds, calls))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="LlamaForCausalLM")
    parser.add_argument("--variants", default="static,dynamic")
    parser.add_argument("--off", action="store_true", help="switch SPEED_UPS off")
    args = parser.parse_args(argv)

    import torch

    from exporters import get_exporter
    from exporters.utils import DEFAULT_REGISTRY
    from sweeps.runner import reference

    torch.set_num_threads(1)
    exporter = get_exporter("executorch", registry=DEFAULT_REGISTRY.without(*SPEED_UPS) if args.off else None)
    for cls in args.models.split(","):
        tiny = reference(cls).tiny
        for variant in args.variants.split(","):
            config = exporter.config_class(dynamic=variant == "dynamic")
            exporter.export(tiny.model, tiny.inputs, config)
            profile = cProfile.Profile()
            start = time.perf_counter()
            profile.enable()
            exporter.export(tiny.model, tiny.inputs, config)
            profile.disable()
            total = time.perf_counter() - start
            print(f"{cls} {variant} speed-ups {'off' if args.off else 'on'}: {total:.2f} s under cProfile")
            for label, seconds, calls in summary(pstats.Stats(profile)):
                print(f"  {label:42s} {seconds:7.2f} s {100 * seconds / total:5.1f}%  calls {calls}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
