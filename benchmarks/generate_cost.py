"""The cost of a generate item against the forward item of the same class, backend and variant, in one run.

    python benchmarks/generate_cost.py results/ci/smoke.jsonl

Issue 31's measure: each ``test_generate[<backend>-<variant>-C]`` call time over ``test_export[<backend>-<variant>-C]``
in the same report log (the default ``pytest`` runs both for the generate smoke set), and the median per backend
and variant (target: 2x). Items without their forward counterpart in the log are listed, not counted.
"""

from __future__ import annotations

import argparse
import json
import statistics


def durations(path: str) -> dict[tuple[str, str], float]:
    calls = {}
    for line in open(path, encoding="utf-8"):
        report = json.loads(line)
        nodeid = report.get("nodeid", "")
        name = nodeid.split("::")[-1]
        if report.get("$report_type") == "TestReport" and report.get("when") == "call" and "[" in name \
                and report.get("outcome") == "passed" and nodeid.startswith("sweeps/"):  # sweep items, not unit tests
            test, item = name.split("[", 1)
            calls[(test, item.rstrip("]"))] = report["duration"]
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", help="a pytest --report-log JSONL holding test_generate and test_export items")
    args = parser.parse_args()
    calls = durations(args.log)
    rows: dict[str, list[float]] = {}
    for (test, item), seconds in sorted(calls.items()):
        if test != "test_generate":
            continue
        backend, variant, cls = item.split("-", 2)
        forward = calls.get(("test_export", item))
        if not forward:
            print(f"{item}: generate {seconds:.2f} s, no passing test_export[{item}] in the log")
            continue
        rows.setdefault(f"{backend}/{variant}", []).append(seconds / forward)
        print(f"{item}: generate {seconds:.2f} s, forward {forward:.2f} s, {seconds / forward:.2f}x")
    for row, ratios in sorted(rows.items()):
        print(f"{row}: median {statistics.median(ratios):.2f}x over {len(ratios)} classes (target 2x)")


if __name__ == "__main__":
    main()
