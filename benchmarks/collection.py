"""Collection time of the full sweep (every class x 3 backends x 2 variants).

    python benchmarks/collection.py [--repeat 5]

Runs `pytest sweeps --collect-only -q` in a fresh interpreter each time (what a user waits for)
and prints the item count, the median wall time, and whether collection imported a backend
runtime (it must not: onnxruntime and executorch are imported by the items that need them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = """
import sys
def pytest_collection_finish(session):
    heavy = [m for m in ("onnxruntime", "executorch", "onnxscript") if m in sys.modules]
    print(f"RUNTIMES_IMPORTED={heavy}")
"""


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    probe_dir = os.path.join(ROOT, "results", "tmp")
    os.makedirs(probe_dir, exist_ok=True)
    with open(os.path.join(probe_dir, "collect_probe.py"), "w") as f:
        f.write(PROBE)
    env = dict(os.environ, PYTHONPATH=probe_dir + os.pathsep + os.environ.get("PYTHONPATH", ""), HF_HUB_OFFLINE="1")
    times, count, runtimes = [], None, None
    for _ in range(args.repeat):
        start = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "sweeps", "--collect-only", "-q", "-p", "collect_probe"],
            cwd=ROOT, env=env, capture_output=True, text=True,
        )
        times.append(time.perf_counter() - start)
        for line in out.stdout.splitlines():
            if line.startswith("RUNTIMES_IMPORTED="):
                runtimes = line.split("=", 1)[1]
            if "tests collected" in line or "collected" in line and " in " in line:
                count = line.strip()
    print(f"{count}")
    print(f"collection wall time: median {statistics.median(times):.2f} s over {args.repeat} runs "
          f"(min {min(times):.2f}, max {max(times):.2f}); backend runtimes imported: {runtimes}")


if __name__ == "__main__":
    main()
