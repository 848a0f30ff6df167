"""Two runs of the same sweep items compared item by item: outcome and the set of workarounds that fired.

    python benchmarks/fired_ab.py BEFORE AFTER      # report logs or results.json files

``python -m sweeps.report diff`` compares outcomes and failure signatures; this also says whether the
same workarounds fired, which is what an exact before/after of a behaviour-preserving change must show.
Items present in only one run are ignored.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sweeps.report.load import load_any  # noqa: E402 - after the path set-up above, as a script


def main(before_path: str, after_path: str) -> int:
    before = {r.nodeid: r for r in load_any(before_path)}
    shared = [(before[r.nodeid], r) for r in load_any(after_path) if r.nodeid in before]
    outcome = [(b, a) for b, a in shared if b.outcome != a.outcome]
    fired = [(b, a) for b, a in shared if set(b.workarounds_fired or []) != set(a.workarounds_fired or [])]
    print(f"{len(shared)} items: {len(outcome)} with another outcome, {len(fired)} with another set of fired workarounds")
    for b, a in outcome:
        print(f"  outcome {a.nodeid}: {b.outcome} -> {a.outcome}")
    for b, a in fired:
        was, now = set(b.workarounds_fired or []), set(a.workarounds_fired or [])
        print(f"  fired {a.nodeid}: only before {sorted(was - now)}, only after {sorted(now - was)}")
    return 1 if outcome or fired else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
