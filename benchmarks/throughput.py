"""Sweep throughput and memory: items per minute with -n 0 and -n 2, and RSS growth per worker.

    python benchmarks/throughput.py --backend dynamo [--classes 100] [--workers 0,2]
    python benchmarks/throughput.py --memory results/dynamo-static.jsonl
    python benchmarks/throughput.py --memory-run 500 [--preload]

Throughput: a fixed sample of classes (every k-th class of the sorted catalog, so the sample is the
same on every machine) is swept with each worker count; the wall time gives items/min and the
speed-up of -n 2 over -n 0. Memory: every sweep item records ``rss_mb`` (the worker's resident
memory after the item); ``--memory LOG`` reads a report log and prints, per worker, the peak RSS
and the growth from its 50th to its 500th item (or its last, if it ran fewer). ``--memory-run N``
sweeps the first N classes (dynamo static, one process, ``-n 0``) and prints the same; with
``--preload`` the modeling modules of all N classes are imported before the first item
(``benchmarks/preload_modeling.py``), so the two runs separate import growth from per-item growth.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def sample(n: int) -> list[str]:
    from sweeps.zoo import catalog

    entries = [e for e in catalog() if not e.blocked_by]
    step = max(1, len(entries) // n)
    return [e.class_name for e in entries[::step][:n]]


def sweep(name: str, classes: list[str], *args: str) -> tuple[str, float]:
    """Run ``pytest sweeps`` over ``classes`` with ``args``, logging to results/tmp/NAME.jsonl;
    return the log path and the wall time."""
    os.makedirs(os.path.join(ROOT, "results", "tmp"), exist_ok=True)
    log = os.path.join(ROOT, "results", "tmp", f"{name}.jsonl")
    cmd = [sys.executable, "-m", "pytest", "sweeps", "-q", "-p", "no:cacheprovider", f"--report-log={log}", *args]
    start = time.perf_counter()
    subprocess.run(cmd + [f"--model={c}" for c in classes], cwd=ROOT, capture_output=True, text=True)
    return log, time.perf_counter() - start


def throughput(backend: str, classes: list[str], workers: list[int], variant: str | None) -> None:
    results = {}
    label = f"{backend} {variant}" if variant else backend
    for n in workers:
        args = [f"--backend={backend}", "-n", str(n)] + ([f"--variant={variant}"] if variant else [])
        log, wall = sweep(f"throughput-{label.replace(' ', '-')}-n{n}", classes, *args)
        outcomes = collections.Counter(_outcome(json.loads(line)) for line in open(log) if '"when": "call"' in line)
        items = sum(outcomes.values())
        results[n] = items / wall * 60
        counts = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
        print(f"{label} -n {n}: {items} items ({counts}) in {wall:.1f} s "
              f"= {results[n]:.1f} items/min", flush=True)
    if 0 in results and 2 in results:
        print(f"{backend}: -n 2 / -n 0 speed-up = {results[2] / results[0]:.2f}x")


def _outcome(report: dict) -> str:
    return "xfailed" if report.get("wasxfail") is not None else report.get("outcome", "?")


def memory(log: str) -> None:
    per_worker: dict[str, list[float]] = collections.defaultdict(list)
    for line in open(log):
        r = json.loads(line)
        if r.get("$report_type") != "TestReport" or r.get("when") != "call":
            continue
        props = dict(r.get("user_properties") or [])
        if "rss_mb" in props:
            per_worker[r.get("worker_id") or "main"].append(props["rss_mb"])
    for worker, rss in sorted(per_worker.items()):
        a = rss[min(49, len(rss) - 1)]
        b = rss[min(499, len(rss) - 1)]
        print(f"worker {worker}: {len(rss)} items, peak RSS {max(rss):.0f} MB, "
              f"growth item {min(50, len(rss))} -> {min(500, len(rss))}: {b - a:+.0f} MB")


def memory_run(n: int, preload: bool) -> None:
    from sweeps.zoo import catalog

    classes = [e.class_name for e in catalog() if not e.blocked_by][:n]
    args = ["--backend=dynamo", "--variant=static", "-n", "0", "--timeout=300"]
    args += ["-p", "benchmarks.preload_modeling"] if preload else []
    log, wall = sweep(f"memory-{n}{'-preload' if preload else ''}", classes, *args)
    print(f"{n} classes, dynamo static, -n 0{', modeling modules preloaded' if preload else ''}: "
          f"{wall:.0f} s wall, log {os.path.relpath(log, ROOT)}")
    memory(log)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="dynamo")
    parser.add_argument("--variant", default=None)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--workers", default="0,2")
    parser.add_argument("--memory", default=None, metavar="LOG")
    parser.add_argument("--memory-run", type=int, default=None, metavar="N")
    parser.add_argument("--preload", action="store_true", help="with --memory-run: import the modeling modules first")
    args = parser.parse_args(argv)
    if args.memory_run:
        memory_run(args.memory_run, args.preload)
        return
    if args.memory:
        memory(args.memory)
        return
    throughput(args.backend, sample(args.classes), [int(w) for w in args.workers.split(",")], args.variant)


if __name__ == "__main__":
    main()
