"""Where export memory goes: RSS over repeated exports, and the Python allocations that stay.

    python benchmarks/memory_probe.py [--rounds 13] [--models LlamaModel,BertModel,ViTModel,T5Model,WhisperModel]
    python benchmarks/memory_probe.py --tracemalloc BertModel [--exports 20]

The first form exports each model once per round (dynamo, through ``sweeps.runner.run_case``, as the
sweep does) and prints the RSS after each round and after ``malloc_trim(0)`` (what the allocator could
give back). The second prints the Python allocations still alive after N more exports of one model,
largest first, with their traceback.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")


def _case(name: str):
    from sweeps.repro import parse_item

    return parse_item(f"dynamo-static-{name}")


def rounds(models: list[str], n: int) -> None:
    from sweeps.runner import _rss_mb, run_case

    cases = [_case(m) for m in models]
    libc = ctypes.CDLL("libc.so.6")
    for r in range(n):
        for case in cases:
            run_case(case, lambda k, v: None)
        gc.collect()
        rss = _rss_mb()
        libc.malloc_trim(0)
        print(f"round {r}: {len(cases) * (r + 1)} exports, RSS {rss:.0f} MB, after malloc_trim {_rss_mb():.0f} MB",
              flush=True)


def traced(model: str, exports: int) -> None:
    import tracemalloc

    from sweeps.runner import run_case

    case = _case(model)
    for _ in range(3):  # warm: imports, the reference, first-call caches
        run_case(case, lambda k, v: None)
    gc.collect()
    tracemalloc.start(25)
    before = tracemalloc.take_snapshot()
    for _ in range(exports):
        run_case(case, lambda k, v: None)
    gc.collect()
    stats = tracemalloc.take_snapshot().compare_to(before, "traceback")
    print(f"net Python allocations after {exports} more exports of {model}: "
          f"{sum(s.size_diff for s in stats) / 1e6:+.2f} MB")
    for stat in stats[:5]:
        print(f"{stat.size_diff / 1e3:+.0f} kB in {stat.count_diff:+d} blocks")
        for line in stat.traceback.format()[-6:]:
            print("   ", line)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=13)
    parser.add_argument("--models", default="LlamaModel,BertModel,ViTModel,T5Model,WhisperModel")
    parser.add_argument("--tracemalloc", metavar="MODEL", default=None)
    parser.add_argument("--exports", type=int, default=20)
    args = parser.parse_args(argv)
    if args.tracemalloc:
        traced(args.tracemalloc, args.exports)
    else:
        rounds(args.models.split(","), args.rounds)


if __name__ == "__main__":
    main()
