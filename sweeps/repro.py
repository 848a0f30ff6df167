"""Re-run one sweep item outside pytest, keep its artifacts, print the one-line repro.

    python -m sweeps.repro onnx-dynamic-LlamaForCausalLM [--sizes 2=3,7=11] [--keep out/triage]
    python -m sweeps.repro generate:onnx-static-LlamaForCausalLM     (a test_generate item)
    python -m sweeps.repro runner:ort-genai-LlamaForCausalLM          (a test_runner item)
    python -m sweeps.repro quantized:onnx-int8-LlamaForCausalLM       (a test_quantized item)

Keeps, under ``--keep/<item id>/``: the exported artifact (model.pt2 / model.onnx / model.pte) with
metadata.json, the ExportedProgram's graph before and after the FX fixes (graph_before.txt,
graph_after.txt) and the error, if any (error.txt).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import traceback

from sweeps.runner import BACKENDS, RECIPES, RUNTIMES, VARIANTS, Case, StageFailure, run_case


def parse_item(text: str) -> Case:
    from sweeps.zoo import resolve_models

    test = "export"
    for name in ("generate", "runner", "quantized"):
        if text.startswith(f"{name}:") or f"::test_{name}[" in text:
            test, text = name, text.removeprefix(f"{name}:")
    match = re.search(r"\[([^\[\]]+)\]", text)  # a node id, possibly with an xdist "@group" suffix
    item = match.group(1) if match else text
    if test == "runner":
        runtime = next((r for r in RUNTIMES if item.startswith(f"{r}-")), None)
        if runtime is None:
            raise SystemExit(f"runner item id must look like 'runner:ort-genai-LlamaForCausalLM' (runtime: "
                             f"{', '.join(RUNTIMES)}), got {text!r}")
        item = "-".join(RUNTIMES[runtime]) + item[len(runtime):]
    parts = item.split("-", 2)
    variants = {"runner": [v for _, v in RUNTIMES.values()], "quantized": RECIPES}.get(test, VARIANTS)
    if len(parts) != 3 or parts[0] not in BACKENDS or parts[1] not in variants:
        example = "quantized:onnx-int8-LlamaForCausalLM" if test == "quantized" else "onnx-dynamic-LlamaForCausalLM"
        raise SystemExit(
            f"item id must look like {example!r} (backend: {', '.join(BACKENDS)}; "
            f"{'recipe' if test == 'quantized' else 'variant'}: {', '.join(variants)}), got {text!r}"
        )
    backend, variant, name = parts
    matches = [e for e in resolve_models([name]) if e.class_name == name]
    if not matches:
        raise SystemExit(f"{name!r} is a model type or pattern, not a class; classes: "
                         + ", ".join(e.class_name for e in resolve_models([name])))
    return Case(backend, variant, matches[0], test)


def _save_graphs(keep: str) -> None:
    """Write the traced graph before and after fixes, by wrapping the fix application once."""
    from exporters import utils

    original = utils.apply_fx_node_fixes

    def recording(entries, gm, fired):
        with open(os.path.join(keep, "graph_before.txt"), "a") as f:
            f.write(gm.print_readable(print_output=False) + "\n")
        modified = original(entries, gm, fired)
        with open(os.path.join(keep, "graph_after.txt"), "a") as f:
            f.write(gm.print_readable(print_output=False) + "\n")
        return modified

    for module_name in ("exporters.exporter_onnx", "exporters.exporter_executorch"):
        module = sys.modules.get(module_name) or __import__(module_name, fromlist=["_"])
        module.apply_fx_node_fixes = recording


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweeps.repro", description=__doc__.splitlines()[0])
    parser.add_argument("item", help="sweep item id, e.g. onnx-dynamic-LlamaForCausalLM (or a full pytest node id)")
    parser.add_argument("--sizes", default=None, help="check one dynamic shape, TRACED=NEW pairs: 2=3,7=11")
    parser.add_argument("--keep", default="out/triage", help="folder for artifacts (default: out/triage)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from sweeps.shapes import parse_sizes
    from sweeps.signature import error_signature, root_cause

    case = parse_item(args.item)
    keep = os.path.join(args.keep, case.id)
    os.makedirs(keep, exist_ok=True)
    for name in ("graph_before.txt", "graph_after.txt", "error.txt"):
        if os.path.exists(os.path.join(keep, name)):
            os.remove(os.path.join(keep, name))
    _save_graphs(keep)
    props: dict = {}
    line = case.repro + (f" --sizes {args.sizes}" if args.sizes else "")
    try:
        if case.test == "generate":
            from sweeps.generate import run_generate_case

            run_generate_case(case, props.__setitem__)
        elif case.test == "quantized":
            from sweeps.quantized import run_quantized_case

            run_quantized_case(case, props.__setitem__).save(keep)  # the quantized artifact, as export items keep theirs
        elif case.test == "runner":
            from sweeps.llm_runners import run_runner_case

            run_runner_case(case, props.__setitem__)
        else:
            run_case(case, props.__setitem__, keep_dir=keep, sizes=parse_sizes(args.sizes) if args.sizes else None)
    except StageFailure as failure:
        cause = root_cause(failure.__cause__)
        with open(os.path.join(keep, "error.txt"), "w") as f:
            f.write("".join(traceback.format_exception(cause)))
        lines = str(cause).splitlines() or [""]
        print(f"FAIL at {failure.stage}: {type(cause).__name__}: {lines[0][:1000]}")  # the real numbers
        print(f"  signature (the report groups by it): {error_signature(cause)}")
        detail = [ln.strip() for ln in lines[1:4] if ln.strip()]
        for line_ in detail:  # e.g. which output differs and by how much
            print(f"  {line_}")
        print(f"artifacts: {keep}")
        print(f"repro: {line}")
        return 1
    shapes = f"; dynamic shapes compared: {props['shapes_checked']}" if "shapes_checked" in props else ""
    print(f"PASS ({props.get('duration_s')} s; workarounds fired: {props.get('workarounds_fired') or 'none'}{shapes})")
    print(f"artifacts: {keep}")
    print(f"repro: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
