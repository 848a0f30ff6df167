"""Item-hours per row, before and after: what a change saved over the same sweep items.

    python benchmarks/item_hours.py BEFORE AFTER [--backend executorch] [--models FILE]

BEFORE and AFTER are anything ``python -m sweeps.report merge`` reads (results.json, --report-log JSONL).
Only items present in both with a recorded duration count, so the rows compare the same items. Prints,
per backend/variant: items, item-hours before and after, after/before, and the items whose outcome
differs (``python -m sweeps.report diff BEFORE AFTER`` says how).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv: list[str] | None = None) -> None:
    from sweeps.report.load import load_any

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--backend", help="only this backend's rows")
    parser.add_argument("--models", help="a file with one class name per line: only these classes")
    args = parser.parse_args(argv)
    keep = set(open(args.models).read().split()) if args.models else None
    before = {r.nodeid.split("::")[-1]: r for r in load_any(args.before)}
    after = {r.nodeid.split("::")[-1]: r for r in load_any(args.after)}
    rows: dict[str, list] = defaultdict(list)
    for key, new in after.items():
        old = before.get(key)
        if old is None or old.duration_s is None or new.duration_s is None:
            continue
        if (args.backend and new.backend != args.backend) or (keep is not None and new.model_class not in keep):
            continue
        rows[new.column].append((old, new))
    print(f"{'row':24s} {'items':>5s} {'before h':>9s} {'after h':>8s} {'after/before':>12s} {'outcome changed':>15s}")
    total_old = total_new = 0.0
    for column in sorted(rows):
        pairs = rows[column]
        old_h = sum(o.duration_s for o, _ in pairs) / 3600
        new_h = sum(n.duration_s for _, n in pairs) / 3600
        total_old, total_new = total_old + old_h, total_new + new_h
        changed = [n.model_class for o, n in pairs if o.outcome != n.outcome]
        print(f"{column:24s} {len(pairs):5d} {old_h:9.2f} {new_h:8.2f} {new_h / old_h:12.3f} {len(changed):15d}"
              + (f"  ({', '.join(changed)})" if changed else ""))
    if total_old:
        print(f"{'all':24s} {sum(map(len, rows.values())):5d} {total_old:9.2f} {total_new:8.2f} {total_new / total_old:12.3f}")


if __name__ == "__main__":
    main()
