"""Does an item's outcome depend on the ExecuTorch speed patches? Run sweep items with them on and off.

    python benchmarks/speedups_outcome.py executorch-dynamic-HGNetV2Backbone [...] [--json out.json]

Each item runs as the sweep runs it (``sweeps.runner.run_case``: export, run, compare, the dynamic-shape
draws), once with the default registry and once with every patch of ``benchmarks.lowering_speed.SPEED_UPS``
switched off. It prints both outcomes (the stage and the error's first line) and whether they are the same.
For items whose outcome differs between two merged reports: the same outcome both ways says the speed
patches are not the cause.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")


def outcome(case, registry) -> tuple[str, list[str]]:
    from sweeps.runner import StageFailure, run_case

    props: dict = {}
    try:
        run_case(case, props.__setitem__, registry=registry)
        verdict = "passed"
    except StageFailure as failure:
        verdict = f"failed: {str(failure).splitlines()[0][:240]}"
    return verdict, sorted(props.get("workarounds_fired") or [])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("items", nargs="+", help="sweep item ids: <backend>-<variant>-<ModelClass>")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from benchmarks.lowering_speed import SPEED_UPS
    from exporters.utils import DEFAULT_REGISTRY
    from sweeps.runner import Case
    from sweeps.zoo import resolve_models

    off = DEFAULT_REGISTRY.without(*SPEED_UPS)
    rows, same = [], True
    for item in args.items:
        backend, variant, name = item.split("-", 2)
        (entry,) = [e for e in resolve_models([name]) if e.class_name == name]
        case = Case(backend, variant, entry)
        on_verdict, fired = outcome(case, None)
        off_verdict, _ = outcome(case, off)
        row = {"item": item, "on": on_verdict, "off": off_verdict, "same": on_verdict == off_verdict,
               "speed_ups_fired": [n for n in fired if n in SPEED_UPS]}
        same &= row["same"]
        print(f"{item}: {'same' if row['same'] else 'DIFFERENT'} ({len(row['speed_ups_fired'])} speed patches fired)\n"
              f"  on : {on_verdict}\n  off: {off_verdict}", flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
